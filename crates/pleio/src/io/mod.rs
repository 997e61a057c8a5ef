//! Read backends: positioned reads of planned byte spans into one staging
//! buffer.
//!
//! A [`ReadPlan`] lists byte spans of one file and where each lands in a
//! staging buffer. The spans are planned by the read pipeline's coalescer
//! ([`crate::coalesce`], gap mode: [`ReadPlan::fill`] takes one file's runs
//! of a multi-file plan; [`ReadPlan::for_rows`] plans sorted row ids of one
//! file). Every [`ReadBackend`] fills the staging buffer with exactly the
//! same bytes:
//!
//! - [`PreadBackend`]: positioned reads on the caller's thread, one span after
//!   another (queue depth 1);
//! - [`PoolBackend`]: the same reads spread over a persistent pool of reader
//!   threads for large batches, inline for small ones;
//! - [`UringBackend`]: one persistent io_uring, all spans in flight at a
//!   configurable queue depth, buffered or `O_DIRECT` (Linux only).
//!
//! The pool's threads and the ring belong to the process that made them: a
//! process forked from it makes its own on first use ([`process`]), so a
//! table opened before `fork()` works in the parent and in every child.
//!
//! A short read that reaches the end of the file is an error naming the
//! offset ([`IoError::UnexpectedEof`]), never a hang or a signal: nothing here
//! maps the file.
#![cfg(unix)]

mod pool;
mod pread;
pub(crate) mod process;
mod spans;
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // io_uring: buffers must outlive their reads
mod uring;
#[cfg(not(target_os = "linux"))]
#[path = "uring_stub.rs"]
mod uring;

use std::fs::File;
use std::io;
use std::path::PathBuf;

pub use pool::{PoolBackend, PoolConfig};
pub use pread::PreadBackend;
pub use spans::{PlanError, ReadPlan, RowReads, Span};
pub use uring::{Extent, UringBackend, UringConfig};

/// Errors from reading a plan. Each message includes its cause (the OS
/// error), which `source()` does not return again, so a printed error
/// chain names every cause once.
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
    #[error("read of {len} bytes at file offset {offset} failed: {error}")]
    Read {
        /// File offset of the failed read.
        offset: u64,
        /// Bytes asked for.
        len: usize,
        /// The OS error.
        error: io::Error,
    },
    /// The file ended before a span did (it is shorter than the plan says,
    /// e.g. truncated).
    #[error("file ends at offset {offset}, but a span needs bytes up to {end}")]
    UnexpectedEof {
        /// Where the file ends: its length when the short read was seen.
        offset: u64,
        /// The end of the span that needed it.
        end: u64,
    },
    /// The staging buffer is shorter than the plan needs.
    #[error("staging buffer holds {got} bytes but the plan needs {need}")]
    Staging {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// io_uring cannot be used here (old kernel, seccomp, or
    /// `kernel.io_uring_disabled`): fall back to another backend.
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
    /// An `O_DIRECT` read was asked for at an offset, length or buffer
    /// address that is not a multiple of the alignment.
    #[error("O_DIRECT read of {len} bytes at offset {offset} is not aligned to {align} bytes")]
    Misaligned {
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

/// What a backend did for one plan (for benchmarks and stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Read requests issued (syscalls or ring entries), including resubmits.
    pub requests: u64,
    /// Bytes asked of the file, including `O_DIRECT` alignment slack.
    pub bytes: u64,
    /// Short reads continued with another request.
    pub short_reads: u64,
}

impl ReadStats {
    fn add(&mut self, other: ReadStats) {
        self.requests += other.requests;
        self.bytes += other.bytes;
        self.short_reads += other.short_reads;
    }
}

/// A way of reading a [`ReadPlan`] from one file into a staging buffer.
///
/// Contract: on `Ok`, `staging[s.dst_offset..][..s.len]` holds the file's
/// bytes `[s.file_offset, s.file_offset + s.len)` for every span `s`, and
/// no other staging byte was written. On `Err`, the staging contents are
/// unspecified (but no read is still in flight). Backends are `Send + Sync`
/// and may be called from many threads at once.
pub trait ReadBackend: Send + Sync {
    /// Short name (`pread`, `pool`, `uring`, `uring-direct`).
    fn name(&self) -> &'static str;

    /// Read every span of `plan` into `staging` (at least
    /// [`ReadPlan::staging_len`] bytes).
    fn read(&self, plan: &ReadPlan, staging: &mut [u8]) -> Result<ReadStats, IoError>;
}

/// Open `path` read-only for random reads (readahead off).
fn open(path: &std::path::Path) -> Result<File, IoError> {
    let file = crate::sys::open_regular(path).map_err(|source| IoError::Open {
        path: path.to_path_buf(),
        error: source,
    })?;
    crate::sys::random_reads(&file);
    Ok(file)
}

/// Check the staging buffer is long enough for `plan`.
fn check_staging(plan: &ReadPlan, staging: &[u8]) -> Result<(), IoError> {
    if staging.len() < plan.staging_len() {
        return Err(IoError::Staging {
            need: plan.staging_len(),
            got: staging.len(),
        });
    }
    Ok(())
}

/// An end-of-file error with the file's real end: a read that returns no
/// bytes at `at` only says the file ends at or before `at`.
fn with_file_end(file: &File, e: IoError) -> IoError {
    match e {
        IoError::UnexpectedEof { offset, end } => IoError::UnexpectedEof {
            offset: file.metadata().map_or(offset, |m| m.len().min(offset)),
            end,
        },
        e => e,
    }
}

/// Fill `buf` from `file` at `offset`, looping on short reads and `EINTR`;
/// the end of the file before `buf` is full is [`IoError::UnexpectedEof`].
/// Returns the number of read calls made.
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> Result<ReadStats, IoError> {
    use std::os::unix::fs::FileExt;
    let end = offset + buf.len() as u64;
    let mut done = 0usize;
    let mut stats = ReadStats {
        bytes: buf.len() as u64,
        ..ReadStats::default()
    };
    while done < buf.len() {
        let at = offset + done as u64;
        stats.requests += 1;
        match file.read_at(&mut buf[done..], at) {
            Ok(0) => {
                return Err(with_file_end(
                    file,
                    IoError::UnexpectedEof { offset: at, end },
                ))
            }
            Ok(n) => {
                done += n;
                if done < buf.len() {
                    stats.short_reads += 1;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(IoError::Read {
                    offset: at,
                    len: buf.len() - done,
                    error: source,
                })
            }
        }
    }
    Ok(stats)
}

/// Split `staging` into the disjoint destination slices of `plan`'s spans,
/// each cut into pieces of at most `max_piece` bytes, paired with their
/// file offsets. Spans are validated ascending and non-overlapping in the
/// staging buffer, so this needs no unsafe code.
fn pieces<'a>(
    plan: &ReadPlan,
    staging: &'a mut [u8],
    max_piece: usize,
) -> Vec<(u64, &'a mut [u8])> {
    let max_piece = max_piece.max(1);
    let mut out = Vec::with_capacity(plan.spans().len());
    let mut rest = staging;
    let mut base = 0usize;
    for s in plan.spans() {
        let tail = std::mem::take(&mut rest);
        let (_, tail) = tail.split_at_mut(s.dst_offset - base);
        let (mut dst, tail) = tail.split_at_mut(s.len);
        rest = tail;
        base = s.dst_offset + s.len;
        let mut off = s.file_offset;
        while dst.len() > max_piece {
            let (head, t) = std::mem::take(&mut dst).split_at_mut(max_piece);
            out.push((off, head));
            off += max_piece as u64;
            dst = t;
        }
        if !dst.is_empty() {
            out.push((off, dst));
        }
    }
    out
}
