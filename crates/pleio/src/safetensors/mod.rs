//! safetensors files: a checked header reader, the multi-file index
//! (`model.safetensors.index.json`) and a streaming writer.
//!
//! Layout: a `u64` little-endian header length `n`, `n` bytes of JSON (an
//! object mapping tensor names to `{"dtype", "shape", "data_offsets"}` plus an
//! optional `"__metadata__"` object of strings), then the data section. A
//! tensor's bytes are `8 + n + data_offsets[0] .. 8 + n + data_offsets[1]`.
//!
//! [`SafetensorsFile`] accepts exactly what Hugging Face's reference reader
//! (`safetensors::SafeTensors::read_metadata`) accepts, with two additions
//! that only refuse more: a tensor name may appear once, and a shape has at
//! most [`MAX_DIMS`] dimensions. So: the header is at most
//! [`MAX_HEADER_LEN`] bytes and lies inside the file, is UTF-8 and starts with
//! `{`; every dtype is known; every tensor's `data_offsets` are ordered, its
//! byte count equals its element count times the dtype size (checked
//! arithmetic); the tensors, sorted by offset, tile the data section from 0
//! to its very end without gap or overlap. Nothing is allocated beyond what
//! the header's own bytes justify, and nothing panics on hostile input.

use std::fmt;
use std::path::{Path, PathBuf};

mod header;
mod index;
mod writer;

pub use header::{SafetensorsFile, TensorInfo};
pub(crate) use index::{is_plain_relative, read_bounded};
pub use index::{WeightIndex, INDEX_FILE_NAME, MAX_INDEX_LEN};
pub use writer::SafetensorsWriter;

/// Largest header accepted, as in the reference reader (100 MB).
pub const MAX_HEADER_LEN: u64 = 100_000_000;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 16;
/// The header key holding free-form string metadata.
pub const METADATA_KEY: &str = "__metadata__";

/// Element types of the safetensors format (the reference's full list).
///
/// All have a [size](Dtype::bits); pleio decodes rows of [`Dtype::BF16`],
/// [`Dtype::F16`], [`Dtype::F32`], [`Dtype::F8_E4M3`] and the packed
/// [`Dtype::U8`]/[`Dtype::U32`] encodings of `crate::quant::encoding`, and
/// reads small [`Dtype::I64`] buffers.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    BOOL,
    F4,
    F6_E2M3,
    F6_E3M2,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    F8_E4M3FNUZ,
    F8_E5M2FNUZ,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
}

impl Dtype {
    /// Every dtype.
    pub const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// The name used in headers, e.g. `"F8_E4M3"`.
    pub fn name(self) -> &'static str {
        use Dtype as D;
        match self {
            D::BOOL => "BOOL",
            D::F4 => "F4",
            D::F6_E2M3 => "F6_E2M3",
            D::F6_E3M2 => "F6_E3M2",
            D::U8 => "U8",
            D::I8 => "I8",
            D::F8_E5M2 => "F8_E5M2",
            D::F8_E4M3 => "F8_E4M3",
            D::F8_E8M0 => "F8_E8M0",
            D::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            D::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            D::I16 => "I16",
            D::U16 => "U16",
            D::F16 => "F16",
            D::BF16 => "BF16",
            D::I32 => "I32",
            D::U32 => "U32",
            D::F32 => "F32",
            D::C64 => "C64",
            D::F64 => "F64",
            D::I64 => "I64",
            D::U64 => "U64",
        }
    }

    /// The dtype called `name` in a header.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bits per element (4 and 6 for the packed float types).
    pub fn bits(self) -> u64 {
        use Dtype as D;
        match self {
            D::F4 => 4,
            D::F6_E2M3 | D::F6_E3M2 => 6,
            D::BOOL
            | D::U8
            | D::I8
            | D::F8_E5M2
            | D::F8_E4M3
            | D::F8_E8M0
            | D::F8_E4M3FNUZ
            | D::F8_E5M2FNUZ => 8,
            D::I16 | D::U16 | D::F16 | D::BF16 => 16,
            D::I32 | D::U32 | D::F32 => 32,
            D::C64 | D::F64 | D::I64 | D::U64 => 64,
        }
    }

    /// Bytes per element, for the whole-byte dtypes.
    pub fn size(self) -> Option<u64> {
        self.bits().is_multiple_of(8).then(|| self.bits() / 8)
    }
}

/// A header's first byte in words: `0xEF` (with a hint for a UTF-8
/// byte-order mark), or that the header is empty.
fn first_byte(first: Option<u8>) -> String {
    match first {
        None => "the header is empty".into(),
        Some(0xEF) => "first byte 0xEF: a UTF-8 byte-order mark?".into(),
        Some(b) if b.is_ascii_graphic() => format!("first byte 0x{b:02X} '{}'", b as char),
        Some(b) => format!("first byte 0x{b:02X}"),
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that can go wrong reading, indexing or writing safetensors
/// files. Offsets are absolute in the file unless said otherwise; errors
/// of one file are wrapped in [`SafetensorsError::InFile`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    /// An operating-system error, with the file when known.
    #[error("I/O error{}: {source}", on_path(.path))]
    Io {
        /// The file being read or written.
        path: Option<PathBuf>,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An error inside one file, named by its path.
    #[error("{}: {source}", .path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<SafetensorsError>,
    },
    /// Fewer than 8 bytes: no header length.
    #[error("{file_size} bytes: too short for the 8-byte header length")]
    TooShort {
        /// File size.
        file_size: u64,
    },
    /// The header length exceeds [`MAX_HEADER_LEN`].
    #[error("header length {len} exceeds the limit of {max} bytes")]
    HeaderTooLarge {
        /// The header length field.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The header runs past the end of the file.
    #[error("header of {len} bytes at offset 8 runs past the end of the file ({file_size} bytes)")]
    HeaderPastEnd {
        /// The header length field.
        len: u64,
        /// File size.
        file_size: u64,
    },
    /// The bytes given to the parser end before the header does.
    #[error("only {available} of the {need} header bytes were given to the parser")]
    Truncated {
        /// Bytes needed (8 + header length).
        need: u64,
        /// Bytes given.
        available: u64,
    },
    /// The header is not UTF-8.
    #[error("header is not valid UTF-8 (at header byte {valid_up_to})")]
    HeaderNotUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// The header does not start with `{`.
    #[error("header does not start with '{{' ({})", first_byte(*.first))]
    HeaderNotObject {
        /// The first header byte, if any.
        first: Option<u8>,
    },
    /// The header is not the JSON the format requires.
    #[error("header JSON: {message}")]
    BadJson {
        /// serde_json's message, naming the tensor when known.
        message: String,
    },
    /// A tensor name appears twice in the header.
    #[error("tensor `{tensor}` appears twice in the header")]
    DuplicateTensor {
        /// The name.
        tensor: String,
    },
    /// A dtype name the format does not have.
    #[error("tensor `{tensor}`: unknown dtype {dtype:?}")]
    UnknownDtype {
        /// The tensor.
        tensor: String,
        /// The dtype as written.
        dtype: String,
    },
    /// `data_offsets[1] < data_offsets[0]`.
    #[error("tensor `{tensor}`: data_offsets [{start}, {end}] end before they start")]
    ReversedOffsets {
        /// The tensor.
        tensor: String,
        /// `data_offsets[0]`.
        start: u64,
        /// `data_offsets[1]`.
        end: u64,
    },
    /// The element count or bit count of a shape overflows.
    #[error("tensor `{tensor}`: shape {shape:?} of {dtype} overflows the element or byte count")]
    ShapeOverflow {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
        /// Its dtype.
        dtype: Dtype,
    },
    /// A packed dtype whose element count is not a whole number of bytes.
    #[error("tensor `{tensor}`: {elems} elements of {dtype} are not a whole number of bytes")]
    NotWholeBytes {
        /// The tensor.
        tensor: String,
        /// Elements.
        elems: u64,
        /// Its dtype.
        dtype: Dtype,
    },
    /// The byte range's length differs from shape times dtype size.
    #[error("tensor `{tensor}`: shape {shape:?} of {dtype} needs {expected} bytes, data_offsets give {found}")]
    SizeMismatch {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
        /// Its dtype.
        dtype: Dtype,
        /// Bytes the shape needs.
        expected: u64,
        /// Bytes the offsets span.
        found: u64,
    },
    /// A tensor's bytes run past the end of the file.
    #[error("tensor `{tensor}`: data bytes {start}..{end} run past the end of the data section ({data_len} bytes, file size {file_size})")]
    TensorPastEnd {
        /// The tensor.
        tensor: String,
        /// Start, relative to the data section.
        start: u64,
        /// End, relative to the data section.
        end: u64,
        /// Length of the data section.
        data_len: u64,
        /// File size.
        file_size: u64,
    },
    /// Two tensors share bytes.
    #[error("tensors `{first}` (data bytes {first_start}..{first_end}) and `{second}` (data bytes {second_start}..{second_end}) overlap")]
    Overlap {
        /// The tensor that starts first.
        first: String,
        /// Its start (data-relative).
        first_start: u64,
        /// Its end (data-relative).
        first_end: u64,
        /// The tensor starting inside it.
        second: String,
        /// Its start (data-relative).
        second_start: u64,
        /// Its end (data-relative).
        second_end: u64,
    },
    /// Bytes of the data section that no tensor covers (the reference
    /// reader refuses them too).
    #[error("data bytes {start}..{end} belong to no tensor (before `{next}`)")]
    Gap {
        /// Start of the gap (data-relative).
        start: u64,
        /// End of the gap (data-relative).
        end: u64,
        /// The tensor after the gap.
        next: String,
    },
    /// The file goes on after the last tensor.
    #[error("{extra} bytes after the last tensor's data (data ends at {data_end}, file size {file_size})")]
    TrailingBytes {
        /// Bytes after the last tensor.
        extra: u64,
        /// Absolute end of the last tensor.
        data_end: u64,
        /// File size.
        file_size: u64,
    },
    /// A tensor read into memory that is larger than the caller allows.
    #[error("tensor `{tensor}` has {bytes} bytes, more than the {max} this read allows")]
    TensorTooLarge {
        /// The tensor.
        tensor: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// `model.safetensors.index.json` is not what the format requires.
    #[error("index: {message}")]
    BadIndex {
        /// What is wrong.
        message: String,
    },
    /// Writer calls in the wrong order, or a bad tensor declaration.
    #[error("safetensors writer: {0}")]
    Writer(String),
}

impl SafetensorsError {
    /// The error with any [`SafetensorsError::InFile`] wrappers removed.
    pub fn root(&self) -> &SafetensorsError {
        match self {
            SafetensorsError::InFile { source, .. } => source.root(),
            other => other,
        }
    }

    /// The file this error concerns, if known.
    pub fn path(&self) -> Option<&Path> {
        match self {
            SafetensorsError::Io { path, .. } => path.as_deref(),
            SafetensorsError::InFile { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Wraps a file-less error with the file's path (errors that already
    /// name a file are returned as they are).
    pub fn in_file(self, path: &Path) -> SafetensorsError {
        match self {
            SafetensorsError::Io { path: None, source } => SafetensorsError::Io {
                path: Some(path.to_path_buf()),
                source,
            },
            e if e.path().is_some() => e,
            e => SafetensorsError::InFile {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }

    pub(crate) fn io(path: Option<&Path>, source: std::io::Error) -> SafetensorsError {
        SafetensorsError::Io {
            path: path.map(Path::to_path_buf),
            source,
        }
    }
}

fn on_path(path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => format!(" on {}", p.display()),
        None => String::new(),
    }
}
