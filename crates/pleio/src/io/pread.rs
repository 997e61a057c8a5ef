//! Positioned reads (`pread`) on the calling thread: the [`Engine::Pread`]
//! engine, and each read of the [`Engine::Pool`] engine's threads.
//!
//! [`Engine::Pread`]: super::Engine::Pread
//! [`Engine::Pool`]: super::Engine::Pool

use std::io;
use std::os::unix::fs::FileExt;

use super::{IoError, Op, ReadStats};

/// Fills `op.buf` from its file, looping on short reads and `EINTR` until
/// `op.want` bytes are in; the end of the file before that is
/// [`IoError::UnexpectedEof`]. With `O_DIRECT`, a short read that stops off
/// the file's alignment has met the end of the file.
pub(super) fn read_op(op: &mut Op<'_>) -> Result<ReadStats, IoError> {
    let (f, want) = (op.file, op.want);
    if want == 0 {
        // Only slack past what is needed: nothing to ask of the file.
        return Ok(ReadStats::default());
    }
    let end = op.offset + want as u64;
    let mut done = 0usize;
    let mut stats = ReadStats {
        bytes: op.buf.len() as u64,
        peak_in_flight: 1,
        ..ReadStats::default()
    };
    while done < want {
        let at = op.offset + done as u64;
        stats.requests += 1;
        match f.file.read_at(&mut op.buf[done..], at) {
            Ok(0) => return Err(f.eof(at, end)),
            Ok(n) => {
                done += n;
                if done < want {
                    stats.short_reads += 1;
                    if !done.is_multiple_of(f.align) {
                        return Err(f.eof(op.offset + done as u64, end));
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(f.failed(at, op.buf.len() - done, e)),
        }
    }
    Ok(stats)
}

/// Every op in order on this thread.
pub(super) fn run(ops: &mut [Op<'_>]) -> Result<ReadStats, IoError> {
    let mut stats = ReadStats::default();
    for op in ops {
        stats.add(read_op(op)?);
    }
    Ok(stats)
}
