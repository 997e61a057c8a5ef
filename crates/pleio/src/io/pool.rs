//! Positioned reads spread over a persistent pool of reader threads.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;

use super::{check_staging, pieces, read_exact_at, IoError, ReadBackend, ReadPlan, ReadStats};

/// Settings of a [`PoolBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Reader threads, created once with the backend. Each blocks in one read
    /// at a time, so this is the queue depth the device sees.
    pub threads: usize,
    /// Batches of fewer read pieces than this run inline on the caller's
    /// thread (no thread hop). Measured on the build machine: a hop to the
    /// pool costs ~10-20 us, a cold 4 KiB read ~150 us at queue depth 1,
    /// so even two cold reads gain from the pool; see `benches/io.rs`.
    pub inline_below: usize,
    /// Spans longer than this are split into pieces read in parallel.
    pub piece_bytes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            threads: 32,
            inline_below: 2,
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
    pool: rayon::ThreadPool,
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
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.threads.max(1))
            .thread_name(|i| format!("pleio-read-{i}"))
            .stack_size(256 << 10)
            .build()
            .map_err(|e| IoError::Os {
                what: "starting reader threads",
                source: io::Error::other(e),
            })?;
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
        self.pool.install(|| {
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
