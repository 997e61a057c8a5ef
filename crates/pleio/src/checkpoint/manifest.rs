//! mlx-vlm's `ple-store.json` (manifest version 2, layout
//! `safetensors_ranges`): absolute byte ranges of each shard's `weight`,
//! `scales` and `biases` inside the checkpoint's safetensors files.
//!
//! ```json
//! {"version": 2, "layout": "safetensors_ranges", "source_root": "DIR",
//!  "row_width": 160, "row_count": N,
//!  "quantization": {"bits": 4, "group_size": 32, "mode": "affine"},
//!  "shards": [{"row_start": 0, "row_count": R,
//!              "weight": {"file": "model-00001-of-00004.safetensors",
//!                         "offset": 12345, "dtype": "uint32", "shape": [R, 20]},
//!              "scales": {...}, "biases": {...}}, ...]}
//! ```
//!
//! `source_root` (default: the manifest's directory; relative to it when
//! relative) is joined to each `file`, which must be a relative path of
//! plain components (no `..`, not absolute) naming a regular file: a
//! manifest reads nothing outside its `source_root`, and a FIFO or device
//! is refused without blocking. Every range is checked against its
//! file's size, every shape and dtype against the encoding, and the shards
//! must tile `0..row_count` in order. `quantization` null means unquantized
//! rows (`weight` only, BF16/F16/F32). The other layout, `interleaved_q4`
//! (one 100-byte record per row), is refused as unsupported.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::discover::{check_config, read_config};
use super::{
    CheckpointError, CheckpointTable, NgramBuffers, Shard, ShardPart, TableKind, TableSource,
};
use crate::quant::encoding::{Encoding, MLX_GROUP};
use crate::safetensors::Dtype;

/// The manifest's file name.
pub const PLE_STORE_FILE_NAME: &str = "ple-store.json";
/// Largest manifest read.
const MAX_MANIFEST_LEN: u64 = 64 << 20;

#[derive(Deserialize)]
struct Manifest {
    version: u64,
    layout: String,
    #[serde(default)]
    source_root: Option<String>,
    row_width: u64,
    row_count: u64,
    #[serde(default)]
    quantization: Option<Quantization>,
    shards: Vec<ManifestShard>,
}

#[derive(Deserialize)]
struct Quantization {
    bits: u64,
    group_size: u64,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Deserialize)]
struct ManifestShard {
    row_start: u64,
    row_count: u64,
    weight: Region,
    #[serde(default)]
    scales: Option<Region>,
    #[serde(default)]
    biases: Option<Region>,
}

#[derive(Deserialize)]
struct Region {
    file: String,
    offset: u64,
    dtype: String,
    shape: Vec<u64>,
}

/// A dtype as the manifest spells it (safetensors or NumPy/MLX names).
fn dtype(name: &str) -> Option<Dtype> {
    Dtype::from_name(name).or(match name {
        "uint8" => Some(Dtype::U8),
        "uint32" => Some(Dtype::U32),
        "bfloat16" => Some(Dtype::BF16),
        "float16" => Some(Dtype::F16),
        "float32" => Some(Dtype::F32),
        _ => None,
    })
}

pub(super) fn open(path: &Path, want: Option<u64>) -> Result<CheckpointTable, CheckpointError> {
    let fail = |message: String| CheckpointError::Manifest {
        path: path.to_path_buf(),
        message,
    };
    let bytes = crate::safetensors::read_bounded(path, MAX_MANIFEST_LEN).map_err(|source| {
        CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        }
    })?;
    let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string()))?;
    if m.version != 2 {
        return Err(fail(format!("version {} (only 2 is read)", m.version)));
    }
    if m.layout != "safetensors_ranges" {
        return Err(CheckpointError::Unsupported {
            what: format!("ple-store layout {:?} (only safetensors_ranges)", m.layout),
        });
    }
    let here = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let root = match &m.source_root {
        Some(r) => here.join(r),
        None => here.clone(),
    };
    let encoding = match &m.quantization {
        None => None,
        Some(q) if q.bits == 4 && q.group_size == MLX_GROUP as u64 => {
            if q.mode.as_deref().is_some_and(|m| m != "affine") {
                return Err(CheckpointError::Unsupported {
                    what: format!("ple-store quantization mode {:?}", q.mode),
                });
            }
            Some(Encoding::Mlx4)
        }
        Some(q) => {
            return Err(CheckpointError::Unsupported {
                what: format!(
                    "ple-store quantization of {} bits in groups of {} (only 4-bit, group 32)",
                    q.bits, q.group_size
                ),
            })
        }
    };
    let n = m.row_width;
    if m.shards.is_empty() {
        return Err(fail("no shards".into()));
    }
    // The unquantized encoding follows the first weight's dtype.
    let encoding = match encoding {
        Some(e) => e,
        None => match dtype(&m.shards[0].weight.dtype) {
            Some(Dtype::BF16) => Encoding::Bf16,
            Some(Dtype::F16) => Encoding::F16,
            Some(Dtype::F32) => Encoding::F32,
            _ => {
                return Err(fail(format!(
                    "unquantized weight dtype {:?}",
                    m.shards[0].weight.dtype
                )))
            }
        },
    };
    if n == 0 || !n.is_multiple_of(encoding.group() as u64) {
        return Err(fail(format!(
            "row_width {n} is not whole groups of {}",
            encoding.group()
        )));
    }
    // (field, dtype, width) of each part.
    let parts: Vec<(&str, Dtype, u64)> = match encoding {
        Encoding::Mlx4 => vec![
            ("weight", Dtype::U32, n / 8),
            ("scales", Dtype::BF16, n / MLX_GROUP as u64),
            ("biases", Dtype::BF16, n / MLX_GROUP as u64),
        ],
        Encoding::Bf16 => vec![("weight", Dtype::BF16, n)],
        Encoding::F16 => vec![("weight", Dtype::F16, n)],
        _ => vec![("weight", Dtype::F32, n)],
    };
    let mut files: Vec<PathBuf> = Vec::new();
    let mut sizes: HashMap<PathBuf, (usize, u64)> = HashMap::new();
    let mut shards = Vec::with_capacity(m.shards.len());
    let mut next_row = 0u64;
    for (i, s) in m.shards.iter().enumerate() {
        if s.row_start != next_row {
            return Err(fail(format!(
                "shard {i} starts at row {}, expected {next_row}",
                s.row_start
            )));
        }
        let mut sp = Vec::with_capacity(parts.len());
        for &(field, want_dtype, width) in &parts {
            let r = match field {
                "weight" => Some(&s.weight),
                "scales" => s.scales.as_ref(),
                _ => s.biases.as_ref(),
            }
            .ok_or_else(|| fail(format!("shard {i} has no {field}")))?;
            let what = || format!("shard {i} {field}");
            if dtype(&r.dtype) != Some(want_dtype) || r.shape != [s.row_count, width] {
                return Err(fail(format!(
                    "{}: {} {:?}, expected {want_dtype} [{}, {width}]",
                    what(),
                    r.dtype,
                    r.shape,
                    s.row_count
                )));
            }
            let row_bytes = want_dtype
                .size()
                .and_then(|s| width.checked_mul(s))
                .filter(|&b| b > 0 && usize::try_from(b).is_ok())
                .ok_or_else(|| {
                    fail(format!(
                        "{}: rows of {width} {want_dtype} elements overflow",
                        what()
                    ))
                })?;
            if !crate::safetensors::is_plain_relative(&r.file) {
                return Err(fail(format!(
                    "{}: file {:?} is not a relative path inside source_root {}",
                    what(),
                    r.file,
                    root.display()
                )));
            }
            let file = root.join(&r.file);
            let (id, size) = match sizes.get(&file) {
                Some(&v) => v,
                None => {
                    let io = |source| CheckpointError::Io {
                        path: file.clone(),
                        source,
                    };
                    let len = crate::sys::open_regular(&file)
                        .and_then(|f| f.metadata())
                        .map_err(io)?
                        .len();
                    files.push(file.clone());
                    sizes.insert(file.clone(), (files.len() - 1, len));
                    (files.len() - 1, len)
                }
            };
            let end = s
                .row_count
                .checked_mul(row_bytes)
                .and_then(|b| b.checked_add(r.offset));
            if end.is_none_or(|e| e > size) {
                return Err(fail(format!(
                    "{}: bytes {}..{} run past the end of {} ({size} bytes)",
                    what(),
                    r.offset,
                    end.map_or("overflow".to_string(), |e| e.to_string()),
                    file.display()
                )));
            }
            sp.push(ShardPart {
                tensor: format!("{PLE_STORE_FILE_NAME}:shards[{i}].{field}"),
                file: id,
                offset: r.offset,
                row_bytes,
            });
        }
        shards.push(Shard {
            index: i,
            row_start: s.row_start,
            rows: s.row_count,
            parts: sp,
        });
        next_row = next_row
            .checked_add(s.row_count)
            .ok_or_else(|| fail("row counts overflow".into()))?;
    }
    if next_row != m.row_count {
        return Err(fail(format!(
            "shards hold {next_row} rows, row_count is {}",
            m.row_count
        )));
    }
    let config = read_config(&root)?;
    // The manifest names no tensors: its layer is the config's one PLE
    // layer, if it lists exactly one.
    let layer = super::discover::layer_from_config(config.as_ref().map(|c| &c.1));
    let ple_layers: Vec<u64> = layer.into_iter().collect();
    super::discover::choose_layer(want, &ple_layers)?;
    let table = CheckpointTable {
        layer,
        ple_layers,
        kind: TableKind::QwenNgram,
        source: TableSource::PleStore,
        files,
        rows: m.row_count,
        row_elems: n,
        encoding,
        shards,
        prefix: String::new(),
        config_path: config.as_ref().map(|c| c.0.clone()),
        config: config.map(|c| c.1),
        buffers: NgramBuffers::default(),
    };
    check_config(&table, table.shards.len())?;
    Ok(table)
}
