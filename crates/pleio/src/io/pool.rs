//! The [`Engine::Pool`](super::Engine::Pool) engine: positioned reads
//! spread over a persistent pool of reader threads.
//!
//! The threads belong to the process that started them: a process forked
//! from it (where they do not exist) starts its own pool on first use.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::process::PerProcess;
use super::{pread, IoError, Op, ReadStats};

/// A persistent pool of reader threads, created once, never per call;
/// concurrent callers share it. Each thread blocks in one read at a time,
/// so the thread count is the queue depth the device sees.
pub(super) struct Pool {
    threads: usize,
    /// Batches of fewer requests than this run inline on the caller's
    /// thread (no thread hop); a single request always does.
    inline_below: usize,
    /// The reader threads of each process using the pool.
    pool: PerProcess<rayon::ThreadPool>,
}

impl Pool {
    /// Starts `threads` reader threads (at least one).
    pub(super) fn new(threads: usize, inline_below: usize) -> Result<Pool, IoError> {
        let threads = threads.max(1);
        Ok(Pool {
            threads,
            inline_below,
            pool: PerProcess::new(start(threads)?),
        })
    }

    /// Runs `ops`, spread over the threads (one request at a time each,
    /// work-stealing) or inline when there are few.
    pub(super) fn run(&self, ops: &mut [Op<'_>]) -> Result<ReadStats, IoError> {
        if ops.len() < self.inline_below.max(2) {
            return pread::run(ops);
        }
        // A process forked since `new` starts its own threads here.
        let pool = self.pool.get_or_try_init(|| start(self.threads))?;
        let active = AtomicU64::new(0);
        let peak = AtomicU64::new(0);
        let stats = pool.install(|| {
            ops.par_iter_mut()
                .with_max_len(1)
                .map(|op| {
                    let now = active.fetch_add(1, Ordering::Relaxed) + 1;
                    peak.fetch_max(now, Ordering::Relaxed);
                    let r = pread::read_op(op);
                    active.fetch_sub(1, Ordering::Relaxed);
                    r
                })
                .try_reduce(ReadStats::default, |mut a, b| {
                    a.add(b);
                    Ok(a)
                })
        })?;
        Ok(ReadStats {
            peak_in_flight: peak.into_inner(),
            ..stats
        })
    }
}

/// Starts `threads` reader threads.
fn start(threads: usize) -> Result<rayon::ThreadPool, IoError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("pleio-read-{i}"))
        .stack_size(256 << 10)
        .build()
        .map_err(|e| IoError::Os {
            what: "starting reader threads",
            error: io::Error::other(e),
        })
}
