//! Reading: positioned reads of byte ranges of a table's files into one
//! staging buffer, through one [`Reader`].
//!
//! A [`Reader`] holds every file of a table (a GGUF tensor: one; a
//! checkpoint: each file its rows are in) and reads a batch of [`Read`]s
//! (file, offset, length, where in staging) with up to its queue depth in
//! flight *across* files, never file after file. How the reads are done is
//! its [`Engine`]; every engine fills staging with exactly the same bytes:
//! (The reads are planned by the read pipeline's coalescer, [`crate::coalesce`];
//! [`ReadPlan`] holds one file's gap-mode runs.)
//!
//! Engines:
//!
//! - [`Engine::Pread`]: positioned reads on the caller's thread, one after
//!   another (queue depth 1);
//! - [`Engine::Pool`]: the same reads spread over a persistent pool of
//!   reader threads (as many as the queue depth) for large batches, inline
//!   for small ones: the stand-in where io_uring is unavailable;
//! - [`Engine::Uring`]: one persistent io_uring, every read of the batch in
//!   flight at up to the queue depth (Linux only).
//!
//! Any engine reads buffered or with `O_DIRECT` ([`ReaderConfig::direct`]):
//! then each file's own alignment applies, an aligned read lands straight
//! in staging, and an unaligned one is read as the aligned blocks covering
//! it into bounded scratch and copied out.
//!
//! The pool's threads and the ring belong to the process that made them: a
//! process forked from it makes its own on first use ([`process`]), so a
//! table opened before `fork()` works in the parent and in every child.
//!
//! A short read that reaches the end of the file is an error naming the
//! file and offset ([`IoError::UnexpectedEof`]), never a hang or a signal:
//! nothing here maps the file.
#![cfg(unix)]

mod pool;
mod pread;
pub(crate) mod process;
mod reader;
mod spans;
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // io_uring: buffers must outlive their reads
mod uring;
#[cfg(not(target_os = "linux"))]
#[path = "uring_stub.rs"]
mod uring;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

pub use reader::{Engine, Read, Reader, ReaderConfig};
pub use spans::{PlanError, ReadPlan, RowReads, Span};

/// Errors from reading. Each message includes its cause (the OS error),
/// which `source()` does not return again, so a printed error chain names
/// every cause once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The file could not be opened.
    #[error("cannot open {path}: {error}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// A read failed.
    #[error("read of {len} bytes of {path} at offset {offset} failed: {error}", path = path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// File offset of the failed read.
        offset: u64,
        /// Bytes asked for.
        len: usize,
        /// The OS error.
        error: io::Error,
    },
    /// The file ended before a read did (it is shorter than the plan says,
    /// e.g. truncated).
    #[error("{path} ends at offset {offset}, but a read needs bytes up to {end}", path = path.display())]
    UnexpectedEof {
        /// The file.
        path: PathBuf,
        /// Where the file ends: its length when the short read was seen.
        offset: u64,
        /// The end of the read that needed it.
        end: u64,
    },
    /// The staging buffer is shorter than the reads need.
    #[error("staging buffer holds {got} bytes but the reads need {need}")]
    Staging {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// The reads are not a valid batch (a file index past the reader's
    /// files, destinations out of order or overlapping, more bytes needed
    /// than read).
    #[error("read {index}: {reason}")]
    BadRead {
        /// Index of the offending read in the batch.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// io_uring cannot be used here (old kernel, seccomp, or
    /// `kernel.io_uring_disabled`): fall back to another engine.
    #[error("io_uring is unavailable: {0}")]
    UringUnavailable(io::Error),
    /// The file system refuses `O_DIRECT` for this file.
    #[error("O_DIRECT reads are not supported for {path}: {reason}")]
    DirectUnsupported {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An `O_DIRECT` read that must land in place (the device floor's) is
    /// not a multiple of its file's alignment.
    #[error("O_DIRECT read of {len} bytes of {path} at offset {offset} is not aligned to {align} bytes", path = path.display())]
    Misaligned {
        /// The file.
        path: PathBuf,
        /// File offset of the read.
        offset: u64,
        /// Its length.
        len: usize,
        /// The alignment required.
        align: usize,
    },
    /// The OS refused a setup step (ring submission, thread creation).
    #[error("{what}: {error}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        error: io::Error,
    },
}

impl IoError {
    /// The file the error is about, when it names one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            IoError::Open { path, .. }
            | IoError::Read { path, .. }
            | IoError::UnexpectedEof { path, .. }
            | IoError::DirectUnsupported { path, .. }
            | IoError::Misaligned { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The file offset the error is about, when it names one.
    pub fn offset(&self) -> Option<u64> {
        match self {
            IoError::Read { offset, .. }
            | IoError::UnexpectedEof { offset, .. }
            | IoError::Misaligned { offset, .. } => Some(*offset),
            _ => None,
        }
    }
}

/// What a reader did for one batch (for benchmarks and stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Read requests issued (syscalls or ring entries), including resubmits.
    pub requests: u64,
    /// Bytes asked of the files, including `O_DIRECT` alignment slack.
    pub bytes: u64,
    /// Short reads continued with another request.
    pub short_reads: u64,
    /// The most requests in flight at once (at most the queue depth).
    pub peak_in_flight: u64,
}

impl ReadStats {
    fn add(&mut self, other: ReadStats) {
        self.requests += other.requests;
        self.bytes += other.bytes;
        self.short_reads += other.short_reads;
        self.peak_in_flight = self.peak_in_flight.max(other.peak_in_flight);
    }
}

/// One aligned read of the row cache's chunk plans: `len` bytes of a file
/// at `offset`, of which at least `want` must arrive (the rest is alignment
/// slack that may lie past the end of the file); read as a [`Read`] with
/// `need: want`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// File offset.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Bytes that must arrive (at most `len`).
    pub want: usize,
}

/// One open file of a [`Reader`].
#[derive(Debug)]
struct FileEntry {
    path: PathBuf,
    file: File,
    /// `O_DIRECT` alignment (offset, length and memory), 1 when buffered.
    align: usize,
}

impl FileEntry {
    /// An end-of-file error for a read of this file that needed bytes up
    /// to `end` and got none at `at`: the file's real end is given (a read
    /// that returns no bytes at `at` only says the file ends at or before
    /// `at`).
    fn eof(&self, at: u64, end: u64) -> IoError {
        IoError::UnexpectedEof {
            path: self.path.clone(),
            offset: self.file.metadata().map_or(at, |m| m.len().min(at)),
            end,
        }
    }

    /// Whether a read of `len` bytes at `offset` into memory at `addr`
    /// lands in place: always when buffered; with `O_DIRECT` when all
    /// three are multiples of the file's alignment.
    fn in_place(&self, offset: u64, len: usize, addr: usize, direct: bool) -> bool {
        let a = self.align;
        !direct
            || (offset.is_multiple_of(a as u64) && len.is_multiple_of(a) && addr.is_multiple_of(a))
    }

    /// A failed read of `len` bytes at `offset`.
    fn failed(&self, offset: u64, len: usize, error: io::Error) -> IoError {
        IoError::Read {
            path: self.path.clone(),
            offset,
            len,
            error,
        }
    }
}

/// Where the ring hands each complete op, with its index, in op order
/// (see [`Reader::read_each`]); `None` when the caller waits for all.
type Ready<'r> = Option<&'r mut dyn FnMut(usize, &Op<'_>)>;

/// One request an engine performs: fill `buf` from `file` at `offset`; at
/// least `want` bytes must arrive (the rest is `O_DIRECT` slack that may
/// lie past the end of the file).
struct Op<'a> {
    file: &'a FileEntry,
    offset: u64,
    buf: &'a mut [u8],
    want: usize,
}
