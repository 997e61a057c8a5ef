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
//! With several PLE layers ([`CkptSpec::ple_layers`], 1-based like the
//! config's `ple_layer_ids`), each layer's table gets the geometry the
//! config derives for its PLE layer index (the head primes continue from
//! the previous layer's, the multipliers are seeded `seed + 10007 *
//! index`): its own rows, shards, buffers and row bytes, under the prefix
//! `…layers.{id - 1}.ple.ple_embedding.`.
//!
//! Shards split a table evenly by default (rows a multiple of the shard
//! count); [`ShardRows::Ceil`] (vLLM: `ceil(rows / parts)` a shard, the last
//! one smaller) and [`ShardRows::Divmod`] (mlx-vlm: the first `rows %
//! parts` shards one row more) keep the rows the config derives (a multiple
//! of 128) whatever the shard count.
//!
//! Row bytes are seeded random values, valid for the encoding (no NaN
//! codes; scales finite and positive), generated per layer, shard and part
//! so the bytes do not depend on the file layout. With `sparse` the
//! table's bytes are left as holes (they read as zeros).
//!
//! `config.json` is a text-only `qwen4_exp_text` config
//! (`Qwen4ExpForCausalLM`) that transformers 5.19 loads: a tiny model's
//! dimensions, every PLE layer linear attention, the last layer indexed
//! attention.

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

/// The Hugging Face tensor prefix of the table (the released PLE layer).
pub const HF_PREFIX: &str = "model.language_model.layers.1.ple.ple_embedding.";
/// The MLX conversion's tensor prefix of the table (the released PLE layer).
pub const MLX_PREFIX: &str = "language_model.model.layers.1.ple.ple_embedding.";
/// `ple_layer_ids` of the release (1-based: decoder layer 1).
pub const RELEASED_PLE_LAYER_IDS: [u64; 1] = [2];

/// The Hugging Face tensor prefix of the table of decoder layer `layer`
/// (0-based).
pub fn hf_prefix(layer: u64) -> String {
    format!("model.language_model.layers.{layer}.ple.ple_embedding.")
}

/// The MLX tensor prefix of the table of decoder layer `layer` (0-based).
pub fn mlx_prefix(layer: u64) -> String {
    format!("language_model.model.layers.{layer}.ple.ple_embedding.")
}

/// How a table's rows are split into shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardRows {
    /// Every shard alike: the table's rows are padded to a multiple of
    /// `lcm(128, shards)` (the config's `make_ngram_vocab_size_divisible_by`).
    #[default]
    Even,
    /// vLLM: `ceil(rows / parts)` rows a shard, the last one smaller.
    Ceil,
    /// mlx-vlm: `rows / parts` a shard, the first `rows % parts` one more.
    Divmod,
}

impl ShardRows {
    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            ShardRows::Even => "even",
            ShardRows::Ceil => "ceil",
            ShardRows::Divmod => "divmod",
        }
    }

    /// Parses a CLI name.
    pub fn from_name(s: &str) -> Option<ShardRows> {
        [ShardRows::Even, ShardRows::Ceil, ShardRows::Divmod]
            .into_iter()
            .find(|r| r.name() == s)
    }

    /// The rows of each of `parts` shards of a `rows`-row table; `None` if
    /// the rule leaves a shard empty (or `parts` is 0).
    pub fn split(self, rows: u64, parts: u64) -> Option<Vec<u64>> {
        if parts == 0 {
            return None;
        }
        let v: Vec<u64> = match self {
            ShardRows::Even => {
                if !rows.is_multiple_of(parts) {
                    return None;
                }
                vec![rows / parts; parts as usize]
            }
            ShardRows::Ceil => {
                let c = rows.div_ceil(parts);
                (0..parts)
                    .map(|i| rows.saturating_sub(i * c).min(c))
                    .collect()
            }
            ShardRows::Divmod => {
                let (q, r) = (rows / parts, rows % parts);
                (0..parts).map(|i| q + u64::from(i < r)).collect()
            }
        };
        v.iter().all(|&r| r > 0).then_some(v)
    }
}

/// The seed of the row bytes of PLE layer index `index` (the first layer's
/// is `seed` itself).
pub fn layer_seed(seed: u64, index: u64) -> u64 {
    seed ^ index.wrapping_mul(0xA24B_AED4_963E_E407)
}
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

    /// The tensor prefix of the table of decoder layer `layer` (0-based).
    pub fn prefix(self, layer: u64) -> String {
        match self {
            CkptEncoding::Mlx4 => mlx_prefix(layer),
            _ => hf_prefix(layer),
        }
    }

    fn shard_name(self, layer: u64, i: usize, field: &str) -> String {
        let prefix = self.prefix(layer);
        match self {
            CkptEncoding::Mlx4 => format!("{prefix}ngram_embedding.shards.{i}.{field}"),
            _ => format!("{prefix}ngram_embedding.shard_{i}.{field}"),
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
    /// The PLE layers, 1-based as `ple_layer_ids` (`[2]` in the release:
    /// decoder layer 1); each gets its own table.
    pub ple_layers: Vec<u64>,
    /// How each table's rows are split into shards.
    pub shard_rows: ShardRows,
    /// [`CkptEncoding::Fp8`]: write the table scale as the F32 of these
    /// bits instead of the BF16 [`FP8_SCALE_BF16`] (engines round an F32
    /// scale to the output type first: see `pleio::Rounding`).
    pub fp8_scale_f32_bits: Option<u32>,
    /// [`CkptEncoding::Nvfp4`]: write one table-level
    /// `ngram_embedding.weight_scale_2` (vLLM 0.33's layout, the only one
    /// its loader takes) instead of the release's equal scalar per shard.
    pub nvfp4_table_scale: bool,
}

impl CkptSpec {
    /// A spec with the release's 128 shards over `files` files and its one
    /// PLE layer.
    pub fn new(encoding: CkptEncoding, rows: u64, files: usize, seed: u64) -> CkptSpec {
        CkptSpec {
            encoding,
            rows,
            files,
            shards: RELEASED_SHARDS,
            seed,
            sparse: false,
            ple_layers: RELEASED_PLE_LAYER_IDS.to_vec(),
            shard_rows: ShardRows::Even,
            fp8_scale_f32_bits: None,
            nvfp4_table_scale: false,
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
    /// The head layout of the first PLE layer (sizes are the config's
    /// derived primes).
    pub heads: QwenHeads,
    /// `ngram_vocab_size_base` written to the config.
    pub vocab_base: u64,
    /// `make_ngram_vocab_size_divisible_by` written to the config.
    pub divisible_by: u64,
    /// Rows of the first PLE layer's table.
    pub rows: u64,
    /// Rows of the first PLE layer's shard 0.
    pub rows_per_shard: u64,
    /// Every PLE layer's table, in `ple_layer_ids` order.
    pub layers: Vec<LayerLayout>,
}

/// The table of one PLE layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerLayout {
    /// The decoder layer (0-based; `ple_layer_ids` entry - 1).
    pub layer: u64,
    /// The PLE layer index (position in `ple_layer_ids`).
    pub index: u64,
    /// Its head layout.
    pub heads: QwenHeads,
    /// Its hash multipliers.
    pub multipliers: Vec<u64>,
    /// Its rows.
    pub rows: u64,
    /// Rows of each shard.
    pub shard_rows: Vec<u64>,
    /// Seed of its row bytes ([`layer_seed`]).
    pub seed: u64,
}

impl LayerLayout {
    /// The first row of each shard.
    pub fn shard_starts(&self) -> Vec<u64> {
        self.shard_rows
            .iter()
            .scan(0u64, |acc, &r| {
                let s = *acc;
                *acc += r;
                Some(s)
            })
            .collect()
    }
}

impl CkptSpec {
    /// The config keys this spec writes (`ngram_vocab_size_base` etc.).
    pub fn ngram_config(&self, vocab_base: u64, divisible_by: u64) -> NgramConfig {
        NgramConfig {
            ngram_size: QWEN_NGRAM_SIZE,
            heads_per_ngram: QWEN_HEADS_PER_NGRAM,
            ngram_vocab_size_base: vocab_base,
            make_ngram_vocab_size_divisible_by: divisible_by,
            split_ngram_parts: Some(self.shards as u64),
            vocab_size: VOCAB_SIZE,
            eos_token_id: QWEN_EOS,
            seed: DEFAULT_SEED,
            image_token_id: Some(QWEN_IMAGE),
            ple_embedding_dtype: None,
            ple_layer_ids: Some(self.ple_layers.clone()),
        }
    }

    /// The table geometry: heads, base, rows, shards of every PLE layer.
    pub fn layout(&self) -> Result<CkptLayout, SynthCkptError> {
        if self.shards == 0 || self.files == 0 || self.files > self.shards {
            return Err(SynthCkptError::BadSpec(format!(
                "{} files for {} shards: need 1 <= files <= shards",
                self.files, self.shards
            )));
        }
        let mut ids = self.ple_layers.clone();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() || ids.len() != self.ple_layers.len() || ids[0] == 0 {
            return Err(SynthCkptError::BadSpec(format!(
                "PLE layers {:?}: need distinct 1-based layer ids",
                self.ple_layers
            )));
        }
        if ids.len() > 64 || ids[ids.len() - 1] > 4096 {
            return Err(SynthCkptError::BadSpec(format!(
                "PLE layers {:?}: at most 64 layers, ids up to 4096",
                self.ple_layers
            )));
        }
        let unit = match self.shard_rows {
            ShardRows::Even => lcm(DIVISIBLE_BY, self.shards as u64),
            ShardRows::Ceil | ShardRows::Divmod => DIVISIBLE_BY,
        };
        let cap = self.rows / unit * unit;
        let heads = QwenHeads::for_rows(cap).ok_or_else(|| {
            SynthCkptError::BadSpec(format!(
                "{} rows are too few for 16 prime heads in multiples of {unit}",
                self.rows
            ))
        })?;
        let vocab_base = if self.rows == QWEN_FULL_ROWS {
            20_000_000
        } else {
            heads.sizes[0]
        };
        let config = self.ngram_config(vocab_base, unit);
        let bad = |e: ConfigError| SynthCkptError::BadSpec(format!("config.json: {e}"));
        let mut layers = Vec::with_capacity(ids.len());
        for (index, &id) in ids.iter().enumerate() {
            let index = index as u64;
            let sizes = config.head_sizes(index).map_err(bad)?;
            let offsets = config.head_offsets(index).map_err(bad)?;
            let rows = config.table_rows(index).map_err(bad)?;
            let shard_rows = self
                .shard_rows
                .split(rows, self.shards as u64)
                .ok_or_else(|| {
                    SynthCkptError::BadSpec(format!(
                        "{rows} rows in {} shards split {} leave a shard empty",
                        self.shards,
                        self.shard_rows.name()
                    ))
                })?;
            layers.push(LayerLayout {
                layer: id - 1,
                index,
                heads: QwenHeads { sizes, offsets },
                multipliers: config.multipliers(index).map_err(bad)?,
                rows,
                shard_rows,
                seed: layer_seed(self.seed, index),
            });
        }
        if layers[0].heads.sizes != heads.sizes {
            return Err(SynthCkptError::BadSpec(
                "internal: config derivation and scaled heads disagree".into(),
            ));
        }
        Ok(CkptLayout {
            vocab_base,
            divisible_by: unit,
            rows: layers[0].rows,
            rows_per_shard: layers[0].shard_rows[0],
            heads,
            layers,
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
    /// Bytes of the tables' shards (all parts, every layer).
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
    /// Random rows of a table part (of the layer whose bytes `seed` seeds).
    Part {
        seed: u64,
        shard: usize,
        part: usize,
    },
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
/// exists), through a temporary sibling of an unpredictable name renamed
/// at the end, so an interrupted run leaves no partial checkpoint under
/// `dir`. `progress` gets the table bytes done so far.
///
/// For tests and tools without signal handling: the `pleio synth` door
/// writes through [`write_checkpoint_into`] into a temporary directory it
/// removes on signals and renames without replacing anything.
pub fn write_checkpoint(
    spec: &CkptSpec,
    dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<CkptSummary, SynthCkptError> {
    spec.layout()?;
    if dir.exists() {
        return Err(SynthCkptError::Exists(dir.to_path_buf()));
    }
    let name = dir
        .file_name()
        .ok_or_else(|| SynthCkptError::BadSpec(format!("{}: no directory name", dir.display())))?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SynthCkptError::Io { path, source }
    };
    let keys = std::collections::hash_map::RandomState::new();
    let mut tmp = dir.to_path_buf();
    for attempt in 0u32.. {
        use std::hash::BuildHasher;
        tmp = dir.with_file_name(format!(
            ".{}.{:016x}.partial",
            name.to_string_lossy(),
            keys.hash_one((std::process::id(), attempt))
        ));
        match fs::create_dir(&tmp) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 64 => continue,
            Err(e) => return Err(io(&tmp)(e)),
        }
    }
    match write_checkpoint_into(spec, &tmp, dir, progress) {
        Ok(summary) if !dir.exists() => {
            fs::rename(&tmp, dir).map_err(io(dir))?;
            Ok(summary)
        }
        Ok(_) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(SynthCkptError::Exists(dir.to_path_buf()))
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// Writes the checkpoint's files into `tmp`, an empty directory the
/// caller created and will rename to `dest` (the summary names the files
/// under `dest`). On an error `tmp` holds a partial checkpoint the caller
/// removes.
pub fn write_checkpoint_into(
    spec: &CkptSpec,
    tmp: &Path,
    dest: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<CkptSummary, SynthCkptError> {
    let layout = spec.layout()?;
    let (files, table_bytes) = write_into(spec, &layout, tmp, progress)?;
    Ok(CkptSummary {
        dir: dest.to_path_buf(),
        files: files.iter().map(|f| dest.join(f)).collect(),
        layout,
        table_bytes,
    })
}

/// Dimensions of the tiny model `config.json` describes (transformers
/// builds a model of them; the PLE tables are what pleio reads).
const TINY_HIDDEN: u64 = 64;

/// The config.json text: a `qwen4_exp_text` config (`Qwen4ExpForCausalLM`)
/// that transformers loads, with the table geometry's keys.
fn config_json(spec: &CkptSpec, layout: &CkptLayout) -> String {
    let ids: Vec<u64> = layout.layers.iter().map(|l| l.layer + 1).collect();
    // One more layer than the highest PLE layer: every PLE layer is linear
    // attention (transformers requires it), the last one indexed attention.
    let n_layers = ids.last().copied().unwrap_or(1) + 1;
    let layer_types: Vec<&str> = (0..n_layers)
        .map(|i| {
            if i + 1 == n_layers {
                "indexed_attention"
            } else {
                "linear_attention"
            }
        })
        .collect();
    let mut text = serde_json::json!({
        "architectures": ["Qwen4ExpForCausalLM"],
        "model_type": "qwen4_exp_text",
        "dtype": "bfloat16",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": TINY_HIDDEN,
        "num_hidden_layers": n_layers,
        "layer_types": layer_types,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "hc_count": 2,
        "hc_lowrank": 8,
        // The indexed-attention layer's QSA indexer (transformers needs
        // every field once one layer is indexed).
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 64,
        "indexer_compress_ratio": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": false,
        "eos_token_id": QWEN_EOS,
        "image_token_id": QWEN_IMAGE,
        "ple_layer_ids": ids,
        "ple_embed_dim": QWEN_ROW_ELEMS * 16,
        "ple_conv_kernel_size": 4,
        "ngram_size": QWEN_NGRAM_SIZE,
        "heads_per_ngram": QWEN_HEADS_PER_NGRAM,
        "ngram_vocab_size_base": layout.vocab_base,
        "make_ngram_vocab_size_divisible_by": layout.divisible_by,
        "split_ngram_parts": spec.shards,
        // transformers' strict config takes an int (null is refused).
        "seed": DEFAULT_SEED,
    });
    match spec.encoding {
        CkptEncoding::Fp8 | CkptEncoding::Fp8Row => {
            text["ple_embedding_dtype"] = "float8_e4m3fn".into()
        }
        CkptEncoding::Nvfp4 => text["ple_embedding_dtype"] = "nvfp4".into(),
        CkptEncoding::Mlx4 => {
            text["quantization"] =
                serde_json::json!({"group_size": MLX_GROUP, "bits": 4, "mode": "affine"})
        }
        CkptEncoding::Bf16 => {}
    }
    serde_json::to_string_pretty(&text).expect("JSON values serialize")
}

/// Plans the tensors of each file: every layer's shards spread in order
/// over the files, an unrelated tensor before every third shard and at
/// each file's start, the scales and buffers in the last file.
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
                "model.language_model.layers.{}.pad.{}",
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
    let n_layers = layout.layers.len();
    let total = spec.shards * n_layers;
    for (li, l) in layout.layers.iter().enumerate() {
        for i in 0..spec.shards {
            let f = (li * spec.shards + i) * spec.files / total;
            if i % 3 == 0 || files[f].is_empty() {
                unrelated(&mut files[f], &mut rng);
            }
            for (p, (field, dtype, width)) in enc.parts(n).into_iter().enumerate() {
                files[f].push(Planned {
                    name: enc.shard_name(l.layer, i, field),
                    dtype,
                    shape: vec![l.shard_rows[i], width],
                    source: Source::Part {
                        seed: l.seed,
                        shard: i,
                        part: p,
                    },
                });
            }
            if enc == CkptEncoding::Nvfp4 && !spec.nvfp4_table_scale {
                files[f].push(Planned {
                    name: enc.shard_name(l.layer, i, "weight_scale_2"),
                    dtype: Dtype::F32,
                    shape: vec![],
                    source: Source::Bytes(NVFP4_GLOBAL.to_le_bytes().to_vec()),
                });
            }
        }
    }
    let last = files.last_mut().expect("files >= 1");
    unrelated(last, &mut rng);
    for l in &layout.layers {
        let prefix = enc.prefix(l.layer);
        if enc == CkptEncoding::Nvfp4 && spec.nvfp4_table_scale {
            last.push(Planned {
                name: format!("{prefix}ngram_embedding.weight_scale_2"),
                dtype: Dtype::F32,
                shape: vec![],
                source: Source::Bytes(NVFP4_GLOBAL.to_le_bytes().to_vec()),
            });
        }
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
        for (name, vals) in [
            ("layer_multipliers", &l.multipliers),
            ("ngram_heads_vocab_sizes", &l.heads.sizes),
            ("ngram_heads_offsets", &l.heads.offsets),
        ] {
            last.push(Planned {
                name: format!("{prefix}{name}"),
                dtype: Dtype::I64,
                shape: vec![vals.len() as u64],
                source: Source::Bytes(i64_bytes(vals)),
            });
        }
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
                Source::Part { seed, shard, part } => {
                    let bytes = t.shape.iter().product::<u64>() * t.dtype.size().unwrap_or(1);
                    if spec.sparse {
                        w.skip_tensor_data(bytes).map_err(|e| e.in_file(&path))?;
                    } else {
                        let row_bytes = bytes / t.shape[0].max(1);
                        let chunk = (CHUNK_BYTES as u64 / row_bytes.max(1)).max(1) * row_bytes;
                        let mut rng = part_rng(*seed, *shard, *part);
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
