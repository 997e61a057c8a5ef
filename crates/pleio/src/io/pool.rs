//! Positioned reads spread over a persistent pool of reader threads.
//!
//! The threads belong to the process that started them: a process forked
//! from it (where they do not exist) starts its own pool on first use.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;

use super::process::PerProcess;
use super::{check_staging, pieces, read_exact_at, IoError, ReadBackend, ReadPlan, ReadStats};

/// Settings of a [`PoolBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Reader threads, created once with the backend. Each blocks in one read
    /// at a time, so this is the queue depth the device sees. Default 32:
    /// on the build machine 16 / 32 / 64 threads read cold random 4 KiB
    /// pages at ~54-61k / ~59-67k / ~60-66k IOPS (1792 and 8192 pages).
    pub threads: usize,
    /// Batches of fewer read pieces than this run inline on the caller's
    /// thread (no thread hop); a single piece always does. Measured on the
    /// build machine (`measure_pool_split_point` in `tests/io_backends.rs`,
    /// medians of noisy runs): cold, 2 pages cost ~170 us inline and ~180 us
    /// through the pool, 3 pages ~250 vs ~170-190 us, 4 pages ~330 vs
    /// ~150-210 us, so the pool wins from 3 on. Warm, the hop to the pool
    /// costs 7-70 us against ~1 us inline at every size up to 64, so warm
    /// batches should not be sent here at all (the caller's residency check
    /// decides that, not this threshold).
    pub inline_below: usize,
    /// Spans longer than this are split into pieces read in parallel.
    pub piece_bytes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            threads: 32,
            inline_below: 3,
            piece_bytes: 1 << 20,
        }
    }
}

/// A persistent pool of reader threads doing positioned reads: large
/// batches are spread over the pool (work-stealing, one piece at a time),
/// small ones are read inline on the caller's thread. Threads are created
/// once in [`PoolBackend::new`], never per call. Concurrent callers share
/// the pool.
pub struct PoolBackend {
    file: Arc<File>,
    /// The reader threads of each process using the backend.
    pool: PerProcess<rayon::ThreadPool>,
    cfg: PoolConfig,
}

impl std::fmt::Debug for PoolBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolBackend")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl PoolBackend {
    /// Start `cfg.threads` reader threads (at least one) reading `file`.
    pub fn new(file: Arc<File>, cfg: PoolConfig) -> Result<PoolBackend, IoError> {
        let pool = PerProcess::new(start(cfg)?);
        Ok(PoolBackend { file, pool, cfg })
    }

    /// Open `path` read-only and start the pool.
    pub fn open(path: &Path, cfg: PoolConfig) -> Result<PoolBackend, IoError> {
        PoolBackend::new(Arc::new(super::open(path)?), cfg)
    }

    /// The settings in force.
    pub fn config(&self) -> PoolConfig {
        self.cfg
    }
}

impl ReadBackend for PoolBackend {
    fn name(&self) -> &'static str {
        "pool"
    }

    fn read(&self, plan: &ReadPlan, staging: &mut [u8]) -> Result<ReadStats, IoError> {
        check_staging(plan, staging)?;
        let work = pieces(plan, staging, self.cfg.piece_bytes);
        let file: &File = &self.file;
        if work.len() < self.cfg.inline_below.max(2) {
            let mut stats = ReadStats::default();
            for (offset, dst) in work {
                stats.add(read_exact_at(file, dst, offset)?);
            }
            return Ok(stats);
        }
        // A process forked since `new` starts its own threads here.
        let pool = self.pool.get_or_try_init(|| start(self.cfg))?;
        pool.install(|| {
            work.into_par_iter()
                .with_max_len(1)
                .map(|(offset, dst)| read_exact_at(file, dst, offset))
                .try_reduce(ReadStats::default, |mut a, b| {
                    a.add(b);
                    Ok(a)
                })
        })
    }
}

/// Starts `cfg.threads` reader threads (at least one).
fn start(cfg: PoolConfig) -> Result<rayon::ThreadPool, IoError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads.max(1))
        .thread_name(|i| format!("pleio-read-{i}"))
        .stack_size(256 << 10)
        .build()
        .map_err(|e| IoError::Os {
            what: "starting reader threads",
            error: io::Error::other(e),
        })
}
