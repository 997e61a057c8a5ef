//! A model: one GGUF file or a split set of shards, mapped and parsed.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::gguf::{
    parse_split_path, split_path, GgufError, GgufFile, Metadata, TensorInfo, Value,
    SPLIT_COUNT_KEY, SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY,
};
use crate::layout::{Layout, TableError, PLE_TENSOR};
use crate::map::Mapping;

/// True if `a` and `b` are the same file (device and inode).
fn same_file(a: &File, b: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// One file of a model, mapped and parsed.
#[derive(Debug)]
pub struct Shard {
    path: PathBuf,
    mapping: Mapping,
    gguf: GgufFile,
}

impl Shard {
    /// Maps and parses the file at `path`.
    fn open(path: &Path) -> Result<Shard, GgufError> {
        let file = crate::sys::open_regular(path).map_err(|e| GgufError::io(Some(path), e))?;
        if file.metadata().is_ok_and(|m| m.is_dir()) {
            let e = std::io::Error::new(std::io::ErrorKind::IsADirectory, "is a directory");
            return Err(GgufError::io(Some(path), e));
        }
        let mapping = Mapping::map(&file).map_err(|e| GgufError::io(Some(path), e))?;
        // The header is read, not mapped: a device error or a file cut
        // short under it is an error, never SIGBUS. Through a descriptor
        // of its own, advised for random reads, so reading it pulls no
        // readahead window (megabytes) of the first tensor's bytes into the
        // page cache, and the mapping's descriptor keeps its readahead; the
        // mapping's own if the path now names another file.
        let header = File::open(path)
            .ok()
            .filter(|h| same_file(h, &file))
            .inspect(|h| {
                crate::sys::random_reads(h);
            });
        let gguf =
            GgufFile::read_header(header.as_ref().unwrap_or(&file)).map_err(|e| e.in_file(path))?;
        drop(header);
        Ok(Shard {
            path: path.to_path_buf(),
            mapping,
            gguf,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File length in bytes (at open time).
    pub fn file_len(&self) -> u64 {
        self.gguf.file_size()
    }

    /// GGUF version.
    pub fn version(&self) -> u32 {
        self.gguf.version()
    }

    /// Data-section alignment.
    pub fn alignment(&self) -> u64 {
        self.gguf.alignment()
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.gguf.data_offset()
    }

    /// Number of tensors in this file.
    pub fn tensor_count(&self) -> usize {
        self.gguf.tensors().len()
    }

    /// The parsed file (this shard's own metadata and tensor infos).
    pub fn gguf(&self) -> &GgufFile {
        &self.gguf
    }

    /// The file's mapping.
    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// A split key as a number, or a description of what is there instead.
    fn split_key(&self, key: &str) -> Result<u64, String> {
        match self.gguf.metadata().get(key) {
            None => Err("missing".to_owned()),
            Some(v) => v.as_u64().ok_or_else(|| v.to_string()),
        }
    }

    /// Checks `key` holds `expected`; an absent key is accepted if `optional`.
    fn expect_key(
        &self,
        key: &'static str,
        expected: u64,
        optional: bool,
    ) -> Result<(), GgufError> {
        match self.split_key(key) {
            Ok(v) if v == expected => Ok(()),
            Err(_) if optional && !self.gguf.metadata().contains_key(key) => Ok(()),
            Ok(v) => Err(self.mismatch(key, expected, v.to_string())),
            Err(found) => Err(self.mismatch(key, expected, found)),
        }
    }

    fn mismatch(&self, key: &'static str, expected: u64, found: String) -> GgufError {
        GgufError::ShardMismatch {
            path: self.path.clone(),
            key,
            expected,
            found,
        }
    }
}

/// A tensor of a model: its info plus where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTensor {
    /// Name, type, shape; `info.offset` is relative to its shard's data section.
    pub info: TensorInfo,
    /// Index of the shard holding it.
    pub shard: usize,
    /// Absolute byte offset of its data in the shard file.
    pub file_offset: u64,
}

impl ModelTensor {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// Absolute byte range of its data in the shard file.
    pub fn file_range(&self) -> Range<u64> {
        self.file_offset..self.file_offset + self.info.n_bytes
    }
}

/// A model opened from one GGUF file or from any shard of a split set
/// (`NAME-0000N-of-0000M.gguf`): every shard mapped and parsed, metadata from
/// shard 0, tensors from all shards.
#[derive(Debug)]
pub struct Model {
    shards: Vec<Shard>,
    tensors: Vec<ModelTensor>,
    index: HashMap<String, usize>,
}

impl Model {
    /// Opens `path`; if its name follows the split rule, opens all its
    /// siblings too.
    ///
    /// Errors: I/O and parse errors name the file; a missing sibling is
    /// [`GgufError::MissingShard`] with the expected path; `split.no` /
    /// `split.count` disagreeing with a shard's name, or
    /// `split.tensors.count` with the tensors found, is
    /// [`GgufError::ShardMismatch`]; a file with `split.count` > 1 whose name
    /// does not follow the rule is [`GgufError::UnnamedSplit`]; a tensor
    /// name found in two shards is [`GgufError::DuplicateTensor`].
    pub fn open(path: impl AsRef<Path>) -> Result<Model, GgufError> {
        let path = path.as_ref();
        let given = Shard::open(path)?;
        let Some(split) = parse_split_path(path) else {
            if let Ok(count) = given.split_key(SPLIT_COUNT_KEY) {
                if count > 1 {
                    return Err(GgufError::UnnamedSplit {
                        path: path.to_path_buf(),
                        count,
                    });
                }
            }
            return Model::from_shards(vec![given]);
        };
        let mut given = Some(given);
        let mut shards = Vec::with_capacity(split.count.into());
        for no in 0..split.count {
            let shard = match given.take_if(|_| no == split.no) {
                Some(s) => s,
                None => {
                    let p = split_path(&split.stem, no, split.count);
                    match Shard::open(&p) {
                        Err(GgufError::Io { error: source, .. })
                            if source.kind() == std::io::ErrorKind::NotFound =>
                        {
                            return Err(GgufError::MissingShard {
                                path: p,
                                no,
                                count: split.count,
                            });
                        }
                        other => other?,
                    }
                }
            };
            // A one-file "set" need not carry split keys.
            let optional = split.count == 1;
            shard.expect_key(SPLIT_NO_KEY, no.into(), optional)?;
            shard.expect_key(SPLIT_COUNT_KEY, split.count.into(), optional)?;
            shards.push(shard);
        }
        Model::from_shards(shards)
    }

    fn from_shards(shards: Vec<Shard>) -> Result<Model, GgufError> {
        let mut tensors = Vec::new();
        let mut index = HashMap::new();
        for (i, shard) in shards.iter().enumerate() {
            for info in shard.gguf.tensors() {
                if index.insert(info.name.clone(), tensors.len()).is_some() {
                    return Err(GgufError::DuplicateTensor {
                        tensor: info.name.clone(),
                    }
                    .in_file(&shard.path));
                }
                tensors.push(ModelTensor {
                    info: info.clone(),
                    shard: i,
                    file_offset: shard.gguf.tensor_range(info).start,
                });
            }
        }
        if let Some(first) = shards.first() {
            if first.gguf.metadata().contains_key(SPLIT_TENSORS_COUNT_KEY) {
                first.expect_key(SPLIT_TENSORS_COUNT_KEY, tensors.len() as u64, false)?;
            }
        }
        Ok(Model {
            shards,
            tensors,
            index,
        })
    }

    /// The model's metadata (from shard 0).
    pub fn metadata(&self) -> &Metadata {
        self.shards[0].gguf.metadata()
    }

    /// `general.architecture`, e.g. `qwen4exp`.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata()
            .get("general.architecture")
            .and_then(Value::as_str)
    }

    /// All tensors, shard by shard in file order.
    pub fn tensors(&self) -> &[ModelTensor] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&ModelTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The shards, in order (one for a non-split file).
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The mapping of shard `i`.
    pub fn shard_mapping(&self, i: usize) -> Option<&Mapping> {
        self.shards.get(i).map(Shard::mapping)
    }

    /// Unmaps the bytes `first..last` of shard `shard` (rounded inward to
    /// whole pages; see [`Mapping::unmap_fragment`]), as an engine that
    /// copied eager tensors out does. Tables opened on this model afterwards
    /// never touch the hole: their rows there are an error, and page advice
    /// skips it. `None` if the shard does not exist.
    pub fn unmap_fragment(
        &mut self,
        shard: usize,
        first: u64,
        last: u64,
    ) -> Option<Result<Option<Range<u64>>, crate::map::MapError>> {
        Some(
            self.shards
                .get_mut(shard)?
                .mapping
                .unmap_fragment(first, last),
        )
    }

    /// A tensor's bytes, straight from the mapping (no copy, no read until
    /// touched). `None` if `t` is not a tensor of this model.
    pub fn tensor_data(&self, t: &ModelTensor) -> Option<&[u8]> {
        if self.tensor(t.name()) != Some(t) {
            return None;
        }
        let r = t.file_range();
        self.shards
            .get(t.shard)?
            .mapping
            .bytes(r.start, r.end - r.start)
    }
}

// The GGUF model builds its tables' layouts: `layout` knows no file format.
impl Layout {
    /// The layout of the tensor `name` of `model`.
    pub fn of_tensor(model: &Model, name: &str) -> Result<Layout, TableError> {
        let t = model.tensor(name).ok_or_else(|| TableError::NoSuchTensor {
            name: name.to_string(),
            ple_hint: false,
        })?;
        Layout::of(t)
    }

    /// The layout of the model's per-layer-embedding table
    /// ([`PLE_TENSOR`]).
    pub fn of_ple(model: &Model) -> Result<Layout, TableError> {
        let t = model
            .tensor(PLE_TENSOR)
            .ok_or_else(|| TableError::NoSuchTensor {
                name: PLE_TENSOR.to_string(),
                ple_hint: true,
            })?;
        Layout::of(t)
    }

    /// [`Layout::of_tensor`] when a name is given, else [`Layout::of_ple`]
    /// (for tools whose `--tensor` is optional).
    pub fn of_tensor_or_ple(model: &Model, tensor: Option<&str>) -> Result<Layout, TableError> {
        match tensor {
            Some(name) => Layout::of_tensor(model, name),
            None => Layout::of_ple(model),
        }
    }

    fn of(t: &ModelTensor) -> Result<Layout, TableError> {
        Layout::new(
            &t.info.name,
            t.info.ty,
            &t.info.dims,
            t.shard,
            t.file_offset,
        )
    }
}
