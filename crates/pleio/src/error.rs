//! [`Error`]: the one error of the public entry point ([`crate::Table`]),
//! from opening a file to gathering its rows.
//!
//! Lower layers keep their own typed errors ([`crate::gguf::GgufError`],
//! [`crate::layout::TableError`], [`crate::fetch::GatherError`], ...); an
//! [`Error`] wraps one of them, says which [`ErrorKind`] it is, and carries
//! the path, tensor, row and offset at fault where they are known.

//!
//! This module is a leaf: it imports nothing of the crate. Each lower layer
//! converts its own error (`impl From<GgufError> for Error` lives in
//! `gguf`), so no module depends on one that depends on it.

use std::fmt;
use std::path::{Path, PathBuf};

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
    /// A remote table source (a Redis cluster) failed: a node that does not
    /// answer or refuses the credentials, a timeout, or a row whose check
    /// does not match. Never zero rows: the gather fails.
    Remote,
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
    /// An error of `kind` wrapping a lower layer's `inner`.
    pub(crate) fn new(
        kind: ErrorKind,
        inner: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
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

    /// The lower layer's error this one wraps (the tests match on it; an
    /// engine has `kind()`, the accessors and the message).
    #[cfg(feature = "internals")]
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

    /// Sets the row, offset and file at fault (for the lower layers'
    /// conversions; `None` leaves a field unknown).
    pub(crate) fn at(
        mut self,
        row: Option<u64>,
        offset: Option<u64>,
        path: Option<PathBuf>,
    ) -> Error {
        self.row = row;
        self.offset = offset;
        self.path = path;
        self
    }

    /// Sets the tensor at fault.
    pub(crate) fn of_tensor(mut self, tensor: Option<String>) -> Error {
        self.tensor = tensor;
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
