//! Synthetic qwen4exp safetensors checkpoints, laid out as the released
//! ones: `config.json`, `model.safetensors.index.json` and K files holding
//! the table's row shards interleaved with unrelated tensors, the scale
//! tensors and the n-gram buffers.
//!
//! Rows are scaled as [`crate::synth`] scales GGUF tables: for a requested
//! row count the 16 head sizes are the consecutive primes with the largest
//! start that fit ([`QwenHeads::for_rows`]); the config's
//! `ngram_vocab_size_base` is the first of them, so the config derivation
//! ([`NgramConfig`]) gives back exactly
//! these sizes, and the table has their sum rounded up to a multiple of 128
//! rows. At [`QWEN_FULL_ROWS`] this is the released table: base
//! 20,000,000, 320,001,536 rows, 128 shards of 2,500,012.
//!
//! Row bytes are seeded random values, valid for the encoding (no NaN
//! codes; scales finite and positive), generated per shard and part so the
//! bytes do not depend on the file layout. With `sparse` the table's bytes
//! are left as holes (they read as zeros).

use std::fs;
use std::path::{Path, PathBuf};

use crate::random::Rng;
use pleio::checkpoint::{config::DEFAULT_SEED, ConfigError, NgramConfig, CONFIG_FILE_NAME};
use pleio::ngram::released::{
    QwenHeads, QWEN_EOS, QWEN_FULL_ROWS, QWEN_HEADS_PER_NGRAM, QWEN_IMAGE, QWEN_NGRAM_SIZE,
    QWEN_ROW_ELEMS,
};
use pleio::quant::encoding::{Encoding, Fp8Scale, ScaleType, MLX_GROUP, NVFP4_BLOCK};
use pleio::safetensors::{Dtype, SafetensorsError, SafetensorsWriter, INDEX_FILE_NAME};

/// The Hugging Face tensor prefix of the table.
pub const HF_PREFIX: &str = "model.language_model.layers.1.ple.ple_embedding.";
/// The MLX conversion's tensor prefix of the table.
pub const MLX_PREFIX: &str = "language_model.model.layers.1.ple.ple_embedding.";
/// `make_ngram_vocab_size_divisible_by` of the release.
pub const DIVISIBLE_BY: u64 = 128;
/// `split_ngram_parts` of the release.
pub const RELEASED_SHARDS: usize = 128;
/// `vocab_size` of the release.
pub const VOCAB_SIZE: u64 = 248_320;
/// The per-tensor FP8 scale written (the BF16 nearest 2e-4, as in the
/// release).
pub const FP8_SCALE_BF16: u16 = 0x3952;
/// The NVFP4 global scale written (`weight_scale_2`).
pub const NVFP4_GLOBAL: f32 = 1.0 / 2688.0;

/// Which encoding to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CkptEncoding {
    /// BF16 rows.
    Bf16,
    /// FP8 E4M3 with one BF16 table scale.
    Fp8,
    /// FP8 E4M3 with a BF16 scale per row (`shard_i.weight_scale` [rows, 1]).
    Fp8Row,
    /// NVFP4 (U8 nibbles, E4M3 block scales, F32 global).
    Nvfp4,
    /// MLX affine 4-bit (MLX names `shards.{i}`).
    Mlx4,
}

impl CkptEncoding {
    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            CkptEncoding::Bf16 => "bf16",
            CkptEncoding::Fp8 => "fp8",
            CkptEncoding::Fp8Row => "fp8-row",
            CkptEncoding::Nvfp4 => "nvfp4",
            CkptEncoding::Mlx4 => "mlx4",
        }
    }

    /// Parses a CLI name.
    pub fn from_name(s: &str) -> Option<CkptEncoding> {
        [
            CkptEncoding::Bf16,
            CkptEncoding::Fp8,
            CkptEncoding::Fp8Row,
            CkptEncoding::Nvfp4,
            CkptEncoding::Mlx4,
        ]
        .into_iter()
        .find(|e| e.name() == s)
    }

    /// Bytes of one qwen4exp row (all parts).
    pub fn row_bytes(self) -> u64 {
        self.parts(QWEN_ROW_ELEMS)
            .iter()
            .map(|&(_, d, w)| w * d.size().unwrap_or(1))
            .sum()
    }

    /// The row encoding the written tensors describe (with the scales the
    /// writer uses: [`FP8_SCALE_BF16`], [`NVFP4_GLOBAL`]).
    pub fn encoding(self) -> Encoding {
        match self {
            CkptEncoding::Bf16 => Encoding::Bf16,
            CkptEncoding::Fp8 => Encoding::Fp8(Fp8Scale::PerTensor(f32::from_bits(
                u32::from(FP8_SCALE_BF16) << 16,
            ))),
            CkptEncoding::Fp8Row => Encoding::Fp8(Fp8Scale::PerRow(ScaleType::Bf16)),
            CkptEncoding::Nvfp4 => Encoding::Nvfp4 {
                global_scale: NVFP4_GLOBAL,
            },
            CkptEncoding::Mlx4 => Encoding::Mlx4,
        }
    }

    /// Bytes of each part of one qwen4exp row, in part order (the
    /// per-shard tensors: `weight`, then scales, then biases).
    pub fn part_row_bytes(self) -> Vec<u64> {
        self.parts(QWEN_ROW_ELEMS)
            .iter()
            .map(|&(_, d, w)| w * d.size().unwrap_or(1))
            .collect()
    }

    /// (field, dtype, width) of each per-shard tensor, for rows of `n`.
    fn parts(self, n: u64) -> Vec<(&'static str, Dtype, u64)> {
        match self {
            CkptEncoding::Bf16 => vec![("weight", Dtype::BF16, n)],
            CkptEncoding::Fp8 => vec![("weight", Dtype::F8_E4M3, n)],
            CkptEncoding::Fp8Row => vec![
                ("weight", Dtype::F8_E4M3, n),
                ("weight_scale", Dtype::BF16, 1),
            ],
            CkptEncoding::Nvfp4 => vec![
                ("weight", Dtype::U8, n / 2),
                ("weight_scale", Dtype::F8_E4M3, n / NVFP4_BLOCK as u64),
            ],
            CkptEncoding::Mlx4 => vec![
                ("weight", Dtype::U32, n / 8),
                ("scales", Dtype::BF16, n / MLX_GROUP as u64),
                ("biases", Dtype::BF16, n / MLX_GROUP as u64),
            ],
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            CkptEncoding::Mlx4 => MLX_PREFIX,
            _ => HF_PREFIX,
        }
    }

    fn shard_name(self, i: usize, field: &str) -> String {
        match self {
            CkptEncoding::Mlx4 => format!("{MLX_PREFIX}ngram_embedding.shards.{i}.{field}"),
            _ => format!("{HF_PREFIX}ngram_embedding.shard_{i}.{field}"),
        }
    }
}

/// What to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CkptSpec {
    /// Row encoding.
    pub encoding: CkptEncoding,
    /// Rows asked for (the table gets the largest config-consistent count
    /// at most this; [`QWEN_FULL_ROWS`] gives the released table).
    pub rows: u64,
    /// Safetensors files (K >= 1).
    pub files: usize,
    /// Row shards (`split_ngram_parts`; 128 in the release).
    pub shards: usize,
    /// Seed of the row bytes.
    pub seed: u64,
    /// Leave the table's bytes as holes.
    pub sparse: bool,
    /// [`CkptEncoding::Fp8`]: write the table scale as the F32 of these
    /// bits instead of the BF16 [`FP8_SCALE_BF16`] (engines round an F32
    /// scale to the output type first: see `pleio::Rounding`).
    pub fp8_scale_f32_bits: Option<u32>,
}

impl CkptSpec {
    /// A spec with the release's 128 shards over `files` files.
    pub fn new(encoding: CkptEncoding, rows: u64, files: usize, seed: u64) -> CkptSpec {
        CkptSpec {
            encoding,
            rows,
            files,
            shards: RELEASED_SHARDS,
            seed,
            sparse: false,
            fp8_scale_f32_bits: None,
        }
    }

    /// The row encoding the written tensors describe (with
    /// [`fp8_scale_f32_bits`](Self::fp8_scale_f32_bits) when set).
    pub fn row_encoding(&self) -> Encoding {
        match (self.encoding, self.fp8_scale_f32_bits) {
            (CkptEncoding::Fp8, Some(s)) => Encoding::Fp8(Fp8Scale::PerTensor(f32::from_bits(s))),
            (e, _) => e.encoding(),
        }
    }
}

/// Errors writing a synthetic checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SynthCkptError {
    /// The output path exists (nothing is replaced).
    #[error("{} exists: pleio writes a new checkpoint directory and replaces nothing", .0.display())]
    Exists(PathBuf),
    /// The spec cannot be honoured.
    #[error("{0}")]
    BadSpec(String),
    /// A file operation failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing a safetensors file failed.
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
}

/// The geometry a spec resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CkptLayout {
    /// The head layout (sizes are the config's derived primes).
    pub heads: QwenHeads,
    /// `ngram_vocab_size_base` written to the config.
    pub vocab_base: u64,
    /// Rows of the table.
    pub rows: u64,
    /// Rows per shard.
    pub rows_per_shard: u64,
}

impl CkptSpec {
    /// The table geometry: heads, base, rows, rows per shard.
    pub fn layout(&self) -> Result<CkptLayout, SynthCkptError> {
        if self.shards == 0 || self.files == 0 || self.files > self.shards {
            return Err(SynthCkptError::BadSpec(format!(
                "{} files for {} shards: need 1 <= files <= shards",
                self.files, self.shards
            )));
        }
        let unit = lcm(DIVISIBLE_BY, self.shards as u64);
        let cap = self.rows / unit * unit;
        let heads = QwenHeads::for_rows(cap).ok_or_else(|| {
            SynthCkptError::BadSpec(format!(
                "{} rows are too few for 16 prime heads in multiples of {unit}",
                self.rows
            ))
        })?;
        let rows = heads.addressed_rows().div_ceil(unit) * unit;
        Ok(CkptLayout {
            vocab_base: if self.rows == QWEN_FULL_ROWS {
                20_000_000
            } else {
                heads.sizes[0]
            },
            rows_per_shard: rows / self.shards as u64,
            rows,
            heads,
        })
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CkptSummary {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Its geometry.
    pub layout: CkptLayout,
    /// The safetensors files, in order.
    pub files: Vec<PathBuf>,
    /// Bytes of the table's shards (all parts).
    pub table_bytes: u64,
}

/// Bytes generated per write.
const CHUNK_BYTES: usize = 8 << 20;

/// Fills `out` with random valid bytes of part `part` (in the spec's part
/// order) of encoding `enc`, from `rng`: BF16 elements with an all-ones
/// exponent lose its lowest bit (finite); E4M3 NaN codes become the largest
/// finite of their sign; block scales and MLX scales are positive finite
/// E4M3 / BF16 in `[2^-10, 2^0)`; MLX biases the same with a random sign.
pub fn fill_part(enc: CkptEncoding, part: usize, rng: &mut Rng, out: &mut [u8]) {
    rng.fill_bytes(out);
    let bf16_finite = |out: &mut [u8]| {
        for h in out.chunks_exact_mut(2) {
            let mut v = u16::from_le_bytes([h[0], h[1]]);
            if v & 0x7F80 == 0x7F80 {
                v &= !0x0080;
            }
            h.copy_from_slice(&v.to_le_bytes());
        }
    };
    let bf16_scale = |out: &mut [u8], signed: bool| {
        for h in out.chunks_exact_mut(2) {
            let r = u16::from_le_bytes([h[0], h[1]]);
            let sign = if signed { r & 0x8000 } else { 0 };
            let exp = 117 + (r >> 7 & 0xFF) % 10;
            h.copy_from_slice(&(sign | exp << 7 | (r & 0x7F)).to_le_bytes());
        }
    };
    match (enc, part) {
        (CkptEncoding::Bf16, _) | (CkptEncoding::Fp8Row, 1) => {
            if part == 1 {
                bf16_scale(out, false)
            } else {
                bf16_finite(out)
            }
        }
        (CkptEncoding::Fp8 | CkptEncoding::Fp8Row, _) => {
            for b in out.iter_mut() {
                if *b & 0x7F == 0x7F {
                    *b -= 1;
                }
            }
        }
        (CkptEncoding::Nvfp4, 1) => {
            // E4M3 exponent 3..=6 (2^-4 .. 2^-1 and mantissa): positive.
            for b in out.iter_mut() {
                *b = (3 + (*b >> 3) % 4) << 3 | (*b & 7);
            }
        }
        (CkptEncoding::Mlx4, 1) => bf16_scale(out, false),
        (CkptEncoding::Mlx4, 2) => bf16_scale(out, true),
        _ => {}
    }
}

/// The rng of part `part` of shard `shard`.
pub fn part_rng(seed: u64, shard: usize, part: usize) -> Rng {
    let mut r = Rng::new(seed ^ (shard as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let skip = r.next_u64();
    Rng::new(skip ^ (part as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// One tensor to write: name, dtype, shape, and where its bytes come from.
enum Source {
    /// Random rows of a table part.
    Part { shard: usize, part: usize },
    /// Fixed bytes.
    Bytes(Vec<u8>),
}

struct Planned {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    source: Source,
}

fn i64_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The parts of row `row` of `table`, by plain positioned reads of its
/// extents from `files` (the table's files, opened, in order): the
/// independent read the tests compare pleio's gathers with.
pub fn read_row_parts(
    table: &pleio::checkpoint::CheckpointTable,
    files: &[fs::File],
    row: u64,
) -> std::io::Result<Vec<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    let ext = table
        .row_extents(row)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    ext.as_slice()
        .iter()
        .map(|e| {
            let mut b = vec![0u8; e.len as usize];
            files[e.file].read_exact_at(&mut b, e.offset)?;
            Ok(b)
        })
        .collect()
}

/// Writes the checkpoint into a new directory `dir` (refused if it
/// exists), through a temporary sibling renamed at the end, so an
/// interrupted run leaves no partial checkpoint under `dir`. `progress`
/// gets the table bytes done so far.
pub fn write_checkpoint(
    spec: &CkptSpec,
    dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<CkptSummary, SynthCkptError> {
    let layout = spec.layout()?;
    if dir.exists() {
        return Err(SynthCkptError::Exists(dir.to_path_buf()));
    }
    let name = dir
        .file_name()
        .ok_or_else(|| SynthCkptError::BadSpec(format!("{}: no directory name", dir.display())))?;
    let tmp = dir.with_file_name(format!(
        ".{}.partial-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SynthCkptError::Io { path, source }
    };
    fs::create_dir(&tmp).map_err(io(&tmp))?;
    let result = write_into(spec, &layout, &tmp, progress);
    match result {
        Ok((files, table_bytes)) => {
            fs::rename(&tmp, dir).map_err(io(dir))?;
            Ok(CkptSummary {
                dir: dir.to_path_buf(),
                files: files.iter().map(|f| dir.join(f)).collect(),
                layout,
                table_bytes,
            })
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// The config.json text.
fn config_json(spec: &CkptSpec, layout: &CkptLayout) -> String {
    let mut text = serde_json::json!({
        "architectures": ["Qwen4ExpForConditionalGeneration"],
        "model_type": "qwen4exp",
        "image_token_id": QWEN_IMAGE,
        "text_config": {
            "model_type": "qwen4exp_text",
            "ple_layer_ids": [2],
            "ple_embed_dim": QWEN_ROW_ELEMS * 16,
            "ngram_size": QWEN_NGRAM_SIZE,
            "heads_per_ngram": QWEN_HEADS_PER_NGRAM,
            "ngram_vocab_size_base": layout.vocab_base,
            "make_ngram_vocab_size_divisible_by": DIVISIBLE_BY,
            "split_ngram_parts": spec.shards,
            "vocab_size": VOCAB_SIZE,
            "eos_token_id": QWEN_EOS,
            "seed": null,
            "ple_conv_kernel_size": 4,
        },
    });
    let tc = &mut text["text_config"];
    match spec.encoding {
        CkptEncoding::Fp8 | CkptEncoding::Fp8Row => {
            tc["ple_embedding_dtype"] = "float8_e4m3fn".into()
        }
        CkptEncoding::Nvfp4 => tc["ple_embedding_dtype"] = "nvfp4".into(),
        CkptEncoding::Mlx4 => {
            text["quantization"] =
                serde_json::json!({"group_size": MLX_GROUP, "bits": 4, "mode": "affine"})
        }
        CkptEncoding::Bf16 => {}
    }
    serde_json::to_string_pretty(&text).expect("JSON values serialize")
}

/// Plans the tensors of each file: shards spread in order over the files,
/// an unrelated tensor before every third shard and at each file's start,
/// the scales and buffers in the last file.
fn plan(spec: &CkptSpec, layout: &CkptLayout) -> Result<Vec<Vec<Planned>>, SynthCkptError> {
    let enc = spec.encoding;
    let n = QWEN_ROW_ELEMS;
    let mut files: Vec<Vec<Planned>> = (0..spec.files).map(|_| Vec::new()).collect();
    let mut filler = 0usize;
    let mut unrelated = |files: &mut Vec<Planned>, rng: &mut Rng| {
        // Odd byte counts, so later tensors start at unaligned offsets.
        let (rows, cols) = (3 + filler as u64 % 5, 7 + filler as u64 % 11);
        let mut bytes = vec![0u8; (rows * cols * 2) as usize];
        rng.fill_bytes(&mut bytes);
        fill_part(
            CkptEncoding::Bf16,
            0,
            &mut Rng::new(filler as u64),
            &mut bytes,
        );
        let names = ["key_proj.weight", "norm_key.weight", "conv1d.weight"];
        files.push(Planned {
            name: format!(
                "model.language_model.layers.{}.ple.{}",
                filler,
                names[filler % names.len()]
            ),
            dtype: Dtype::BF16,
            shape: vec![rows, cols],
            source: Source::Bytes(bytes),
        });
        filler += 1;
    };
    let mut rng = Rng::new(spec.seed ^ 0x5EED);
    for i in 0..spec.shards {
        let f = i * spec.files / spec.shards;
        if i % 3 == 0 || files[f].is_empty() {
            unrelated(&mut files[f], &mut rng);
        }
        for (p, (field, dtype, width)) in enc.parts(n).into_iter().enumerate() {
            files[f].push(Planned {
                name: enc.shard_name(i, field),
                dtype,
                shape: vec![layout.rows_per_shard, width],
                source: Source::Part { shard: i, part: p },
            });
        }
        if enc == CkptEncoding::Nvfp4 {
            files[f].push(Planned {
                name: enc.shard_name(i, "weight_scale_2"),
                dtype: Dtype::F32,
                shape: vec![],
                source: Source::Bytes(NVFP4_GLOBAL.to_le_bytes().to_vec()),
            });
        }
    }
    let last = files.last_mut().expect("files >= 1");
    unrelated(last, &mut rng);
    let prefix = enc.prefix();
    if enc == CkptEncoding::Fp8 {
        let (dtype, bytes) = match spec.fp8_scale_f32_bits {
            Some(s) => (Dtype::F32, s.to_le_bytes().to_vec()),
            None => (Dtype::BF16, FP8_SCALE_BF16.to_le_bytes().to_vec()),
        };
        last.push(Planned {
            name: format!("{prefix}ngram_embedding.weight_scale"),
            dtype,
            shape: vec![1],
            source: Source::Bytes(bytes),
        });
    }
    let config = NgramConfig {
        ngram_size: QWEN_NGRAM_SIZE,
        heads_per_ngram: QWEN_HEADS_PER_NGRAM,
        ngram_vocab_size_base: layout.vocab_base,
        make_ngram_vocab_size_divisible_by: DIVISIBLE_BY,
        split_ngram_parts: Some(spec.shards as u64),
        vocab_size: VOCAB_SIZE,
        eos_token_id: QWEN_EOS,
        seed: DEFAULT_SEED,
        image_token_id: Some(QWEN_IMAGE),
        ple_embedding_dtype: None,
    };
    let derived =
        |r: Result<Vec<u64>, ConfigError>| r.map_err(|e| SynthCkptError::BadSpec(e.to_string()));
    for (name, vals) in [
        ("layer_multipliers", derived(config.multipliers(0))?),
        ("ngram_heads_vocab_sizes", derived(config.head_sizes())?),
        ("ngram_heads_offsets", derived(config.head_offsets())?),
    ] {
        last.push(Planned {
            name: format!("{prefix}{name}"),
            dtype: Dtype::I64,
            shape: vec![vals.len() as u64],
            source: Source::Bytes(i64_bytes(&vals)),
        });
    }
    if config.head_sizes().ok() != Some(layout.heads.sizes.clone()) {
        return Err(SynthCkptError::BadSpec(
            "internal: config derivation and scaled heads disagree".into(),
        ));
    }
    Ok(files)
}

/// Writes every file into `tmp`; returns the file names and table bytes.
fn write_into(
    spec: &CkptSpec,
    layout: &CkptLayout,
    tmp: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<(Vec<String>, u64), SynthCkptError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SynthCkptError::Io { path, source }
    };
    let cfg = tmp.join(CONFIG_FILE_NAME);
    fs::write(&cfg, config_json(spec, layout)).map_err(io(&cfg))?;
    let plan = plan(spec, layout)?;
    let k = plan.len();
    let mut names = Vec::with_capacity(k);
    let mut weight_map = serde_json::Map::new();
    let mut total = 0u64;
    let mut table_done = 0u64;
    let mut buf = vec![0u8; CHUNK_BYTES];
    for (f, tensors) in plan.iter().enumerate() {
        let file_name = format!("model-{:05}-of-{:05}.safetensors", f + 1, k);
        let path = tmp.join(&file_name);
        let mut w = SafetensorsWriter::create(&path)?;
        w.add_metadata("format", "pt")
            .map_err(|e| e.in_file(&path))?;
        for t in tensors {
            w.add_tensor(&t.name, t.dtype, &t.shape)
                .map_err(|e| e.in_file(&path))?;
            weight_map.insert(t.name.clone(), file_name.clone().into());
        }
        w.begin_data().map_err(|e| e.in_file(&path))?;
        for t in tensors {
            match &t.source {
                Source::Bytes(b) => w.write_tensor_data(b).map_err(|e| e.in_file(&path))?,
                Source::Part { shard, part } => {
                    let bytes = t.shape.iter().product::<u64>() * t.dtype.size().unwrap_or(1);
                    if spec.sparse {
                        w.skip_tensor_data(bytes).map_err(|e| e.in_file(&path))?;
                    } else {
                        let row_bytes = bytes / layout.rows_per_shard.max(1);
                        let chunk = (CHUNK_BYTES as u64 / row_bytes.max(1)).max(1) * row_bytes;
                        let mut rng = part_rng(spec.seed, *shard, *part);
                        let mut left = bytes;
                        while left > 0 {
                            let n = left.min(chunk) as usize;
                            fill_part(spec.encoding, *part, &mut rng, &mut buf[..n]);
                            w.write_tensor_data(&buf[..n])
                                .map_err(|e| e.in_file(&path))?;
                            left -= n as u64;
                        }
                    }
                    table_done += bytes;
                    progress(table_done);
                }
            }
        }
        let out = w.finish().map_err(|e| e.in_file(&path))?;
        let file = out.into_inner().map_err(|e| SynthCkptError::Io {
            path: path.clone(),
            source: e.into_error(),
        })?;
        total += file.metadata().map_err(io(&path))?.len();
        names.push(file_name);
    }
    let index = serde_json::json!({
        "metadata": {"total_size": total},
        "weight_map": weight_map,
    });
    let ipath = tmp.join(INDEX_FILE_NAME);
    fs::write(
        &ipath,
        serde_json::to_string_pretty(&index).expect("JSON values serialize"),
    )
    .map_err(io(&ipath))?;
    Ok((names, table_done))
}
