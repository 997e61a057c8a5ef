//! Finding the PLE table among a checkpoint's tensors.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::config::{ConfigError, NgramConfig};
use super::{
    manifest, CheckpointError, CheckpointTable, NgramBuffers, Shard, ShardPart, TableKind,
    TableSource, CONFIG_FILE_NAME,
};
use crate::quant::encoding::{Encoding, Fp8Scale, ScaleType, MLX_GROUP, NVFP4_BLOCK};
use crate::safetensors::{Dtype, SafetensorsFile, TensorInfo, WeightIndex, INDEX_FILE_NAME};

/// Largest scale or buffer tensor read into memory.
const MAX_SMALL_TENSOR: u64 = 1 << 20;
/// Largest `config.json` read.
const MAX_CONFIG_LEN: u64 = 16 << 20;
/// The table's name stem.
const NGRAM: &str = "ngram_embedding.";
/// Gemma 4's table name suffix.
const GEMMA_SUFFIX: &str = "embed_tokens_per_layer.weight";

/// The tensors of a checkpoint: which file holds each, and the headers
/// read so far.
struct Catalog {
    dir: PathBuf,
    files: Vec<PathBuf>,
    headers: Vec<Option<SafetensorsFile>>,
    names: HashMap<String, usize>,
    /// Headers come from an index (checked lazily) rather than a scan.
    from_index: bool,
}

impl Catalog {
    /// From an index: names from its weight map, headers read on demand.
    fn from_index(index_path: &Path) -> Result<Catalog, CheckpointError> {
        let (files, names) = WeightIndex::open(index_path)?.into_parts();
        let dir = parent(index_path);
        let files: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        Ok(Catalog {
            dir,
            headers: vec![None; files.len()],
            files,
            names,
            from_index: true,
        })
    }

    /// From safetensors files: every header read now.
    fn from_files(dir: PathBuf, files: Vec<PathBuf>) -> Result<Catalog, CheckpointError> {
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut headers = Vec::with_capacity(files.len());
        for (i, f) in files.iter().enumerate() {
            let h = SafetensorsFile::open(f)?;
            for t in h.tensors() {
                if let Some(&prev) = names.get(&t.name) {
                    return Err(CheckpointError::DuplicateTensor {
                        tensor: t.name.clone(),
                        first: files[prev].clone(),
                        second: f.clone(),
                    });
                }
                names.insert(t.name.clone(), i);
            }
            headers.push(Some(h));
        }
        Ok(Catalog {
            dir,
            files,
            headers,
            names,
            from_index: false,
        })
    }

    /// The header of file `i`, read on first use.
    fn header(&mut self, i: usize) -> Result<&SafetensorsFile, CheckpointError> {
        if self.headers[i].is_none() {
            self.headers[i] = Some(SafetensorsFile::open(&self.files[i])?);
        }
        Ok(self.headers[i].as_ref().expect("just read"))
    }

    /// A tensor's info and file, if the checkpoint has it.
    fn get(&mut self, name: &str) -> Result<Option<(usize, TensorInfo)>, CheckpointError> {
        let Some(&f) = self.names.get(name) else {
            return Ok(None);
        };
        let from_index = self.from_index;
        let path = self.files[f].clone();
        match self.header(f)?.tensor(name) {
            Some(t) => Ok(Some((f, t.clone()))),
            None if from_index => Err(CheckpointError::NotInFile {
                tensor: name.to_owned(),
                file: path,
            }),
            None => Ok(None),
        }
    }

    /// A tensor the caller knows exists.
    fn need(&mut self, name: &str, shard: usize) -> Result<(usize, TensorInfo), CheckpointError> {
        self.get(name)?.ok_or_else(|| CheckpointError::MissingPart {
            index: shard,
            expected: name.to_owned(),
        })
    }

    /// The absolute offset of a tensor's data.
    fn offset(&mut self, file: usize, t: &TensorInfo) -> Result<u64, CheckpointError> {
        Ok(self.header(file)?.tensor_range(t).start)
    }

    /// Reads a small tensor's bytes.
    fn read_small(&mut self, file: usize, t: &TensorInfo) -> Result<Vec<u8>, CheckpointError> {
        let path = self.files[file].clone();
        let mut f = crate::sys::open_regular(&path).map_err(|source| CheckpointError::Io {
            path: path.clone(),
            source,
        })?;
        let h = self.header(file)?;
        h.read_tensor(&mut f, t, MAX_SMALL_TENSOR)
            .map_err(|e| e.in_file(&path).into())
    }
}

fn parent(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The entry point of [`CheckpointTable::open_layer`]: the table of decoder
/// layer `layer` (`None`: the lowest PLE layer's).
pub(super) fn open(path: &Path, layer: Option<u64>) -> Result<CheckpointTable, CheckpointError> {
    let meta = std::fs::metadata(path).map_err(io_err(path))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let catalog = if meta.is_dir() {
        let index = path.join(INDEX_FILE_NAME);
        if index.is_file() {
            Catalog::from_index(&index)?
        } else {
            let mut files = Vec::new();
            for e in std::fs::read_dir(path).map_err(io_err(path))? {
                let p = e.map_err(io_err(path))?.path();
                if p.extension().is_some_and(|x| x == "safetensors") && p.is_file() {
                    files.push(p);
                }
            }
            files.sort();
            if files.is_empty() {
                let store = path.join(manifest::PLE_STORE_FILE_NAME);
                if store.is_file() {
                    return manifest::open(&store, layer);
                }
                return Err(CheckpointError::NotACheckpoint {
                    path: path.to_path_buf(),
                });
            }
            Catalog::from_files(path.to_path_buf(), files)?
        }
    } else if name.ends_with(".safetensors") {
        Catalog::from_files(parent(path), vec![path.to_path_buf()])?
    } else if name == manifest::PLE_STORE_FILE_NAME {
        return manifest::open(path, layer);
    } else if name.ends_with(".json") {
        Catalog::from_index(path)?
    } else {
        return Err(CheckpointError::NotACheckpoint {
            path: path.to_path_buf(),
        });
    };
    let config = read_config(&catalog.dir)?;
    find_table(catalog, config, path, layer)
}

/// The decoder layer `N` of a table prefix holding `layers.N.` (the last
/// such component: `model.language_model.layers.1.ple.ple_embedding.` is
/// layer 1), if any.
pub(super) fn layer_of_prefix(prefix: &str) -> Option<u64> {
    let mut found = None;
    let mut rest = prefix;
    while let Some(pos) = rest.find("layers.") {
        let at_component = pos == 0 || rest.as_bytes()[pos - 1] == b'.';
        let after = &rest[pos + "layers.".len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if at_component && digits > 0 && digits <= 9 && after.as_bytes().get(digits) == Some(&b'.')
        {
            found = after[..digits].parse().ok();
        }
        rest = after;
    }
    found
}

/// The decoder layer of a table whose tensor names do not say (a
/// manifest, an odd prefix): the config's one PLE layer, if it lists
/// exactly one.
pub(super) fn layer_from_config(config: Option<&NgramConfig>) -> Option<u64> {
    match config.and_then(|c| c.ple_layer_ids.as_deref()) {
        Some(&[id]) => id.checked_sub(1),
        _ => None,
    }
}

/// Picks the table of `want` among the PLE layers `layers` (sorted):
/// `None` takes the lowest.
pub(super) fn choose_layer(
    want: Option<u64>,
    layers: &[u64],
) -> Result<Option<u64>, CheckpointError> {
    match want {
        None => Ok(layers.first().copied()),
        Some(l) if layers.contains(&l) => Ok(Some(l)),
        Some(l) => Err(CheckpointError::NoSuchLayer {
            layer: l,
            layers: layers.to_vec(),
        }),
    }
}

/// Reads the n-gram keys of `dir/config.json`; `None` if there is no such
/// file or it has no `ngram_size` (a Gemma or other config).
pub(super) fn read_config(dir: &Path) -> Result<Option<(PathBuf, NgramConfig)>, CheckpointError> {
    let path = dir.join(CONFIG_FILE_NAME);
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = crate::safetensors::read_bounded(&path, MAX_CONFIG_LEN).map_err(io_err(&path))?;
    let has_ngram = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .is_some_and(|v| {
            v.get("ngram_size").is_some()
                || v.get("text_config")
                    .and_then(|t| t.get("ngram_size"))
                    .is_some()
        });
    if !has_ngram {
        // Not JSON at all is still an error worth reporting.
        if serde_json::from_slice::<serde_json::Value>(&bytes).is_err() {
            return Err(CheckpointError::Config {
                source: NgramConfig::from_json(&bytes).expect_err("not JSON"),
                path,
            });
        }
        return Ok(None);
    }
    match NgramConfig::from_json(&bytes) {
        Ok(c) => Ok(Some((path, c))),
        Err(source) => Err(CheckpointError::Config { path, source }),
    }
}

/// How a shard tensor is spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Spelling {
    /// `ngram_embedding.shard_{i}.…`
    Hf,
    /// `ngram_embedding.shards.{i}.…`
    Mlx,
    /// `ngram_embedding.…` (one unsplit table)
    Unsplit,
}

/// The shard tensors of one table prefix: per spelling, shard number ->
/// field names seen (`weight`, `weight_scale`, ...).
type ShardNames = BTreeMap<(String, Spelling), BTreeMap<usize, Vec<String>>>;

/// Splits `name` into (prefix, spelling, shard, field) if it is a shard
/// tensor of an n-gram table.
fn parse_shard_name(name: &str) -> Option<(String, Spelling, usize, String)> {
    let pos = name.rfind(NGRAM)?;
    let (prefix, rest) = (&name[..pos], &name[pos + NGRAM.len()..]);
    let (spelling, rest) = if let Some(r) = rest.strip_prefix("shard_") {
        (Spelling::Hf, r)
    } else if let Some(r) = rest.strip_prefix("shards.") {
        (Spelling::Mlx, r)
    } else {
        // Unsplit: `ngram_embedding.weight` / `.scales` / `.biases`; the
        // table-wide `weight_scale` is not a shard tensor.
        return matches!(rest, "weight" | "scales" | "biases")
            .then(|| (prefix.to_owned(), Spelling::Unsplit, 0, rest.to_owned()));
    };
    let dot = rest.find('.')?;
    let (digits, field) = (&rest[..dot], &rest[dot + 1..]);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 9 {
        return None;
    }
    Some((
        prefix.to_owned(),
        spelling,
        digits.parse().ok()?,
        field.to_owned(),
    ))
}

/// The tensor name of field `field` of shard `i`.
fn shard_tensor(prefix: &str, spelling: Spelling, i: usize, field: &str) -> String {
    match spelling {
        Spelling::Hf => format!("{prefix}{NGRAM}shard_{i}.{field}"),
        Spelling::Mlx => format!("{prefix}{NGRAM}shards.{i}.{field}"),
        Spelling::Unsplit => format!("{prefix}{NGRAM}{field}"),
    }
}

fn find_table(
    mut cat: Catalog,
    config: Option<(PathBuf, NgramConfig)>,
    path: &Path,
    want: Option<u64>,
) -> Result<CheckpointTable, CheckpointError> {
    let mut shards: ShardNames = BTreeMap::new();
    let mut gemma: Vec<String> = Vec::new();
    for name in cat.names.keys() {
        if let Some((prefix, spelling, i, field)) = parse_shard_name(name) {
            shards
                .entry((prefix, spelling))
                .or_default()
                .entry(i)
                .or_default()
                .push(field);
        } else if name.ends_with(GEMMA_SUFFIX) {
            gemma.push(name.clone());
        }
    }
    // Only groups that have a `weight` are tables.
    shards.retain(|_, m| m.values().any(|f| f.iter().any(|f| f == "weight")));
    if !shards.is_empty() {
        // One table per decoder layer: its layer comes from `layers.N.` in
        // the prefix; two tables of one layer (or two without a layer) are
        // ambiguous.
        let mut by_layer: BTreeMap<Option<u64>, (String, Spelling)> = BTreeMap::new();
        for key in shards.keys() {
            let l = layer_of_prefix(&key.0);
            if let Some(prev) = by_layer.get(&l) {
                return Err(CheckpointError::AmbiguousTable {
                    first: format!("{}{NGRAM}…", prev.0),
                    second: format!("{}{NGRAM}…", key.0),
                });
            }
            by_layer.insert(l, key.clone());
        }
        if by_layer.len() > 1 {
            if let Some((_, k)) = by_layer.iter().find(|(l, _)| l.is_none()) {
                let other = by_layer.iter().find(|(l, _)| l.is_some()).expect("two");
                return Err(CheckpointError::AmbiguousTable {
                    first: format!("{}{NGRAM}…", k.0),
                    second: format!("{}{NGRAM}…", other.1 .0),
                });
            }
        }
        let (ple_layers, chosen) = if let Some(key) = by_layer.get(&None) {
            // One table, its prefix naming no layer.
            let l = layer_from_config(config.as_ref().map(|c| &c.1));
            let layers: Vec<u64> = l.into_iter().collect();
            choose_layer(want, &layers)?;
            (layers, key.clone())
        } else {
            let layers: Vec<u64> = by_layer.keys().flatten().copied().collect();
            let l = choose_layer(want, &layers)?;
            (layers, by_layer[&l].clone())
        };
        let found = shards.remove(&chosen).expect("a group");
        return qwen_table(&mut cat, config, chosen.0, chosen.1, found, ple_layers);
    }
    if let Some(l) = want {
        if !gemma.is_empty() {
            return Err(CheckpointError::Unsupported {
                what: format!(
                    "PLE layer {l} of a Gemma 4 checkpoint: its one table `embed_tokens_per_layer` holds every layer in each row (open it without a layer)"
                ),
            });
        }
    }
    gemma.sort();
    match gemma.as_slice() {
        [] => Err(CheckpointError::NoTable {
            path: path.to_path_buf(),
        }),
        [one] => gemma_table(&mut cat, one),
        [a, b, ..] => Err(CheckpointError::AmbiguousTable {
            first: a.clone(),
            second: b.clone(),
        }),
    }
}

fn bad(t: &TensorInfo, expected: impl Into<String>) -> CheckpointError {
    CheckpointError::BadTensor {
        tensor: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        expected: expected.into(),
    }
}

/// `[rows, width]` of a 2-D tensor.
fn matrix(t: &TensorInfo) -> Result<(u64, u64), CheckpointError> {
    match t.shape.as_slice() {
        &[rows, width] => Ok((rows, width)),
        _ => Err(bad(t, "a 2-D [rows, width] tensor")),
    }
}

/// The value of a scalar (shape `[]` or `[1]`) BF16/F16/F32 tensor.
fn scalar_value(cat: &mut Catalog, file: usize, t: &TensorInfo) -> Result<f32, CheckpointError> {
    let ty = scale_type(t.dtype).ok_or_else(|| bad(t, "a BF16, F16 or F32 scalar"))?;
    if t.n_elems() != 1 || t.shape.len() > 1 {
        return Err(bad(t, "a scalar of shape [] or [1]"));
    }
    let bytes = cat.read_small(file, t)?;
    Ok(ty.read(&bytes))
}

fn scale_type(d: Dtype) -> Option<ScaleType> {
    match d {
        Dtype::BF16 => Some(ScaleType::Bf16),
        Dtype::F16 => Some(ScaleType::F16),
        Dtype::F32 => Some(ScaleType::F32),
        _ => None,
    }
}

/// One shard's tensors as found, before the encoding is settled.
struct FoundShard {
    weight: (usize, TensorInfo),
    rows: u64,
}

fn qwen_table(
    cat: &mut Catalog,
    config: Option<(PathBuf, NgramConfig)>,
    prefix: String,
    spelling: Spelling,
    found: BTreeMap<usize, Vec<String>>,
    ple_layers: Vec<u64>,
) -> Result<CheckpointTable, CheckpointError> {
    // The shard count: split_ngram_parts, else what was found.
    let max_found = found.keys().next_back().copied().unwrap_or(0);
    let count = match (
        spelling,
        config.as_ref().and_then(|c| c.1.split_ngram_parts),
    ) {
        (Spelling::Unsplit, _) => 1,
        (_, Some(n)) => usize::try_from(n).unwrap_or(usize::MAX),
        (_, None) => max_found + 1,
    };
    if let Some((&i, fields)) = found.range(count..).next() {
        return Err(CheckpointError::ExtraShard {
            tensor: shard_tensor(&prefix, spelling, i, &fields[0]),
            index: i,
            count,
        });
    }
    // A config may claim more shards than the checkpoint names: the first
    // one missing is the error, before anything is sized by the claim.
    if count > max_found + 1 {
        let i = max_found + 1;
        return Err(CheckpointError::MissingShard {
            index: i,
            count,
            expected: shard_tensor(&prefix, spelling, i, "weight"),
        });
    }
    // Now count <= max_found + 1 <= the number of names: bounded.
    let mut shards = Vec::with_capacity(count);
    for i in 0..count {
        let name = shard_tensor(&prefix, spelling, i, "weight");
        let Some(w) = cat.get(&name)? else {
            return Err(CheckpointError::MissingShard {
                index: i,
                count,
                expected: name,
            });
        };
        let (rows, _) = matrix(&w.1)?;
        shards.push(FoundShard { weight: w, rows });
    }
    // Every shard has shard 0's dtype and width.
    let first = shards[0].weight.1.clone();
    let (_, width) = matrix(&first)?;
    for s in &shards[1..] {
        let t = &s.weight.1;
        if t.dtype != first.dtype {
            return Err(CheckpointError::ShardMismatch {
                tensor: t.name.clone(),
                what: "dtype",
                found: t.dtype.to_string(),
                first: first.name.clone(),
                expected: first.dtype.to_string(),
            });
        }
        let (_, w) = matrix(t)?;
        if w != width {
            return Err(CheckpointError::ShardMismatch {
                tensor: t.name.clone(),
                what: "width",
                found: w.to_string(),
                first: first.name.clone(),
                expected: width.to_string(),
            });
        }
    }
    let (encoding, row_elems) = qwen_encoding(cat, &prefix, spelling, &shards, &first, width)?;
    let parts = encoding_fields(&encoding);
    let mut out_shards = Vec::with_capacity(count);
    let mut files: Vec<PathBuf> = Vec::new();
    let mut file_ids: HashMap<usize, usize> = HashMap::new();
    let mut row_start = 0u64;
    for (i, s) in shards.iter().enumerate() {
        let mut sp = Vec::with_capacity(parts.len());
        for field in &parts {
            let (file, t) = if *field == "weight" {
                s.weight.clone()
            } else {
                cat.need(&shard_tensor(&prefix, spelling, i, field), i)?
            };
            let (rows, width) = matrix(&t)?;
            if rows != s.rows {
                return Err(bad(&t, format!("{} rows like its shard's weight", s.rows)));
            }
            let row_bytes = t.n_bytes().checked_div(rows).unwrap_or(0);
            let want = part_width(&encoding, row_elems, field);
            if width != want.0 || t.dtype != want.1 {
                return Err(bad(&t, format!("{} [{rows}, {}]", want.1, want.0)));
            }
            let offset = cat.offset(file, &t)?;
            let id = *file_ids.entry(file).or_insert_with(|| {
                files.push(cat.files[file].clone());
                files.len() - 1
            });
            sp.push(ShardPart {
                tensor: t.name.clone(),
                file: id,
                offset,
                row_bytes,
            });
        }
        out_shards.push(Shard {
            index: i,
            row_start,
            rows: s.rows,
            parts: sp,
        });
        row_start = row_start
            .checked_add(s.rows)
            .ok_or_else(|| CheckpointError::Unsupported {
                what: "more than 2^64 rows".into(),
            })?;
    }
    let buffers = read_buffers(cat, &prefix)?;
    let layer =
        layer_of_prefix(&prefix).or_else(|| layer_from_config(config.as_ref().map(|c| &c.1)));
    let table = CheckpointTable {
        layer,
        ple_layers,
        kind: TableKind::QwenNgram,
        source: TableSource::Safetensors,
        files,
        rows: row_start,
        row_elems,
        encoding,
        shards: out_shards,
        prefix,
        config_path: config.as_ref().map(|c| c.0.clone()),
        config: config.map(|c| c.1),
        buffers,
    };
    check_config(&table, count)?;
    Ok(table)
}

/// The fields holding each part, in part order.
fn encoding_fields(enc: &Encoding) -> Vec<&'static str> {
    match enc {
        Encoding::Fp8(Fp8Scale::PerRow(_)) | Encoding::Nvfp4 { .. } => {
            vec!["weight", "weight_scale"]
        }
        Encoding::Mlx4 => vec!["weight", "scales", "biases"],
        _ => vec!["weight"],
    }
}

/// Width and dtype each part's tensor must have.
fn part_width(enc: &Encoding, row_elems: u64, field: &str) -> (u64, Dtype) {
    match (enc, field) {
        (Encoding::Bf16, _) => (row_elems, Dtype::BF16),
        (Encoding::F16, _) => (row_elems, Dtype::F16),
        (Encoding::F32, _) => (row_elems, Dtype::F32),
        (Encoding::Fp8(_), "weight") => (row_elems, Dtype::F8_E4M3),
        (Encoding::Fp8(Fp8Scale::PerRow(t)), _) => (
            1,
            match t {
                ScaleType::Bf16 => Dtype::BF16,
                ScaleType::F16 => Dtype::F16,
                ScaleType::F32 => Dtype::F32,
            },
        ),
        (Encoding::Nvfp4 { .. }, "weight") => (row_elems / 2, Dtype::U8),
        (Encoding::Nvfp4 { .. }, _) => (row_elems / NVFP4_BLOCK as u64, Dtype::F8_E4M3),
        (Encoding::Mlx4, "weight") => (row_elems / 8, Dtype::U32),
        (Encoding::Mlx4, _) => (row_elems / MLX_GROUP as u64, Dtype::BF16),
        (Encoding::Fp8(Fp8Scale::PerTensor(_)), _) => (0, Dtype::F8_E4M3),
    }
}

/// Settles the encoding and row width from shard 0's weight and the scale
/// tensors.
fn qwen_encoding(
    cat: &mut Catalog,
    prefix: &str,
    spelling: Spelling,
    shards: &[FoundShard],
    first: &TensorInfo,
    width: u64,
) -> Result<(Encoding, u64), CheckpointError> {
    let field = |i: usize, f: &str| shard_tensor(prefix, spelling, i, f);
    match first.dtype {
        Dtype::BF16 => Ok((Encoding::Bf16, width)),
        Dtype::F16 => Ok((Encoding::F16, width)),
        Dtype::F32 => Ok((Encoding::F32, width)),
        Dtype::F8_E4M3 => {
            // Per-row scales, per-shard scalars, or one table scale.
            let s0 = cat.get(&field(0, "weight_scale"))?;
            if let Some((_, t)) = &s0 {
                let (rows, w) = match t.shape.as_slice() {
                    &[r, w] => (r, w),
                    _ => (0, 0),
                };
                if t.shape.len() == 2 && w == 1 && rows == shards[0].rows {
                    let ty = scale_type(t.dtype)
                        .ok_or_else(|| bad(t, "a BF16, F16 or F32 per-row scale [rows, 1]"))?;
                    return Ok((Encoding::Fp8(Fp8Scale::PerRow(ty)), width));
                }
                // Per-shard scalars: all equal.
                let (f0, t0) = s0.clone().expect("checked above");
                let v0 = scalar_value(cat, f0, &t0)?;
                for i in 1..shards.len() {
                    let (f, t) = cat.need(&field(i, "weight_scale"), i)?;
                    let v = scalar_value(cat, f, &t)?;
                    if v.to_bits() != v0.to_bits() {
                        return Err(CheckpointError::ScaleMismatch {
                            tensor: t.name,
                            value: v,
                            first: t0.name,
                            first_value: v0,
                        });
                    }
                }
                return Ok((Encoding::Fp8(Fp8Scale::PerTensor(v0)), width));
            }
            let table_scale = format!("{prefix}{NGRAM}weight_scale");
            match cat.get(&table_scale)? {
                Some((f, t)) => Ok((
                    Encoding::Fp8(Fp8Scale::PerTensor(scalar_value(cat, f, &t)?)),
                    width,
                )),
                None => Err(CheckpointError::MissingScale {
                    prefix: prefix.to_owned(),
                }),
            }
        }
        Dtype::U8 => {
            // NVFP4: block scales per shard, one global scale, stored once
            // for the table (vLLM's layout) or in every shard (all equal).
            let row_elems = width
                .checked_mul(2)
                .ok_or_else(|| bad(first, "a sane width"))?;
            if row_elems % NVFP4_BLOCK as u64 != 0 {
                return Err(bad(first, "NVFP4 rows of whole 16-element blocks"));
            }
            if cat.get(&field(0, "weight_scale_2"))?.is_none() {
                let table_scale = format!("{prefix}{NGRAM}weight_scale_2");
                return match cat.get(&table_scale)? {
                    Some((f, t)) if t.dtype == Dtype::F32 => Ok((
                        Encoding::Nvfp4 {
                            global_scale: scalar_value(cat, f, &t)?,
                        },
                        row_elems,
                    )),
                    Some((_, t)) => Err(bad(&t, "an F32 scalar (NVFP4 global scale)")),
                    None => Err(CheckpointError::MissingGlobalScale {
                        prefix: prefix.to_owned(),
                    }),
                };
            }
            let mut global: Option<(String, f32)> = None;
            for i in 0..shards.len() {
                let (f, t) = cat.need(&field(i, "weight_scale_2"), i)?;
                if t.dtype != Dtype::F32 {
                    return Err(bad(&t, "an F32 scalar (NVFP4 global scale)"));
                }
                let v = scalar_value(cat, f, &t)?;
                match &global {
                    None => global = Some((t.name.clone(), v)),
                    Some((n0, v0)) if v0.to_bits() != v.to_bits() => {
                        return Err(CheckpointError::ScaleMismatch {
                            tensor: t.name,
                            value: v,
                            first: n0.clone(),
                            first_value: *v0,
                        })
                    }
                    Some(_) => {}
                }
            }
            let (_, g) = global.expect("at least one shard");
            Ok((Encoding::Nvfp4 { global_scale: g }, row_elems))
        }
        Dtype::U32 => {
            // MLX affine: 8 nibbles a word; scales tell the group size.
            let row_elems = width
                .checked_mul(8)
                .ok_or_else(|| bad(first, "a sane width"))?;
            let (_, s) = cat.need(&field(0, "scales"), 0)?;
            let (_, groups) = matrix(&s)?;
            if groups == 0 || row_elems / groups != MLX_GROUP as u64 || row_elems % groups != 0 {
                return Err(CheckpointError::Unsupported {
                    what: format!(
                        "MLX quantization with {groups} scales for {row_elems} 4-bit elements (only 4-bit, group 32 is decoded; `{}`)",
                        s.name
                    ),
                });
            }
            Ok((Encoding::Mlx4, row_elems))
        }
        other => Err(CheckpointError::Unsupported {
            what: format!("PLE table `{}` of dtype {other}", first.name),
        }),
    }
}

/// Reads the I64 n-gram buffers beside the table, if present.
fn read_buffers(cat: &mut Catalog, prefix: &str) -> Result<NgramBuffers, CheckpointError> {
    let mut read = |suffix: &str| -> Result<Option<Vec<u64>>, CheckpointError> {
        let Some((f, t)) = cat.get(&format!("{prefix}{suffix}"))? else {
            return Ok(None);
        };
        if !matches!(t.dtype, Dtype::I64 | Dtype::U64) || t.shape.len() != 1 {
            return Err(bad(&t, "a 1-D I64 buffer"));
        }
        let bytes = cat.read_small(f, &t)?;
        let vals: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        Ok(Some(vals))
    };
    Ok(NgramBuffers {
        layer_multipliers: read("layer_multipliers")?,
        head_vocab_sizes: read("ngram_heads_vocab_sizes")?,
        head_offsets: read("ngram_heads_offsets")?,
    })
}

/// Checks rows, shard count and buffers against the config, if any.
pub(super) fn check_config(t: &CheckpointTable, shard_count: usize) -> Result<(), CheckpointError> {
    let Some(c) = &t.config else {
        return Ok(());
    };
    let path = t
        .config_path
        .clone()
        .unwrap_or_else(|| PathBuf::from(CONFIG_FILE_NAME));
    let cfg = |source| CheckpointError::Config {
        path: path.clone(),
        source,
    };
    let index = t.ple_layer_index()?;
    // Cheap bounds from the file before any derivation: the heads hold at
    // least `n_heads` rows of `ngram_vocab_size_base` each, and the prime
    // search walks `(index + 1) * n_heads` primes.
    let n_heads = c.n_heads().map_err(cfg)? as u64;
    let at_least = c.ngram_vocab_size_base.saturating_mul(n_heads);
    if at_least > t.rows {
        return Err(cfg(ConfigError::Derivation(format!(
            "ngram_vocab_size_base {} times {n_heads} heads is at least {at_least} rows, more than the table's {}",
            c.ngram_vocab_size_base, t.rows
        ))));
    }
    let rows = c.table_rows(index).map_err(cfg)?;
    if rows != t.rows {
        return Err(CheckpointError::ConfigMismatch {
            what: "rows",
            found: t.rows,
            expected: rows,
        });
    }
    if let Some(n) = c.split_ngram_parts {
        if t.source == TableSource::Safetensors && n != shard_count as u64 && shard_count != 1 {
            return Err(CheckpointError::ConfigMismatch {
                what: "shards",
                found: shard_count as u64,
                expected: n,
            });
        }
    }
    let checks = [
        (
            "layer_multipliers",
            &t.buffers.layer_multipliers,
            c.multipliers(index).map_err(cfg)?,
        ),
        (
            "ngram_heads_vocab_sizes",
            &t.buffers.head_vocab_sizes,
            c.head_sizes(index).map_err(cfg)?,
        ),
        (
            "ngram_heads_offsets",
            &t.buffers.head_offsets,
            c.head_offsets(index).map_err(cfg)?,
        ),
    ];
    for (name, found, expected) in checks {
        if let Some(found) = found {
            if found != &expected {
                return Err(CheckpointError::BufferMismatch {
                    tensor: format!("{}{name}", t.prefix),
                    found: found.clone(),
                    expected,
                });
            }
        }
    }
    Ok(())
}

fn gemma_table(cat: &mut Catalog, name: &str) -> Result<CheckpointTable, CheckpointError> {
    let (file, t) = cat.get(name)?.ok_or_else(|| CheckpointError::MissingPart {
        index: 0,
        expected: name.to_owned(),
    })?;
    let (rows, width) = matrix(&t)?;
    let encoding = match t.dtype {
        Dtype::BF16 => Encoding::Bf16,
        Dtype::F16 => Encoding::F16,
        Dtype::F32 => Encoding::F32,
        other => {
            return Err(CheckpointError::Unsupported {
                what: format!("Gemma 4 table `{name}` of dtype {other}"),
            })
        }
    };
    let offset = cat.offset(file, &t)?;
    let row_bytes = t.n_bytes().checked_div(rows).unwrap_or(0);
    Ok(CheckpointTable {
        kind: TableKind::Gemma4,
        source: TableSource::Safetensors,
        files: vec![cat.files[file].clone()],
        rows,
        row_elems: width,
        encoding,
        shards: vec![Shard {
            index: 0,
            row_start: 0,
            rows,
            parts: vec![ShardPart {
                tensor: t.name.clone(),
                file: 0,
                offset,
                row_bytes,
            }],
        }],
        prefix: name.trim_end_matches("weight").to_owned(),
        layer: None,
        ple_layers: Vec::new(),
        config_path: None,
        config: None,
        buffers: NgramBuffers::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_of_prefixes() {
        assert_eq!(
            layer_of_prefix("model.language_model.layers.1.ple.ple_embedding."),
            Some(1)
        );
        assert_eq!(
            layer_of_prefix("language_model.model.layers.17.ple.ple_embedding."),
            Some(17)
        );
        assert_eq!(layer_of_prefix("layers.0.ple."), Some(0));
        assert_eq!(layer_of_prefix("model.layers.x.ple."), None);
        assert_eq!(layer_of_prefix("model.sublayers.3.ple."), None);
        assert_eq!(layer_of_prefix("model.layers.3"), None);
        assert_eq!(layer_of_prefix(""), None);
        assert_eq!(choose_layer(None, &[2, 4]).unwrap(), Some(2));
        assert_eq!(choose_layer(Some(4), &[2, 4]).unwrap(), Some(4));
        assert!(matches!(
            choose_layer(Some(3), &[2, 4]),
            Err(CheckpointError::NoSuchLayer { layer: 3, .. })
        ));
    }

    #[test]
    fn shard_names() {
        let p = "model.language_model.layers.1.ple.ple_embedding.";
        assert_eq!(
            parse_shard_name(&format!("{p}ngram_embedding.shard_17.weight_scale_2")),
            Some((p.into(), Spelling::Hf, 17, "weight_scale_2".into()))
        );
        assert_eq!(
            parse_shard_name(
                "language_model.model.layers.1.ple.ple_embedding.ngram_embedding.shards.3.biases"
            ),
            Some((
                "language_model.model.layers.1.ple.ple_embedding.".into(),
                Spelling::Mlx,
                3,
                "biases".into()
            ))
        );
        assert_eq!(
            parse_shard_name(&format!("{p}ngram_embedding.weight_scale")),
            None
        );
        assert_eq!(
            parse_shard_name(&format!("{p}ngram_embedding.shard_x.weight")),
            None
        );
        assert_eq!(
            parse_shard_name(&format!("{p}ngram_embedding.shard_+1.weight")),
            None
        );
        assert_eq!(
            parse_shard_name(&format!("{p}ngram_embedding.shard_99999999999.weight")),
            None
        );
        assert_eq!(
            shard_tensor(p, Spelling::Hf, 5, "weight"),
            format!("{p}ngram_embedding.shard_5.weight")
        );
    }
}
