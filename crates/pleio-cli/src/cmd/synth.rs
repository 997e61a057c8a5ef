//! `pleio synth`: write a synthetic model file.

use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use pleio::gguf::Sink;
use pleio::ngram::released::{GEMMA_VOCAB, QWEN_FULL_ROWS};
use pleio::quant::GgmlType;
use pleio_lab::synth::{Arch, SynthSpec};
use pleio_lab::synth_ckpt::{write_checkpoint_into, CkptEncoding, CkptSpec, ShardRows};

use crate::outfile::{self, OutDir, OutFile, Replace};
use crate::output::{byte_progress, human_bytes};

/// Default qwen4exp rows: 16 Mi rows, 1.41 GiB of IQ4_NL.
const DEFAULT_QWEN_ROWS: u64 = 16 << 20;

/// A table's file format, as `--format` names it.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FormatArg {
    /// One GGUF file.
    Gguf,
    /// A safetensors checkpoint directory.
    Safetensors,
}

#[derive(Clone, Copy, ValueEnum)]
enum ArchArg {
    Qwen4exp,
    Gemma4,
}

/// Write a GGUF file with an architecture's real metadata keys and its PLE
/// tensor `per_layer_token_embd.weight`, filled with seeded random valid
/// blocks; or (`--format safetensors`, qwen4exp) a Hugging Face style
/// checkpoint directory: config.json, model.safetensors.index.json and
/// `--files` files holding the table's 128 row shards among unrelated
/// tensors, with its scale tensors and n-gram buffers.
///
/// Below full size, the qwen4exp head layout is scaled down by the released
/// rule (16 consecutive primes, largest start that fits), so the file's
/// n-gram metadata always addresses rows inside the table.
#[derive(clap::Args)]
pub struct Args {
    /// Output format: one GGUF file, or a safetensors checkpoint directory.
    #[arg(long, value_enum, default_value = "gguf")]
    format: FormatArg,
    /// Checkpoint row encoding (`--format safetensors`): bf16, fp8 (one
    /// BF16 table scale), fp8-row (a BF16 scale per row), nvfp4, mlx4.
    #[arg(long, default_value = "fp8")]
    encoding: String,
    /// Checkpoint files (`--format safetensors`).
    #[arg(long, default_value_t = 4)]
    files: usize,
    /// Row shards per table (`--format safetensors`; the config's
    /// `split_ngram_parts`).
    #[arg(long, default_value_t = 128)]
    shards: usize,
    /// PLE layers (`--format safetensors`), 1-based like config.json's
    /// `ple_layer_ids` (the release: 2, decoder layer 1); each gets its own
    /// table, geometry, buffers and rows, e.g. `--ple-layers 1,3`.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    ple_layers: Vec<u64>,
    /// How tables split into shards (`--format safetensors`): even (rows
    /// padded to a multiple of the shards), ceil (vLLM: ceil(rows/shards)
    /// a shard, the last smaller) or divmod (mlx-vlm: the first rows %
    /// shards shards one row more).
    #[arg(long, default_value = "even")]
    shard_rows: String,
    /// `--encoding fp8`: write the table scale as this F32 (e.g. 2e-4)
    /// instead of the BF16 nearest 2e-4 (engines round an F32 scale to the
    /// output type first: see `pleio gather --rounding`).
    #[arg(long, value_name = "F32")]
    fp8_scale: Option<f32>,
    /// `--encoding nvfp4`: where the global scale (`weight_scale_2`) goes:
    /// shard (the release: an equal scalar in every shard) or table (one
    /// `ngram_embedding.weight_scale_2`, the only layout vLLM 0.33 loads).
    #[arg(long, value_name = "shard|table", default_value = "shard")]
    nvfp4_scale_2: String,
    /// Architecture whose metadata and table shape to write.
    #[arg(long, value_enum, default_value = "qwen4exp")]
    arch: ArchArg,
    /// Table type (default IQ4_NL for qwen4exp, Q5_K for gemma4).
    #[arg(long = "type", value_parser = parse_type)]
    ty: Option<GgmlType>,
    /// Rows: a number (suffixes k, M, G are powers of 1024, as for every size and count pleio takes) or `full`
    /// (qwen4exp 320001536 with the released hash constants; gemma4 262144).
    /// Default: qwen4exp 16777216 (1.41 GiB as IQ4_NL), gemma4 262144.
    #[arg(long)]
    rows: Option<String>,
    /// Gemma 4 layers (E2B 35, E4B 42).
    #[arg(long, default_value_t = 42)]
    layers: u64,
    /// Seed of the random blocks.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Leave the table as a sparse hole (reads as zero blocks): the real
    /// geometry without writing gigabytes.
    #[arg(long)]
    sparse: bool,
    /// Overwrite an existing output file (only if no other writer replaced
    /// it while this one ran). A checkpoint directory is never replaced.
    #[arg(long)]
    force: bool,
    /// Output file, written under a temporary name beside it and renamed
    /// into place when complete (`-`: standard output; character devices
    /// and FIFOs are written directly; symbolic links to files are refused).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

pub fn parse_type(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s).ok_or_else(|| format!("unknown ggml type {s:?}"))
}

fn parse_rows(s: &str, arch: Arch) -> Result<u64> {
    if s.eq_ignore_ascii_case("full") {
        return Ok(match arch {
            Arch::Qwen4exp => QWEN_FULL_ROWS,
            Arch::Gemma4 => GEMMA_VOCAB,
        });
    }
    pleio_lab::units::parse_quantity(s).with_context(|| {
        format!("--rows {s:?} is not a count like 48000000, 16M or 1.5G (powers of 1024) or `full`")
    })
}

pub fn run(a: Args) -> Result<()> {
    if a.format == FormatArg::Safetensors {
        return run_checkpoint(a);
    }
    if a.ple_layers != [2] || a.shard_rows != "even" || a.shards != 128 {
        bail!("--ple-layers, --shard-rows and --shards are for --format safetensors (a GGUF file has one table)");
    }
    if a.fp8_scale.is_some() {
        bail!("--fp8-scale is for checkpoints (--format safetensors --encoding fp8)");
    }
    let arch = match a.arch {
        ArchArg::Qwen4exp => Arch::Qwen4exp,
        ArchArg::Gemma4 => Arch::Gemma4,
    };
    let rows = match &a.rows {
        Some(s) => parse_rows(s, arch)?,
        None => match arch {
            Arch::Qwen4exp => DEFAULT_QWEN_ROWS,
            Arch::Gemma4 => GEMMA_VOCAB,
        },
    };
    let spec = match arch {
        Arch::Qwen4exp => SynthSpec::qwen(a.ty.unwrap_or(GgmlType::IQ4_NL), rows, a.seed),
        Arch::Gemma4 => SynthSpec::gemma(a.ty.unwrap_or(GgmlType::Q5_K), rows, a.layers, a.seed),
    };
    let spec = SynthSpec {
        sparse: a.sparse,
        ..spec
    };
    let table_bytes = spec.table_bytes()?;
    spec.metadata()?; // validate before creating anything
    let kind = outfile::check(&a.output, Replace::IfForced(a.force))?;
    if !a.sparse && kind == outfile::Kind::File {
        check_free_space(&a.output, table_bytes)?;
    }
    let out = OutFile::create(&a.output, Replace::IfForced(a.force))?;
    let file = out
        .file()
        .try_clone()
        .with_context(|| format!("writing {}", a.output.display()))?;
    let bar = byte_progress(table_bytes, "synth");
    let buffered = BufWriter::with_capacity(4 << 20, file);
    let mut progress = |done| bar.set_position(done);
    // A pipe, a FIFO or a device cannot seek or be truncated: the file is
    // streamed front to back (holes written as zeros).
    let sink = if kind == outfile::Kind::File {
        spec.write(buffered, &mut progress)
    } else {
        spec.write(Forward::new(buffered), &mut progress)
            .map(|f| f.out)
    }
    .with_context(|| format!("writing {}", a.output.display()))?;
    bar.finish_and_clear();
    let file = sink
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", a.output.display()))?;
    let size = match file.metadata() {
        Ok(m) if m.is_file() => format!(" ({} file)", human_bytes(m.len())),
        _ => String::new(),
    };
    drop(file);
    let to_stdout = out.is_stdout();
    out.commit()?;
    let line = format!(
        "wrote {}: {} {} table, {} rows x {} elements, {} of table data{}{size}",
        a.output.display(),
        arch.name(),
        spec.ty,
        spec.rows,
        spec.row_elems(),
        human_bytes(table_bytes),
        if a.sparse { " left sparse" } else { "" },
    );
    if to_stdout {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    Ok(())
}

/// `--format safetensors`: a checkpoint directory, written through a
/// temporary sibling and renamed (an existing output is never replaced).
fn run_checkpoint(a: Args) -> Result<()> {
    if !matches!(a.arch, ArchArg::Qwen4exp) {
        bail!("--format safetensors writes qwen4exp checkpoints only");
    }
    if a.ty.is_some() {
        bail!("--type is for GGUF files; checkpoints take --encoding");
    }
    let encoding = CkptEncoding::from_name(&a.encoding).with_context(|| {
        format!(
            "unknown --encoding {:?} (bf16, fp8, fp8-row, nvfp4, mlx4)",
            a.encoding
        )
    })?;
    let rows = match &a.rows {
        Some(s) => parse_rows(s, Arch::Qwen4exp)?,
        None => DEFAULT_QWEN_ROWS,
    };
    let shard_rows = ShardRows::from_name(&a.shard_rows).with_context(|| {
        format!(
            "unknown --shard-rows {:?} (even, ceil, divmod)",
            a.shard_rows
        )
    })?;
    if let Some(s) = a.fp8_scale {
        if encoding != CkptEncoding::Fp8 {
            bail!("--fp8-scale is for --encoding fp8 (one table scale)");
        }
        if !s.is_finite() || s <= 0.0 {
            bail!("--fp8-scale {s}: a scale is finite and positive");
        }
    }
    let nvfp4_table_scale = match a.nvfp4_scale_2.as_str() {
        "shard" => false,
        "table" if encoding == CkptEncoding::Nvfp4 => true,
        "table" => bail!("--nvfp4-scale-2 table is for --encoding nvfp4"),
        other => bail!("unknown --nvfp4-scale-2 {other:?} (shard, table)"),
    };
    let spec = CkptSpec {
        nvfp4_table_scale,
        sparse: a.sparse,
        shards: a.shards,
        ple_layers: a.ple_layers.clone(),
        shard_rows,
        fp8_scale_f32_bits: a.fp8_scale.map(f32::to_bits),
        ..CkptSpec::new(encoding, rows, a.files, a.seed)
    };
    let layout = spec.layout()?;
    let all_rows = layout
        .layers
        .iter()
        .try_fold(0u64, |acc, l| acc.checked_add(l.rows))
        .context("table rows overflow")?;
    let table_bytes = all_rows
        .checked_mul(encoding.row_bytes())
        .context("table bytes overflow")?;
    if !a.sparse {
        check_free_space(&a.output, table_bytes)?;
    }
    let out = OutDir::create(&a.output)?;
    let bar = byte_progress(table_bytes, "synth");
    let summary = write_checkpoint_into(&spec, out.path(), &a.output, &mut |done| {
        bar.set_position(done)
    })
    .with_context(|| format!("writing {}", a.output.display()))?;
    bar.finish_and_clear();
    out.commit()?;
    let per_layer: Vec<String> = layout
        .layers
        .iter()
        .map(|l| format!("layer {} ({} rows)", l.layer, l.rows))
        .collect();
    println!(
        "wrote {}: qwen4exp {} checkpoint, {} rows x 160 elements in {} shards ({}) over {} files, {} of table data{}; PLE tables: {}",
        summary.dir.display(),
        encoding.name(),
        layout.rows,
        spec.shards,
        shard_rows.name(),
        summary.files.len(),
        human_bytes(summary.table_bytes),
        if a.sparse { " left sparse" } else { "" },
        per_layer.join(", "),
    );
    Ok(())
}

/// Refuses to start a write that cannot fit on the output's file system.
fn check_free_space(output: &std::path::Path, need: u64) -> Result<()> {
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if let Some(free) = pleio_lab::os::free_bytes(&dir) {
        if free < need {
            bail!(
                "{} needs {} but only {} is free on {}; use --sparse or fewer --rows",
                "the table",
                human_bytes(need),
                human_bytes(free),
                dir.display()
            );
        }
    }
    Ok(())
}

/// A forward-only [`Sink`] over a stream that cannot seek (a pipe, a FIFO,
/// a terminal, `/dev/null`): a forward seek or a longer length writes
/// zeros; a backward seek or a truncation is an error (the GGUF writer
/// never asks for one).
struct Forward<W: Write> {
    out: W,
    pos: u64,
}

impl<W: Write> Forward<W> {
    fn new(out: W) -> Forward<W> {
        Forward { out, pos: 0 }
    }

    fn zeros(&mut self, mut n: u64) -> io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while n > 0 {
            let k = n.min(ZEROS.len() as u64) as usize;
            self.write_all(&ZEROS[..k])?;
            n -= k as u64;
        }
        Ok(())
    }
}

impl<W: Write> Write for Forward<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl<W: Write> Seek for Forward<W> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(t) => Some(t),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(_) => None,
        };
        match target {
            Some(t) if t >= self.pos => {
                self.zeros(t - self.pos)?;
                Ok(self.pos)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "cannot seek backwards in a stream",
            )),
        }
    }
}

impl<W: Write> Sink for Forward<W> {
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        match len.checked_sub(self.pos) {
            Some(n) => self.zeros(n),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "cannot truncate a stream",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    #[test]
    fn a_forward_sink_gets_the_bytes_a_file_gets() {
        let spec = SynthSpec {
            sparse: true,
            ..SynthSpec::qwen(GgmlType::Q8_0, 2000, 7)
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.gguf");
        let f = spec
            .write(File::create(&path).unwrap(), &mut |_| {})
            .unwrap();
        drop(f);
        let streamed = spec
            .write(Forward::new(Vec::new()), &mut |_| {})
            .unwrap()
            .out;
        assert_eq!(streamed, std::fs::read(&path).unwrap());
        let mut f = Forward::new(Vec::new());
        f.write_all(b"abc").unwrap();
        assert!(f.seek(SeekFrom::Start(1)).is_err());
        assert!(f.set_len(2).is_err());
    }
}
