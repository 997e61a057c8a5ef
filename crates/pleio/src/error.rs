//! [`Error`]: the one error of the public entry point ([`crate::Table`]),
//! from opening a file to gathering its rows.
//!
//! Lower layers keep their own typed errors ([`crate::gguf::GgufError`],
//! [`crate::layout::TableError`], [`crate::fetch::GatherError`], ...); an
//! [`Error`] wraps one of them, says which [`ErrorKind`] it is, and carries
//! the path, tensor, row and offset at fault where they are known.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::checkpoint::CheckpointError;
use crate::fetch::GatherError;
use crate::gguf::GgufError;
use crate::io::IoError;
use crate::layout::TableError;
use crate::lookahead::LookaheadError;
use crate::ngram::NgramError;
use crate::quant::DecodeError;

/// What went wrong, for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file (or a shard of a split set) does not exist.
    NotFound,
    /// Reading the file failed (permissions, I/O error, a file shorter than
    /// its tensors).
    Io,
    /// The file is not a valid model file (bad header, counts, offsets).
    InvalidFile,
    /// The file has no such table (no PLE tensor, or no tensor of the name
    /// given), or the tensor is not a 2-D table of whole rows.
    NoTable,
    /// The table's element type or the model's architecture is not one pleio
    /// can decode or map row ids for.
    Unsupported,
    /// A row id is past the end of the table (nothing was read or written).
    RowOutOfRange,
    /// The output buffer does not have the size the request needs.
    OutputSize,
    /// A read backend could not be set up (thread, ring or file open).
    Setup,
    /// The row-id parameters in the file are missing or wrong.
    RowIds,
}

/// The error of [`crate::Table`]: a [`kind`](Error::kind), the path,
/// tensor, row and offset at fault where known, and one line of text that
/// names them.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    path: Option<PathBuf>,
    tensor: Option<String>,
    row: Option<u64>,
    offset: Option<u64>,
    inner: Box<dyn std::error::Error + Send + Sync>,
}

/// `Result<T, pleio::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    fn new(kind: ErrorKind, inner: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error {
            kind,
            path: None,
            tensor: None,
            row: None,
            offset: None,
            inner: Box::new(inner),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The file at fault, if known.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The tensor at fault, if known.
    pub fn tensor(&self) -> Option<&str> {
        self.tensor.as_deref()
    }

    /// The row id at fault, if any.
    pub fn row(&self) -> Option<u64> {
        self.row
    }

    /// The absolute file offset at fault, if any.
    pub fn offset(&self) -> Option<u64> {
        self.offset
    }

    /// The lower layer's error this one wraps.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.inner
    }

    /// Names the file, unless the message already does.
    pub(crate) fn in_file(mut self, path: &Path) -> Error {
        self.path.get_or_insert_with(|| path.to_path_buf());
        self
    }

    /// Names the tensor.
    pub(crate) fn in_tensor(mut self, name: &str) -> Error {
        self.tensor.get_or_insert_with(|| name.to_string());
        self
    }
}

impl fmt::Display for Error {
    /// One line: the file and tensor (when the inner message does not name
    /// them already), then the inner message. The inner error is not also
    /// returned by `source()`, so chains print each cause once.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let msg = self.inner.to_string();
        if let Some(p) = &self.path {
            let shown = p.display().to_string();
            if !msg.contains(&shown) {
                write!(f, "{shown}: ")?;
            }
        }
        if let Some(t) = &self.tensor {
            if !msg.contains(t.as_str()) {
                write!(f, "tensor {t:?}: ")?;
            }
        }
        f.write_str(&msg)
    }
}

impl std::error::Error for Error {}

impl From<GgufError> for Error {
    fn from(e: GgufError) -> Error {
        let kind = match &e {
            GgufError::Io { error, .. } if error.kind() == io::ErrorKind::NotFound => {
                ErrorKind::NotFound
            }
            GgufError::MissingShard { .. } => ErrorKind::NotFound,
            GgufError::Io { .. } => ErrorKind::Io,
            _ => ErrorKind::InvalidFile,
        };
        Error::new(kind, e)
    }
}

impl From<CheckpointError> for Error {
    fn from(e: CheckpointError) -> Error {
        use crate::safetensors::SafetensorsError;
        let kind = match &e {
            CheckpointError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                ErrorKind::NotFound
            }
            CheckpointError::Io { .. } => ErrorKind::Io,
            CheckpointError::Safetensors(SafetensorsError::Io { source, .. })
                if source.kind() == io::ErrorKind::NotFound =>
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
        let mut err = Error::new(kind, e);
        err.row = row;
        err
    }
}

impl From<TableError> for Error {
    fn from(e: TableError) -> Error {
        let (kind, row) = match &e {
            TableError::RowOutOfRange { row, .. } => (ErrorKind::RowOutOfRange, Some(*row)),
            TableError::NegativeRow { .. } => (ErrorKind::RowOutOfRange, None),
            _ => (ErrorKind::NoTable, None),
        };
        let tensor = match &e {
            TableError::NoSuchTensor { name, .. }
            | TableError::NotTwoDimensional { name, .. }
            | TableError::PartialBlock { name, .. }
            | TableError::EmptyRows { name }
            | TableError::TooLarge { name, .. }
            | TableError::RowOutOfRange { name, .. }
            | TableError::NegativeRow { name, .. } => Some(name.clone()),
        };
        let mut err = Error::new(kind, e);
        err.row = row;
        err.tensor = tensor;
        err
    }
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Error {
        Error::new(ErrorKind::Unsupported, e)
    }
}

impl From<NgramError> for Error {
    fn from(e: NgramError) -> Error {
        Error::new(ErrorKind::RowIds, e)
    }
}

impl From<LookaheadError> for Error {
    fn from(e: LookaheadError) -> Error {
        match e {
            LookaheadError::Gather(g) => g,
            LookaheadError::OutputLength { .. } => Error::new(ErrorKind::OutputSize, e),
            other => Error::new(ErrorKind::Setup, other),
        }
    }
}

impl From<GatherError> for Error {
    fn from(e: GatherError) -> Error {
        match e {
            GatherError::Table(t) => Error::from(t),
            GatherError::Decode(d) => Error::from(d),
            e => {
                let row = match &e {
                    GatherError::MappedRead { row, .. } => Some(*row),
                    _ => None,
                };
                let (kind, offset, path) = match &e {
                    GatherError::OutsideFile { offset, .. }
                    | GatherError::Unmapped { offset, .. } => (ErrorKind::Io, Some(*offset), None),
                    GatherError::MappedRead { path, offset, .. } => {
                        (ErrorKind::Io, Some(*offset), Some(path.clone()))
                    }
                    GatherError::Read { path, error, .. } => {
                        let offset = match error {
                            IoError::Read { offset, .. }
                            | IoError::UnexpectedEof { offset, .. } => Some(*offset),
                            _ => None,
                        };
                        (ErrorKind::Io, offset, Some(path.clone()))
                    }
                    GatherError::OutputLength { .. } => (ErrorKind::OutputSize, None, None),
                    _ => (ErrorKind::Setup, None, None),
                };
                let mut err = Error::new(kind, e);
                err.offset = offset;
                err.path = path;
                err.row = row;
                err
            }
        }
    }
}
