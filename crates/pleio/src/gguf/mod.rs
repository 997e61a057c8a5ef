//! GGUF files: a checked reader, a streaming writer and split-set naming.
//!
//! Layout (little-endian, versions 2 and 3): magic `GGUF`, version `u32`,
//! tensor count `u64`, metadata count `u64`, the metadata key/value pairs,
//! the tensor infos, padding to `general.alignment` (default 32), then the
//! data section. A tensor's offset is relative to the data section.
//!
//! [`GgufFile::parse`] reads a whole file held in memory without copying
//! tensor data; [`GgufFile::read_header`] reads only the header from a file
//! with `pread` (what [`crate::model::Model`] does: never through a
//! mapping, so a device error there is an error, not `SIGBUS`). Every
//! count and length is checked against the bytes that remain *before*
//! anything is allocated: an array of `n` elements whose smallest encoding
//! is `s` bytes is refused unless `n * s` bytes remain, and collections whose
//! elements are larger in memory than on disk start with a small capacity and
//! grow only as elements are actually decoded. So a forged count (2^60
//! tensors, a 2^60-element array) fails at once and allocates nothing.

use std::path::{Path, PathBuf};

use crate::quant::GgmlType;

mod metadata;
mod reader;
mod split;
mod tensor;
mod value;
mod writer;

pub use metadata::Metadata;
pub use reader::GgufFile;
pub use split::{
    parse_split_path, split_path, SplitName, SPLIT_COUNT_KEY, SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY,
};
pub use tensor::TensorInfo;
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, Sink};

/// The 4 magic bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The version the writer produces.
pub const WRITE_VERSION: u32 = 3;
/// Data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Most dimensions a tensor may have (ggml itself uses 4).
pub const MAX_DIMS: usize = 8;
/// Deepest nesting of arrays inside arrays that is accepted.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// Everything that can go wrong reading, writing or opening GGUF files.
///
/// Byte offsets are from the start of the file. Errors from one file of a
/// set are wrapped in [`GgufError::InFile`]; [`GgufError::root`] unwraps.
/// Messages include their causes; `source()` does not repeat them (a
/// printed chain names every cause once).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// An operating-system error, with the file it concerns when known.
    #[error("I/O error{}: {error}", on_path(.path))]
    Io {
        /// File being read or written.
        path: Option<PathBuf>,
        /// The OS error.
        error: std::io::Error,
    },
    /// An error inside one file, named by its path.
    #[error("{}: {error}", .path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        error: Box<GgufError>,
    },
    /// The file does not start with `GGUF`.
    #[error("bad magic {found:02x?} at offset 0 (expected \"GGUF\")")]
    BadMagic {
        /// The first 4 bytes.
        found: [u8; 4],
    },
    /// A version other than 2 or 3.
    #[error("unsupported GGUF version {version} at offset 4 (only 2 and 3 are read){}", version_hint(*.version))]
    UnsupportedVersion {
        /// The version field.
        version: u32,
    },
    /// The file ends inside an item.
    #[error(
        "truncated at offset {offset} while reading {what}: {need} bytes needed, {available} left"
    )]
    Truncated {
        /// Where the item starts.
        offset: u64,
        /// What was being read.
        what: String,
        /// Bytes the item needs.
        need: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A count whose smallest possible encoding is larger than what is left.
    #[error("{what} at offset {offset} is {count}, too large for the {available} bytes left ({min_size}+ bytes each)")]
    CountTooLarge {
        /// What is being counted.
        what: String,
        /// Offset of the count field.
        offset: u64,
        /// The count.
        count: u64,
        /// Smallest encoded size of one element.
        min_size: u64,
        /// Bytes left after the count.
        available: u64,
    },
    /// A string that is not UTF-8.
    #[error("string at offset {offset} ({what}) is not valid UTF-8")]
    InvalidUtf8 {
        /// Offset of the string bytes.
        offset: u64,
        /// Which string (key, value of a key, tensor name).
        what: String,
    },
    /// A metadata value type id outside 0..=12.
    #[error("unknown metadata value type {type_id} at offset {offset} (key `{key}`)")]
    UnknownValueType {
        /// The type id.
        type_id: u32,
        /// Offset of the type field.
        offset: u64,
        /// The key being read.
        key: String,
    },
    /// A bool byte other than 0 or 1.
    #[error("invalid bool byte {byte} at offset {offset} (key `{key}`)")]
    InvalidBool {
        /// The byte.
        byte: u8,
        /// Its offset.
        offset: u64,
        /// The key being read.
        key: String,
    },
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`].
    #[error("arrays nested deeper than {max} levels (key `{key}`{})", at_offset(.offset))]
    NestingTooDeep {
        /// The key.
        key: String,
        /// Offset of the innermost array header, when reading.
        offset: Option<u64>,
        /// The limit.
        max: usize,
    },
    /// A metadata key seen twice.
    #[error("duplicate metadata key `{key}`{}", at_offset(.offset))]
    DuplicateKey {
        /// The key.
        key: String,
        /// Offset of the second occurrence, when reading.
        offset: Option<u64>,
    },
    /// `general.alignment` is not a nonzero power of two that fits in `u32`.
    #[error("bad general.alignment {value}: must be a nonzero power of two u32")]
    BadAlignment {
        /// The value as found.
        value: String,
    },
    /// A tensor type id ggml does not know.
    #[error("tensor `{tensor}`: unknown ggml type id {type_id} at offset {offset}")]
    UnknownGgmlType {
        /// The tensor.
        tensor: String,
        /// The type id.
        type_id: u32,
        /// Offset of the type field.
        offset: u64,
    },
    /// More than [`MAX_DIMS`] dimensions.
    #[error("tensor `{tensor}`: {n_dims} dimensions (at most {max})")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// Its dimension count.
        n_dims: u64,
        /// The limit.
        max: usize,
    },
    /// `ne[0]` is not a multiple of the type's block size.
    #[error("tensor `{tensor}`: row of {ne0} elements is not a whole number of {ty} blocks ({block_elems} elements each)")]
    RowNotWholeBlocks {
        /// The tensor.
        tensor: String,
        /// Elements per row.
        ne0: u64,
        /// Its type.
        ty: GgmlType,
        /// Elements per block of `ty`.
        block_elems: usize,
    },
    /// The element or byte count of a tensor overflows.
    #[error("tensor `{tensor}`: dimensions {dims:?} overflow the element or byte count")]
    DimsOverflow {
        /// The tensor.
        tensor: String,
        /// Its dimensions.
        dims: Vec<u64>,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error(
        "tensor `{tensor}`: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose bytes do not lie inside the file.
    #[error(
        "tensor `{tensor}`: bytes {start}..{end} lie past the end of the file ({file_size} bytes)"
    )]
    TensorPastEnd {
        /// The tensor.
        tensor: String,
        /// Absolute start (saturated on overflow).
        start: u64,
        /// Absolute end (saturated on overflow).
        end: u64,
        /// File size.
        file_size: u64,
    },
    /// Two tensors share bytes.
    #[error("tensors `{first}` (data bytes {first_start}..{first_end}) and `{second}` (from {second_start}) overlap")]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// Its start, relative to the data section.
        first_start: u64,
        /// Its end, relative to the data section.
        first_end: u64,
        /// The tensor that starts inside it.
        second: String,
        /// Its start, relative to the data section.
        second_start: u64,
    },
    /// A tensor name seen twice.
    #[error("duplicate tensor name `{tensor}`")]
    DuplicateTensor {
        /// The name.
        tensor: String,
    },
    /// Writer calls made in the wrong order.
    #[error("GGUF writer: {0}")]
    WriterState(&'static str),
    /// More tensor data streamed than the tensors hold.
    #[error("GGUF writer: {extra} bytes of tensor data beyond the last tensor")]
    TooMuchTensorData {
        /// Bytes that did not fit.
        extra: u64,
    },
    /// [`GgufWriter::finish`] before every tensor got its bytes.
    #[error("GGUF writer: tensor `{tensor}` got {written} of its {expected} bytes")]
    IncompleteTensorData {
        /// The first tensor not complete.
        tensor: String,
        /// Bytes it got.
        written: u64,
        /// Bytes it needs.
        expected: u64,
    },
    /// A shard of a split set does not exist.
    #[error("missing shard {} of {count} of a split set: {}", .no + 1, .path.display())]
    MissingShard {
        /// The expected path.
        path: PathBuf,
        /// 0-based shard number.
        no: u16,
        /// Shards in the set.
        count: u16,
    },
    /// Split metadata that disagrees with the file's name or contents.
    #[error("{}: {key} is {found}, but the split set requires {expected}", .path.display())]
    ShardMismatch {
        /// The shard.
        path: PathBuf,
        /// The metadata key.
        key: &'static str,
        /// What the key should hold.
        expected: u64,
        /// What it holds (`missing` when absent).
        found: String,
    },
    /// A file with `split.count` > 1 whose name does not follow the
    /// `NAME-0000N-of-0000M.gguf` rule, so its siblings cannot be found.
    #[error("{}: split.count is {count} but the name does not end in -NNNNN-of-MMMMM.gguf", .path.display())]
    UnnamedSplit {
        /// The file.
        path: PathBuf,
        /// Its `split.count`.
        count: u64,
    },
}

impl GgufError {
    /// The error with any [`GgufError::InFile`] wrappers removed.
    pub fn root(&self) -> &GgufError {
        match self {
            GgufError::InFile { error, .. } => error.root(),
            other => other,
        }
    }

    /// The file this error concerns, if known.
    pub fn path(&self) -> Option<&Path> {
        match self {
            GgufError::Io { path, .. } => path.as_deref(),
            GgufError::InFile { path, .. }
            | GgufError::MissingShard { path, .. }
            | GgufError::ShardMismatch { path, .. }
            | GgufError::UnnamedSplit { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Wraps a file-less error with the file's path.
    pub(crate) fn in_file(self, path: &Path) -> GgufError {
        match self {
            GgufError::Io {
                path: None,
                error: source,
            } => GgufError::Io {
                path: Some(path.to_path_buf()),
                error: source,
            },
            e if e.path().is_some() => e,
            e => GgufError::InFile {
                path: path.to_path_buf(),
                error: Box::new(e),
            },
        }
    }

    pub(crate) fn io(path: Option<&Path>, source: std::io::Error) -> GgufError {
        GgufError::Io {
            path: path.map(Path::to_path_buf),
            error: source,
        }
    }
}

fn on_path(path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => format!(" on {}", p.display()),
        None => String::new(),
    }
}

fn at_offset(offset: &Option<u64>) -> String {
    match offset {
        Some(o) => format!(" at offset {o}"),
        None => String::new(),
    }
}

fn version_hint(version: u32) -> &'static str {
    match version {
        1 => "; version 1 used 32-bit counts and is obsolete",
        v if matches!(v.swap_bytes(), 2 | 3) => "; this looks like a big-endian file",
        _ => "",
    }
}

/// `n` rounded up to a multiple of `align` (a power of two), or `None` on
/// overflow.
pub(crate) fn align_up(n: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    n.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// Checks a `general.alignment` value: a nonzero power of two fitting `u32`.
pub(crate) fn check_alignment(value: &Value) -> Result<u64, GgufError> {
    match value.as_u32() {
        Some(a) if a.is_power_of_two() => Ok(u64::from(a)),
        _ => Err(GgufError::BadAlignment {
            value: format!("{value} ({})", value.value_type().name()),
        }),
    }
}

impl From<GgufError> for crate::Error {
    fn from(e: GgufError) -> crate::Error {
        let kind = match &e {
            GgufError::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
                crate::ErrorKind::NotFound
            }
            GgufError::MissingShard { .. } => crate::ErrorKind::NotFound,
            GgufError::Io { .. } => crate::ErrorKind::Io,
            _ => crate::ErrorKind::InvalidFile,
        };
        crate::Error::new(kind, e)
    }
}
