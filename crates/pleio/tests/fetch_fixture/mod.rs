//! Shared fixtures for the fetch tests: a synthetic qwen4exp file, readers
//! over it, and a reference decode that reads the file with plain `read`
//! (no mapping, scalar decoder), so every strategy is checked against an
//! independent path.
#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

use pleio::fetch::Table;
use pleio::layout::Layout;
use pleio::model::Model;
use pleio::quant::encoding::EncodingDecoder;
use pleio::quant::{GgmlType, RowDecoder};
use pleio_lab::synth::SynthSpec;
use pleio_lab::synth_ckpt::{fill_part, part_rng, write_checkpoint, CkptEncoding, CkptSpec};

/// A synthetic model on disk, opened.
pub struct Fixture {
    pub file: tempfile::NamedTempFile,
    pub model: Arc<Model>,
    pub table: Layout,
    /// Row cache budget of the readers made by [`Fixture::reader`] (the
    /// library default when `None`).
    pub cache_budget: Option<u64>,
}

impl Fixture {
    /// A qwen4exp IQ4_NL table of `rows` rows (the table ends the file).
    pub fn qwen(rows: u64, seed: u64) -> Fixture {
        Fixture::qwen_with(tempfile::NamedTempFile::new().unwrap(), rows, seed)
    }

    /// Like [`Fixture::qwen`], in the cargo target's scratch directory (a
    /// real disk file system, so eviction from the page cache works, which
    /// it does not on a tmpfs `/tmp`; see `pleio_testkit::disk_dir!`).
    pub fn qwen_on_disk(rows: u64, seed: u64) -> Fixture {
        let dir = pleio_testkit::disk_dir!();
        Fixture::qwen_with(tempfile::NamedTempFile::new_in(dir).unwrap(), rows, seed)
    }

    fn qwen_with(file: tempfile::NamedTempFile, rows: u64, seed: u64) -> Fixture {
        Fixture::of_spec_in(file, &SynthSpec::qwen(GgmlType::IQ4_NL, rows, seed))
    }

    /// The synthetic file `spec` describes, in a temporary file.
    pub fn of_spec(spec: &SynthSpec) -> Fixture {
        Fixture::of_spec_in(tempfile::NamedTempFile::new().unwrap(), spec)
    }

    fn of_spec_in(file: tempfile::NamedTempFile, spec: &SynthSpec) -> Fixture {
        let f = file.reopen().unwrap();
        spec.write(f, &mut |_| {}).unwrap();
        let model = Arc::new(Model::open(file.path()).unwrap());
        let table = Layout::of_ple(&model).unwrap();
        Fixture {
            file,
            model,
            table,
            cache_budget: None,
        }
    }

    /// Readers made from this fixture get a row cache of `bytes`.
    pub fn with_cache_budget(mut self, bytes: u64) -> Fixture {
        self.cache_budget = Some(bytes);
        self
    }

    /// A reader over the model (default OS advisor).
    pub fn reader(&self) -> Table {
        let t = Table::from_model(self.model.clone()).unwrap();
        match self.cache_budget {
            Some(b) => t.with_budget(b).unwrap(),
            None => t,
        }
    }

    /// File length.
    pub fn file_len(&self) -> u64 {
        std::fs::metadata(self.file.path()).unwrap().len()
    }

    /// Reference rows: `pread`-style reads and the scalar decoder.
    pub fn reference(&self, rows: &[u64]) -> Vec<f32> {
        let t = &self.table;
        let dec = RowDecoder::scalar(t.ty().ggml().unwrap()).unwrap();
        let mut f = File::open(self.file.path()).unwrap();
        let mut buf = vec![0u8; t.row_bytes() as usize];
        let mut out = vec![0f32; rows.len() * t.row_elems() as usize];
        for (&r, dst) in rows
            .iter()
            .zip(out.chunks_exact_mut(t.row_elems() as usize))
        {
            f.seek(SeekFrom::Start(t.offset() + r * t.row_bytes()))
                .unwrap();
            f.read_exact(&mut buf).unwrap();
            dec.decode(&buf, dst).unwrap();
        }
        out
    }

    /// The stored bytes of `rows`, by plain reads.
    pub fn reference_raw(&self, rows: &[u64]) -> Vec<u8> {
        let t = &self.table;
        let rb = t.row_bytes() as usize;
        let mut f = File::open(self.file.path()).unwrap();
        let mut out = vec![0u8; rows.len() * rb];
        for (&r, dst) in rows.iter().zip(out.chunks_exact_mut(rb)) {
            f.seek(SeekFrom::Start(t.offset() + r * t.row_bytes()))
                .unwrap();
            f.read_exact(dst).unwrap();
        }
        out
    }

    /// Rows whose bytes straddle a page boundary (at most `n`).
    pub fn straddlers(&self, page: u64, n: usize) -> Vec<u64> {
        let t = &self.table;
        (0..t.rows())
            .filter(|r| {
                let s = t.offset() + r * t.row_bytes();
                s / page != (s + t.row_bytes() - 1) / page
            })
            .take(n)
            .collect()
    }
}

/// A synthetic safetensors checkpoint on disk (`pleio_lab::synth_ckpt`:
/// the shards interleaved with unrelated tensors over several files, at
/// whatever unaligned offsets the headers give), with an independent
/// reference: the bytes the writer generated for each row's parts, decoded
/// by the encoding's scalar reference decoder. No pleio reader is involved
/// in the reference.
pub struct CkptFixture {
    pub dir: tempfile::TempDir,
    /// The checkpoint directory.
    pub path: std::path::PathBuf,
    pub spec: CkptSpec,
    /// Rows of the table.
    pub rows: u64,
    rows_per_shard: u64,
    /// Bytes of each part of a row.
    part_len: Vec<usize>,
    /// Per shard, per part: every row's bytes of that part, as generated.
    generated: Vec<Vec<Vec<u8>>>,
    decoder: EncodingDecoder,
    /// Row cache budget of the readers made from it (default if `None`).
    pub cache_budget: Option<u64>,
}

impl CkptFixture {
    /// A checkpoint of about `rows` rows in `enc`, `shards` shards over
    /// `files` files, in the cargo target's scratch directory (a real disk
    /// file system, so `O_DIRECT` reads are exercised, not refused as on a
    /// tmpfs).
    pub fn new(enc: CkptEncoding, rows: u64, shards: usize, files: usize, seed: u64) -> Self {
        Self::of_spec(CkptSpec {
            shards,
            ..CkptSpec::new(enc, rows, files, seed)
        })
    }

    /// The checkpoint `spec` describes, as [`CkptFixture::new`] makes it.
    #[allow(dead_code)] // Not every test file that includes this uses it.
    pub fn of_spec(spec: CkptSpec) -> Self {
        let (enc, shards, files, seed) = (spec.encoding, spec.shards, spec.files, spec.seed);
        let dir = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
        let path = dir.path().join(format!("{}-{files}", enc.name()));
        let sum = write_checkpoint(&spec, &path, &mut |_| {}).unwrap();
        let part_len: Vec<usize> = enc.part_row_bytes().iter().map(|&b| b as usize).collect();
        let rps = sum.layout.rows_per_shard;
        let generated = (0..shards)
            .map(|shard| {
                part_len
                    .iter()
                    .enumerate()
                    .map(|(p, &len)| {
                        let mut v = vec![0u8; rps as usize * len];
                        fill_part(enc, p, &mut part_rng(seed, shard, p), &mut v);
                        v
                    })
                    .collect()
            })
            .collect();
        let encoding = spec.row_encoding();
        CkptFixture {
            dir,
            path,
            spec,
            rows: sum.layout.rows,
            rows_per_shard: rps,
            part_len,
            generated,
            decoder: EncodingDecoder::scalar(encoding, 160).unwrap(),
            cache_budget: None,
        }
    }

    /// Readers made from this fixture get a row cache of `bytes`.
    pub fn with_cache_budget(mut self, bytes: u64) -> Self {
        self.cache_budget = Some(bytes);
        self
    }

    /// A reader over the checkpoint directory.
    pub fn reader(&self) -> Table {
        let t = Table::open(&self.path).unwrap();
        match self.cache_budget {
            Some(b) => t.with_budget(b).unwrap(),
            None => t,
        }
    }

    /// The generated parts of `row`.
    fn parts(&self, row: u64) -> Vec<&[u8]> {
        let (shard, local) = (
            (row / self.rows_per_shard) as usize,
            (row % self.rows_per_shard) as usize,
        );
        self.part_len
            .iter()
            .enumerate()
            .map(|(p, &len)| &self.generated[shard][p][local * len..(local + 1) * len])
            .collect()
    }

    /// The stored bytes of `rows`: each row's parts concatenated.
    pub fn reference_raw(&self, rows: &[u64]) -> Vec<u8> {
        rows.iter().flat_map(|&r| self.parts(r).concat()).collect()
    }

    /// `rows` decoded by the scalar reference decoder.
    pub fn reference(&self, rows: &[u64]) -> Vec<f32> {
        let mut out = vec![0f32; rows.len() * 160];
        for (&r, dst) in rows.iter().zip(out.chunks_exact_mut(160)) {
            self.decoder.decode_f32(&self.parts(r), dst).unwrap();
        }
        out
    }

    /// Rows one of whose parts straddles a page boundary (at most `n`),
    /// found through the table's extents.
    pub fn straddlers(&self, table: &Table, page: u64, n: usize) -> Vec<u64> {
        (0..self.rows)
            .filter(|&r| {
                table
                    .layout()
                    .extents(r)
                    .unwrap()
                    .as_slice()
                    .iter()
                    .any(|e| e.offset / page != (e.offset + e.len - 1) / page)
            })
            .take(n)
            .collect()
    }
}

/// Bit patterns, so NaN payloads and signed zeros compare exactly.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A small deterministic generator (no dependency on test order).
#[allow(unused_imports)]
pub use pleio_lab::random::Rng;
