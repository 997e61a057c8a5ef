//! PLE tables inside safetensors checkpoints: finding them, describing
//! their rows, and mapping a row id to the file regions that hold it.
//!
//! [`CheckpointTable::open`] takes a checkpoint directory, its
//! `model.safetensors.index.json`, one `.safetensors` file, or an mlx-vlm
//! `ple-store.json` manifest, and finds:
//!
//! - the qwen4exp n-gram table of one decoder layer (a checkpoint holds one
//!   per PLE layer, each under its `…layers.{N}.` prefix;
//!   [`CheckpointTable::open_layer`] picks one, the lowest by default; see
//!   `docs/layers.md`): the row shards
//!   `…ple_embedding.ngram_embedding.shard_{i}.weight` (Hugging Face) or
//!   `…ngram_embedding.shards.{i}.weight` / `.scales` / `.biases` (MLX), in
//!   shard order `0..N` (`N` = `split_ngram_parts` from `config.json`, else
//!   the shards found), wherever they sit among other tensors and files,
//!   with their scale tensors (`ngram_embedding.weight_scale`,
//!   `shard_{i}.weight_scale`, `shard_{i}.weight_scale_2`) and the I64
//!   buffers `layer_multipliers`, `ngram_heads_vocab_sizes`,
//!   `ngram_heads_offsets` checked against the config;
//! - or Gemma 4's `…embed_tokens_per_layer.weight` (row = token id).
//!
//! The result describes rows (`rows`, `row_elems`, [`Encoding`]) and holds
//! an extent table: [`CheckpointTable::row_extents`] gives, for a global
//! row id, the (file, absolute offset, length) of each of its one to three
//! parts (MLX 4-bit: words, scales, biases). Offsets are whatever the files
//! give: not page- or block-aligned, and a row may straddle a page.

use std::path::PathBuf;

use crate::error::{Error, ErrorKind};
use crate::ngram::{NgramError, QwenNgramParams};
use crate::quant::encoding::{Encoding, EncodingDecoder, EncodingError};
use crate::safetensors::{Dtype, SafetensorsError};

pub mod config;
mod discover;
mod manifest;

pub use crate::layout::{Extent, RowExtents, Shard, ShardPart};
use crate::layout::{Layout, TableError};
pub use config::{ConfigError, NgramConfig};
pub use manifest::PLE_STORE_FILE_NAME;

/// The file name of a checkpoint's config.
pub const CONFIG_FILE_NAME: &str = "config.json";

/// True for a path [`crate::Table::open`] reads as a safetensors
/// checkpoint: a directory, or a `.json` (index, manifest) or
/// `.safetensors` file. A `.gguf` path never is (a directory of that name
/// is reported as one by the GGUF reader).
pub fn is_checkpoint_path(path: &std::path::Path) -> bool {
    let ext = |x: &str| path.extension().is_some_and(|e| e.eq_ignore_ascii_case(x));
    !ext("gguf") && (path.is_dir() || ext("json") || ext("safetensors"))
}

/// Which model's table this is, and so how token ids become row ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableKind {
    /// qwen4exp n-gram table: 16 hashed rows per token.
    QwenNgram,
    /// Gemma 4 `embed_tokens_per_layer`: row = token id.
    Gemma4,
}

/// Where the description came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSource {
    /// safetensors headers (a directory, an index or one file).
    Safetensors,
    /// An mlx-vlm `ple-store.json` manifest (version 2,
    /// `safetensors_ranges`).
    PleStore,
}

/// The n-gram buffers a checkpoint carries beside its table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NgramBuffers {
    /// `layer_multipliers`.
    pub layer_multipliers: Option<Vec<u64>>,
    /// `ngram_heads_vocab_sizes`.
    pub head_vocab_sizes: Option<Vec<u64>>,
    /// `ngram_heads_offsets`.
    pub head_offsets: Option<Vec<u64>>,
}

/// A PLE table found in a checkpoint.
#[derive(Debug, Clone)]
pub struct CheckpointTable {
    /// Which model's table.
    pub kind: TableKind,
    /// Where the description came from.
    pub source: TableSource,
    /// The files holding its rows (only those).
    pub files: Vec<PathBuf>,
    /// Rows.
    pub rows: u64,
    /// Elements per row.
    pub row_elems: u64,
    /// How each row is stored.
    pub encoding: Encoding,
    /// The shards in row order; they tile `0..rows`.
    pub shards: Vec<Shard>,
    /// The tensor-name prefix of the table (e.g.
    /// `model.language_model.layers.1.ple.ple_embedding.`).
    pub prefix: String,
    /// The `config.json` read, if any.
    pub config_path: Option<PathBuf>,
    /// The n-gram keys of `config.json`, when found (qwen4exp).
    pub config: Option<NgramConfig>,
    /// The n-gram buffers of the table's layer, when present (checked
    /// against the config at open).
    pub buffers: NgramBuffers,
    /// The decoder layer (0-based, `model.model.layers[layer]`) whose PLE
    /// table this is, from the `layers.N.` of its prefix (or the config's
    /// one `ple_layer_ids` entry); `None` when unknown (Gemma 4, whose one
    /// table serves every layer).
    pub layer: Option<u64>,
    /// Every decoder layer of the checkpoint holding a PLE table, sorted
    /// (0-based).
    pub ple_layers: Vec<u64>,
}

/// Everything that can go wrong finding a table in a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A safetensors file or index is malformed (names the file).
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    /// An operating-system error on a file.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `config.json` is malformed.
    #[error("{}: {source}", .path.display())]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: ConfigError,
    },
    /// A `ple-store.json` manifest is malformed or does not fit its files.
    #[error("{}: {message}", .path.display())]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The path is not a directory, index, `.safetensors` file or manifest.
    #[error("{}: not a checkpoint directory, model.safetensors.index.json, .safetensors file or ple-store.json", .path.display())]
    NotACheckpoint {
        /// The path.
        path: PathBuf,
    },
    /// No PLE table in the checkpoint.
    #[error("{}: no PLE table (no …ngram_embedding.shard_N / shards.N tensors and no …embed_tokens_per_layer.weight)", .path.display())]
    NoTable {
        /// The checkpoint path.
        path: PathBuf,
    },
    /// No PLE table on the decoder layer asked for.
    #[error("no PLE table on decoder layer {layer} (0-based); {}", layers_text(.layers))]
    NoSuchLayer {
        /// The layer asked for.
        layer: u64,
        /// The layers holding one (sorted; may be empty).
        layers: Vec<u64>,
    },
    /// The table's layer is not among the config's `ple_layer_ids`.
    #[error("the PLE table of decoder layer {layer} (0-based, id {}) is not in config.json's ple_layer_ids {ids:?} (1-based)", .layer.saturating_add(1))]
    LayerNotInConfig {
        /// The table's decoder layer.
        layer: u64,
        /// `ple_layer_ids`.
        ids: Vec<u64>,
    },
    /// Two candidate tables where one is expected: two n-gram tables of
    /// the same decoder layer (or naming no layer), or two Gemma tables.
    #[error("two PLE tables where one is expected (the same decoder layer, or no layer in their names): `{first}` and `{second}`")]
    AmbiguousTable {
        /// One tensor (prefix).
        first: String,
        /// Another.
        second: String,
    },
    /// The index maps a tensor to a file whose header lacks it.
    #[error("the index maps `{tensor}` to {}, whose header has no such tensor", .file.display())]
    NotInFile {
        /// The tensor.
        tensor: String,
        /// The file.
        file: PathBuf,
    },
    /// A tensor in two files.
    #[error("tensor `{tensor}` is in both {} and {}", .first.display(), .second.display())]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// One file.
        first: PathBuf,
        /// Another.
        second: PathBuf,
    },
    /// A shard of `0..count` is missing.
    #[error("shard {index} of {count} is missing: no tensor `{expected}`")]
    MissingShard {
        /// Its number.
        index: usize,
        /// Shards expected.
        count: usize,
        /// The tensor name expected.
        expected: String,
    },
    /// A shard numbered at or beyond the count.
    #[error("tensor `{tensor}`: shard {index} is beyond the {count} shards of split_ngram_parts")]
    ExtraShard {
        /// The tensor.
        tensor: String,
        /// Its number.
        index: usize,
        /// Shards expected.
        count: usize,
    },
    /// A shard part missing (e.g. MLX scales, NVFP4 block scales).
    #[error("shard {index}: tensor `{expected}` is missing")]
    MissingPart {
        /// Shard number.
        index: usize,
        /// The tensor name expected.
        expected: String,
    },
    /// Shards of different widths or dtypes.
    #[error("tensor `{tensor}`: {what} {found}, but shard 0 (`{first}`) has {expected}")]
    ShardMismatch {
        /// The odd tensor.
        tensor: String,
        /// What differs (`width`, `dtype`).
        what: &'static str,
        /// Its value.
        found: String,
        /// The first shard's tensor.
        first: String,
        /// The first shard's value.
        expected: String,
    },
    /// A tensor's dtype or shape is not what its role needs.
    #[error("tensor `{tensor}`: {dtype} {shape:?}, expected {expected}")]
    BadTensor {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<u64>,
        /// What it must be.
        expected: String,
    },
    /// FP8 weights without any scale tensor.
    #[error("FP8 table `{prefix}` has no scale: neither `{prefix}ngram_embedding.weight_scale` nor per-shard `weight_scale` tensors")]
    MissingScale {
        /// The table prefix.
        prefix: String,
    },
    /// NVFP4 weights without a global scale.
    #[error("NVFP4 table `{prefix}` has no global scale: neither `{prefix}ngram_embedding.weight_scale_2` nor per-shard `weight_scale_2` tensors")]
    MissingGlobalScale {
        /// The table prefix.
        prefix: String,
    },
    /// Per-shard scalars (NVFP4 `weight_scale_2`, or FP8 per-shard scales)
    /// that differ.
    #[error("tensor `{tensor}` = {value:e} differs from `{first}` = {first_value:e}: one global scale is required")]
    ScaleMismatch {
        /// The odd tensor.
        tensor: String,
        /// Its value.
        value: f32,
        /// The first shard's tensor.
        first: String,
        /// Its value.
        first_value: f32,
    },
    /// A layout pleio does not decode.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What.
        what: String,
    },
    /// A checkpoint buffer disagrees with `config.json`.
    #[error("tensor `{tensor}` holds {found:?}, but config.json gives {expected:?}")]
    BufferMismatch {
        /// The buffer tensor.
        tensor: String,
        /// Its values.
        found: Vec<u64>,
        /// The values derived from the config.
        expected: Vec<u64>,
    },
    /// The table's row count or shard count disagrees with `config.json`.
    #[error("the table has {found} {what}, but config.json gives {expected}")]
    ConfigMismatch {
        /// `rows` or `shards`.
        what: &'static str,
        /// In the checkpoint.
        found: u64,
        /// From the config.
        expected: u64,
    },
    /// The n-gram parameters need a `config.json` the checkpoint lacks.
    #[error("no config.json holding `ngram_size` beside the checkpoint (none, or a config without the n-gram keys): the n-gram parameters (eos_token_id, ...) are unknown")]
    NoConfig,
    /// The derived n-gram parameters do not fit the table.
    #[error(transparent)]
    Ngram(#[from] NgramError),
    /// A row id outside the table.
    #[error("row {row} is outside the table of {rows} rows")]
    RowOutOfRange {
        /// The row.
        row: u64,
        /// Rows in the table.
        rows: u64,
    },
    /// The row width does not suit the encoding.
    #[error(transparent)]
    Encoding(#[from] EncodingError),
}

/// `PLE layers: [0, 2]`, or that none are known.
pub(crate) fn layers_text(layers: &[u64]) -> String {
    if layers.is_empty() {
        "the file names no PLE layer".to_owned()
    } else {
        format!("PLE layers (0-based): {layers:?}")
    }
}

impl CheckpointTable {
    /// Finds the PLE table of the checkpoint at `path` (a directory, an
    /// index, a `.safetensors` file or a `ple-store.json`), reading only
    /// headers, the config and the small scale and buffer tensors.
    pub fn open(path: &std::path::Path) -> Result<CheckpointTable, CheckpointError> {
        discover::open(path, None)
    }

    /// [`CheckpointTable::open`] for the PLE table of decoder layer `layer`
    /// (0-based, `model.model.layers[layer]`; `None`: the lowest PLE
    /// layer's table). A layer without a table is
    /// [`CheckpointError::NoSuchLayer`], naming the layers that have one.
    pub fn open_layer(
        path: &std::path::Path,
        layer: Option<u64>,
    ) -> Result<CheckpointTable, CheckpointError> {
        discover::open(path, layer)
    }

    /// The PLE layer index of this table (its position among the PLE
    /// layers: in `config.json`'s `ple_layer_ids`, else among the layers
    /// found), which seeds its multipliers and picks its head primes; 0
    /// when the layer is unknown.
    pub fn ple_layer_index(&self) -> Result<u64, CheckpointError> {
        let Some(layer) = self.layer else {
            return Ok(0);
        };
        match &self.config {
            Some(c) => c.ple_layer_index(layer, &self.ple_layers).ok_or_else(|| {
                CheckpointError::LayerNotInConfig {
                    layer,
                    ids: c.ple_layer_ids.clone().unwrap_or_default(),
                }
            }),
            None => Ok(self
                .ple_layers
                .iter()
                .position(|&l| l == layer)
                .map_or(0, |p| p as u64)),
        }
    }

    /// Bytes of a row, all parts together.
    pub fn row_bytes(&self) -> u64 {
        self.shards
            .first()
            .map_or(0, |s| s.parts.iter().map(|p| p.row_bytes).sum())
    }

    /// The shard holding `row` and the row's index inside it.
    pub fn shard_of(&self, row: u64) -> Option<(usize, u64)> {
        if row >= self.rows {
            return None;
        }
        let i = self.shards.partition_point(|s| s.row_start <= row) - 1;
        Some((i, row - self.shards[i].row_start))
    }

    /// The file regions of `row`, one per part.
    pub fn row_extents(&self, row: u64) -> Result<RowExtents, CheckpointError> {
        crate::layout::extents_in(&self.shards, row)
            .filter(|_| row < self.rows)
            .ok_or(CheckpointError::RowOutOfRange {
                row,
                rows: self.rows,
            })
    }

    /// A decoder for this table's rows.
    pub fn decoder(&self) -> Result<EncodingDecoder, CheckpointError> {
        let n = usize::try_from(self.row_elems).map_err(|_| CheckpointError::Unsupported {
            what: format!("rows of {} elements", self.row_elems),
        })?;
        Ok(EncodingDecoder::new(self.encoding, n)?)
    }

    /// The qwen4exp n-gram hash parameters from `config.json` (whose
    /// buffers, if any, were checked to agree at open).
    pub fn ngram_params(&self) -> Result<QwenNgramParams, CheckpointError> {
        let c = self.config.as_ref().ok_or(CheckpointError::NoConfig)?;
        let index = self.ple_layer_index()?;
        c.params(index, self.rows).map_err(|e| match e {
            config::CheckedParamsError::Config(source) => CheckpointError::Config {
                path: self
                    .config_path
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(CONFIG_FILE_NAME)),
                source,
            },
            config::CheckedParamsError::Ngram(e) => CheckpointError::Ngram(e),
        })
    }
}

// The checkpoint builds its layout: `layout` knows no file format.
impl Layout {
    /// The layout of a checkpoint's PLE table: its shards and parts as
    /// found (and checked against the files) by [`CheckpointTable::open`].
    pub fn of_checkpoint(t: &CheckpointTable) -> Result<Layout, TableError> {
        let name = match t.kind {
            TableKind::Gemma4 => t
                .shards
                .first()
                .and_then(|s| s.parts.first())
                .map_or_else(|| t.prefix.clone(), |p| p.tensor.clone()),
            TableKind::QwenNgram => format!("{}ngram_embedding", t.prefix),
        };
        Layout::encoded(
            name,
            t.encoding,
            t.row_elems,
            t.rows,
            t.row_bytes(),
            t.shards.clone(),
        )
    }
}

impl From<CheckpointError> for Error {
    fn from(e: CheckpointError) -> Error {
        let kind = match &e {
            CheckpointError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                ErrorKind::NotFound
            }
            CheckpointError::Io { .. } => ErrorKind::Io,
            CheckpointError::Safetensors(SafetensorsError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                ErrorKind::NotFound
            }
            CheckpointError::Safetensors(SafetensorsError::Io { .. }) => ErrorKind::Io,
            CheckpointError::NoTable { .. } | CheckpointError::NoSuchLayer { .. } => {
                ErrorKind::NoTable
            }
            CheckpointError::Unsupported { .. } | CheckpointError::Encoding(_) => {
                ErrorKind::Unsupported
            }
            CheckpointError::Config { .. }
            | CheckpointError::BufferMismatch { .. }
            | CheckpointError::NoConfig
            | CheckpointError::Ngram(_) => ErrorKind::RowIds,
            CheckpointError::RowOutOfRange { .. } => ErrorKind::RowOutOfRange,
            _ => ErrorKind::InvalidFile,
        };
        let row = match &e {
            CheckpointError::RowOutOfRange { row, .. } => Some(*row),
            _ => None,
        };
        Error::new(kind, e).at(row, None, None)
    }
}
