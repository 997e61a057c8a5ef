//! Lookahead: fetch a future batch's rows in the background while the
//! current batch computes.
//!
//! An engine knows a prompt's tokens (so its row ids) before the layers run.
//! [`Lookahead::prefetch`] hands a batch's row ids to a persistent worker
//! thread and returns at once with a [`Prefetch`] handle; the worker runs the
//! whole gather (I/O and decode, with the lookahead's [`Strategy`]) into a
//! buffer it owns. Completing the handle ([`Prefetch::wait`] or
//! [`Prefetch::wait_into`]) only hands that buffer over (or copies it): the
//! file is read once, by the worker, never again by the completion. The
//! [`LookaheadCounters`] make this checkable: one prefetch, one worker
//! gather, its rows counted once.
//!
//! Why a full background gather rather than warm-only prefetching (advice or
//! reads into the page cache, then a normal gather later): it works the same
//! for every strategy, including `O_DIRECT` ones that bypass the page cache,
//! and it hides the decode too, so the completion costs nothing but a hand
//! over. The price is one batch of output held per batch in flight
//! (5 MiB of f32 for a 512-token qwen4exp ubatch), bounded by what the
//! caller keeps in flight.
//!
//! One mechanism serves both entries: a [`Prefetcher`], a worker thread
//! per process started on first use. [`crate::Table::prefetch`], the public
//! entry, holds one per table (shared by its clones) and queues each batch
//! with the handle it was prefetched on; a [`Lookahead`] is a prefetcher
//! with a table and a strategy of its own, its worker started at once.
//!
//! After `fork()` the worker thread does not exist in the child: a child's
//! first prefetch starts the child's own worker. A batch prefetched before
//! the fork cannot be completed in the child (its worker is the parent's):
//! waiting for it there fails with [`LookaheadError::Forked`] at once
//! instead of blocking forever.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind};
use crate::fetch::{GatherStats, Strategy, Table};
use crate::io::process::PerProcess;
use crate::output::Dtype;

/// Finished buffers kept for reuse by [`Prefetch::wait_into`].
const POOL_BUFFERS: usize = 4;

/// Errors from a lookahead (the public entries report them as an
/// [`Error`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookaheadError {
    /// The background gather failed (e.g. a row id out of range); nothing
    /// was written to the caller's output.
    #[error(transparent)]
    Gather(#[from] Error),
    /// The worker thread could not be started.
    #[error("cannot start the lookahead worker thread: {0}")]
    Spawn(std::io::Error),
    /// The worker thread is gone (it panicked), so the batch was not
    /// fetched.
    #[error("the lookahead worker thread stopped before finishing the batch")]
    WorkerGone,
    /// The batch was prefetched by another process (before a `fork()`):
    /// its worker thread is that process's. Prefetch it again here.
    #[error(
        "this batch was prefetched in process {by} before a fork; this is process {now}: \
         prefetch it again here"
    )]
    Forked {
        /// The process that prefetched it.
        by: u32,
        /// The calling process.
        now: u32,
    },
    /// The caller's output does not hold the batch's floats (or bytes, for
    /// a batch of another dtype than f32).
    #[error("output holds {got} {unit} but the prefetched batch has {need}")]
    OutputLength {
        /// Floats (bytes) given.
        got: usize,
        /// Floats (bytes) in the batch.
        need: usize,
        /// `floats` or `bytes`.
        unit: &'static str,
    },
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

/// Running totals of one [`Lookahead`], to check what was read when.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookaheadCounters {
    /// Prefetches issued.
    pub prefetches: u64,
    /// Gathers the worker ran (each reads its batch's rows once).
    pub worker_gathers: u64,
    /// Row ids the worker gathered (duplicates counted).
    pub worker_rows: u64,
    /// Prefetches skipped because their handle was dropped before the
    /// worker reached them.
    pub cancelled: u64,
    /// Direct gathers run on the caller's thread by [`Lookahead::gather`].
    pub direct_gathers: u64,
}

#[derive(Debug, Default)]
struct Counters {
    prefetches: AtomicU64,
    worker_gathers: AtomicU64,
    worker_rows: AtomicU64,
    cancelled: AtomicU64,
    direct_gathers: AtomicU64,
}

#[derive(Debug, Default)]
struct Shared {
    counters: Counters,
    pool: Mutex<Vec<Vec<f32>>>,
}

impl Shared {
    // `try_lock`: reusing a buffer is optional, and a process forked while
    // another thread held the lock must not wait for it forever.
    fn take_buffer(&self) -> Vec<f32> {
        self.pool
            .try_lock()
            .ok()
            .and_then(|mut p| p.pop())
            .unwrap_or_default()
    }

    fn recycle(&self, buf: Vec<f32>) {
        if let Ok(mut p) = self.pool.try_lock() {
            if p.len() < POOL_BUFFERS {
                p.push(buf);
            }
        }
    }
}

/// What the worker hands back for one batch.
type Outcome = Result<Prefetched, Error>;

struct Job {
    /// The handle to gather with (its decoder, cache and rounding).
    reader: Table,
    strategy: Strategy,
    dtype: Dtype,
    rows: Vec<u64>,
    issued: Instant,
    cancelled: Arc<AtomicBool>,
    reply: SyncSender<Outcome>,
}

/// A persistent worker thread per process, started on first use, that
/// runs queued gathers in the order queued; each batch carries the table
/// handle to gather with.
///
/// Dropping it lets the worker finish the batches whose handles are still
/// alive, then joins it.
#[derive(Debug)]
pub struct Prefetcher {
    shared: Arc<Shared>,
    /// The worker of each process using the prefetcher (see the module
    /// documentation on `fork()`).
    worker: PerProcess<Worker>,
}

impl Default for Prefetcher {
    /// No worker yet: the first prefetch (or [`Prefetcher::start`]) of each
    /// process starts its own.
    fn default() -> Prefetcher {
        Prefetcher {
            shared: Arc::default(),
            worker: PerProcess::lazy(),
        }
    }
}

impl Prefetcher {
    /// This process's worker, started if it is not running yet.
    pub(crate) fn start(&self) -> Result<(), LookaheadError> {
        self.worker
            .get_or_try_init(|| Worker::start(&self.shared))
            .map(drop)
            .map_err(LookaheadError::Spawn)
    }

    /// Starts fetching `rows` as `dtype` from `reader` (with its strategy
    /// and rounding) in the background.
    pub(crate) fn prefetch_on(&self, reader: Table, dtype: Dtype, rows: &[u64]) -> Prefetch {
        self.shared
            .counters
            .prefetches
            .fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = mpsc::sync_channel(1);
        let cancelled = Arc::new(AtomicBool::new(false));
        let job = Job {
            strategy: reader.strategy(),
            reader,
            dtype,
            rows: rows.to_vec(),
            issued: Instant::now(),
            cancelled: cancelled.clone(),
            reply,
        };
        let mut ready = None;
        // A process forked since the worker started starts its own here.
        match self.worker.get_or_try_init(|| Worker::start(&self.shared)) {
            // A send fails only if the worker died; the handle then reports
            // `WorkerGone` at wait (its reply sender is dropped with the job).
            Ok(w) => {
                if let Some(tx) = &w.tx {
                    let _ = tx.send(job);
                }
            }
            Err(e) => ready = Some(Err(LookaheadError::Spawn(e))),
        }
        Prefetch {
            rx: Some(rx),
            cancelled,
            shared: self.shared.clone(),
            ready,
            pid: crate::sys::pid(),
        }
    }
}

/// Background fetching of future batches for one table, with one strategy,
/// on one persistent worker thread (batches run in the order prefetched):
/// a [`Prefetcher`] with a table and strategy of its own.
///
/// Dropping the lookahead lets the worker finish the batches whose handles
/// are still alive, then joins it.
#[derive(Debug)]
pub struct Lookahead {
    reader: Table,
    strategy: Strategy,
    prefetcher: Prefetcher,
}

/// One process's worker thread and its queue.
#[derive(Debug)]
struct Worker {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    fn start(shared: &Arc<Shared>) -> std::io::Result<Worker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pleio-lookahead".into())
            .spawn(move || worker(&shared, &rx))?;
        Ok(Worker {
            tx: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for Worker {
    /// Lets the worker finish the batches whose handles are still alive,
    /// then joins it.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.thread.take() {
            // A panicked worker has already reported `WorkerGone` to its
            // handles; nothing more to do here.
            let _ = w.join();
        }
    }
}

impl Lookahead {
    /// Starts the worker for `reader`, gathering with `strategy`.
    pub fn new(reader: Table, strategy: Strategy) -> Result<Lookahead, LookaheadError> {
        // Without the table's own prefetch worker: a batch never holds the
        // worker that runs it.
        let reader = reader.detached().with_strategy(strategy);
        let prefetcher = Prefetcher::default();
        prefetcher.start()?;
        Ok(Lookahead {
            reader,
            strategy,
            prefetcher,
        })
    }

    /// The reader gathered from.
    pub fn reader(&self) -> &Table {
        &self.reader
    }

    /// The strategy every gather uses.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Starts fetching `rows` (as f32) in the background and returns at
    /// once. Errors (a bad row id) are reported by the handle's `wait`.
    pub fn prefetch(&self, rows: &[u64]) -> Prefetch {
        self.prefetcher
            .prefetch_on(self.reader.clone(), Dtype::F32, rows)
    }

    /// Gathers `rows` now, on the caller's thread (for batches that were
    /// not prefetched).
    pub fn gather(&self, rows: &[u64], out: &mut [f32]) -> Result<GatherStats, Error> {
        self.prefetcher
            .shared
            .counters
            .direct_gathers
            .fetch_add(1, Ordering::Relaxed);
        self.reader.gather_with(self.strategy, rows, out)
    }

    /// Gives a buffer from [`Prefetched::data`] back for reuse.
    pub fn recycle(&self, buf: Vec<f32>) {
        self.prefetcher.shared.recycle(buf);
    }

    /// Totals so far.
    pub fn counters(&self) -> LookaheadCounters {
        let c = &self.prefetcher.shared.counters;
        LookaheadCounters {
            prefetches: c.prefetches.load(Ordering::Relaxed),
            worker_gathers: c.worker_gathers.load(Ordering::Relaxed),
            worker_rows: c.worker_rows.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            direct_gathers: c.direct_gathers.load(Ordering::Relaxed),
        }
    }
}

/// The worker loop: one job at a time, until the lookahead is dropped and
/// the queue is drained.
fn worker(shared: &Shared, rx: &Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        if job.cancelled.load(Ordering::Acquire) {
            shared.counters.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let started = Instant::now();
        let reader = &job.reader;
        let (mut data, mut bytes) = (Vec::new(), Vec::new());
        let result = if job.dtype == Dtype::F32 {
            data = shared.take_buffer();
            data.clear();
            data.resize(job.rows.len().saturating_mul(reader.row_elems()), 0.0);
            reader.gather_with(job.strategy, &job.rows, &mut data)
        } else {
            match reader.out_bytes(job.dtype, job.rows.len()) {
                Some(n) => {
                    bytes.resize(n, 0);
                    reader.gather_as_with(job.strategy, job.dtype, &job.rows, &mut bytes)
                }
                None => Err(Error::new(
                    ErrorKind::OutputSize,
                    LookaheadError::OutputLength {
                        got: 0,
                        need: usize::MAX,
                        unit: "bytes",
                    },
                )),
            }
        };
        let c = &shared.counters;
        c.worker_gathers.fetch_add(1, Ordering::Relaxed);
        c.worker_rows
            .fetch_add(job.rows.len() as u64, Ordering::Relaxed);
        let outcome = result.map(|stats| Prefetched {
            rows: job.rows,
            dtype: job.dtype,
            data,
            bytes,
            stats,
            queued: started.duration_since(job.issued),
            fetch_time: started.elapsed(),
            waited: Duration::ZERO,
        });
        // The handle may have been dropped meanwhile: then nobody wants it.
        let _ = job.reply.send(outcome);
    }
}

/// A batch fetched by the worker.
#[derive(Debug)]
#[non_exhaustive]
pub struct Prefetched {
    /// The row ids, as prefetched.
    pub rows: Vec<u64>,
    /// The output type the rows were fetched as.
    pub dtype: Dtype,
    /// Their decoded rows for [`Dtype::F32`], `rows.len() * row_elems`
    /// floats in request order; empty for another dtype.
    pub data: Vec<f32>,
    /// Their rows as `dtype` bytes for the other dtypes (little-endian,
    /// rows back to back, as [`crate::Table::gather_as`] writes them);
    /// empty for [`Dtype::F32`].
    pub bytes: Vec<u8>,
    /// What the worker's gather did (its thread took any faults).
    pub stats: GatherStats,
    /// From `prefetch` until the worker started on the batch.
    pub(crate) queued: Duration,
    /// The worker's gather time.
    pub(crate) fetch_time: Duration,
    /// How long the completing caller blocked waiting for the worker (zero
    /// when the batch was ready): the fetch time left exposed.
    pub(crate) waited: Duration,
}

impl Prefetched {
    /// From `prefetch` until the worker started on the batch.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn queued(&self) -> Duration {
        self.queued
    }

    /// The worker's gather time.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn fetch_time(&self) -> Duration {
        self.fetch_time
    }

    /// How long the completing caller blocked waiting for the worker.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn waited(&self) -> Duration {
        self.waited
    }
}

/// A batch being fetched in the background (see
/// [`crate::Table::prefetch`]).
///
/// Dropping it unawaited is safe: a batch not yet started is skipped, one
/// in progress finishes and is discarded.
#[derive(Debug)]
pub struct Prefetch {
    /// The worker's reply; `None` only while dropping (see the `Drop`).
    rx: Option<Receiver<Outcome>>,
    cancelled: Arc<AtomicBool>,
    shared: Arc<Shared>,
    ready: Option<Result<Outcome, LookaheadError>>,
    /// The process that prefetched the batch (its worker fetches it).
    pid: u32,
}

impl Prefetch {
    /// True once the worker has finished (or given up on) the batch; never
    /// blocks.
    pub fn is_ready(&mut self) -> bool {
        if self.ready.is_none() {
            self.forked();
        }
        if self.ready.is_none() {
            let Some(rx) = &self.rx else {
                return false;
            };
            self.ready = match rx.try_recv() {
                Ok(o) => Some(Ok(o)),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Err(LookaheadError::WorkerGone)),
            };
        }
        self.ready.is_some()
    }

    /// Blocks until the batch is fetched and takes it: the rows, their
    /// output and the worker's stats. Reads nothing itself. A failed
    /// gather (a bad row id, a read error) is its error.
    pub fn wait(self) -> Result<Prefetched, Error> {
        Ok(self.take()?)
    }

    fn take(mut self) -> Result<Prefetched, LookaheadError> {
        self.forked();
        let t = Instant::now();
        let got = match self.ready.take() {
            Some(r) => r,
            None => self
                .rx
                .as_ref()
                .ok_or(LookaheadError::WorkerGone)
                .and_then(|rx| rx.recv().map_err(|_| LookaheadError::WorkerGone)),
        };
        let mut p = got??;
        p.waited = t.elapsed();
        Ok(p)
    }

    /// Like [`Prefetch::wait`], but copies the floats of an f32 batch into
    /// `out` (which must hold exactly the batch) and keeps the worker's
    /// buffer for reuse. On error `out` is untouched.
    pub fn wait_into(self, out: &mut [f32]) -> Result<Prefetched, Error> {
        let shared = self.shared.clone();
        let mut p = self.take()?;
        if p.dtype != Dtype::F32 || out.len() != p.data.len() {
            return Err(LookaheadError::OutputLength {
                got: out.len(),
                need: p.data.len(),
                unit: "floats",
            }
            .into());
        }
        out.copy_from_slice(&p.data);
        shared.recycle(std::mem::take(&mut p.data));
        Ok(p)
    }

    /// Like [`Prefetch::wait`], but copies the batch as the bytes of its
    /// dtype (f32 rows as little-endian floats) into `out`, which must hold
    /// exactly [`crate::Table::out_bytes`]`(dtype, rows)`. On error `out`
    /// is untouched. (With `internals`: an engine uses [`Prefetch::wait`]
    /// and [`Prefetched::bytes`].)
    #[cfg(feature = "internals")]
    pub fn wait_into_bytes(self, out: &mut [u8]) -> Result<Prefetched, Error> {
        let shared = self.shared.clone();
        let mut p = self.take()?;
        let need = if p.dtype == Dtype::F32 {
            p.data.len().saturating_mul(4)
        } else {
            p.bytes.len()
        };
        if out.len() != need {
            return Err(LookaheadError::OutputLength {
                got: out.len(),
                need,
                unit: "bytes",
            }
            .into());
        }
        if p.dtype == Dtype::F32 {
            crate::quant::convert::f32_row_le(&p.data, out);
            shared.recycle(std::mem::take(&mut p.data));
        } else {
            out.copy_from_slice(&p.bytes);
        }
        Ok(p)
    }
}

impl Prefetch {
    /// In a process forked since the prefetch, the outcome is
    /// [`LookaheadError::Forked`]: the worker that would send it is the
    /// parent's.
    fn forked(&mut self) {
        let now = crate::sys::pid();
        if self.ready.is_none() && now != self.pid {
            self.ready = Some(Err(LookaheadError::Forked { by: self.pid, now }));
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::Release);
        // In a forked child the channel may be in the middle of a send by
        // the parent's worker, a thread the child does not have: dropping
        // the receiver waits for that send to finish, forever (a child's
        // `wait` on its parent's batch hung spinning in
        // `discard_all_messages`). There it is leaked instead.
        if crate::sys::pid() != self.pid {
            std::mem::forget(self.rx.take());
        }
    }
}
