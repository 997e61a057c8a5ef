//! The gather benchmark behind `pleio bench`: every strategy on the same
//! random row lists, cold (the table's byte range evicted before each batch,
//! checked with `mincore`) and warm (the same rows again, resident), plus the
//! device floor (`limit`, [`crate::floor`]: the batch's distinct extents
//! read with `O_DIRECT` at the queue depth a sweep found fastest, measured
//! in the same run; its figure is the median of at least
//! [`MIN_FLOOR_SAMPLES`] reads).
//!
//! Per arm: mean, median and p99 latency, bytes the process read from the
//! device (`/proc/self/io`), major faults of the gathering thread, advice
//! failures, read requests, peak RSS during a gather (`VmHWM`, reset before
//! each gather through `/proc/self/clear_refs`), and the ratio to `fault`
//! (mean over mean) and to `limit` (mean over the floor's median). Every arm's f32 output is compared bit for bit with the
//! first arm's output for the same rows; a difference fails the run.
//!
//! Library code so other commands (`demo`, `replay`) can reuse the pieces:
//! [`Evictor`], [`proc_read_bytes`], [`peak_rss`], [`Machine`].

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::random::Rng;
use pleio::gguf::GgufError;
use pleio::io::IoError;
use pleio::layout::{Layout, TableError};
use pleio::map::ResidencyMethod;
use pleio::sys;
use pleio::{Dtype, Error, GatherStats, Strategy, Table};

use crate::floor::{summary, DepthSweep, Floor};
use crate::warm_floor::{WarmFloor, WarmFloorError};

/// Least timed reads behind each `limit` figure: batches are read several
/// times when there are fewer (a median of 10 is at the mercy of noise).
pub const MIN_FLOOR_SAMPLES: usize = 30;

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The file is not a readable GGUF.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// No table to read.
    #[error(transparent)]
    Table(#[from] TableError),
    /// A gather failed.
    #[error("{strategy}: {error}")]
    Gather {
        /// The strategy.
        strategy: &'static str,
        /// What went wrong.
        error: Error,
    },
    /// The `limit` arm's `O_DIRECT` reads failed.
    #[error("limit arm (O_DIRECT io_uring): {0}")]
    Limit(IoError),
    /// The table could not be evicted from the page cache.
    #[error("cannot evict the table from the page cache: {0}")]
    Evict(String),
    /// `--cold mincore` found too few nonresident rows.
    #[error("found only {found} of {want} rows on nonresident pages")]
    NoColdRows {
        /// Rows found.
        found: usize,
        /// Rows wanted.
        want: usize,
    },
    /// Two arms decoded the same rows to different bits.
    #[error("{strategy} wrote different bits than {reference} for the same {rows} rows (batch {batch}, {phase})")]
    Mismatch {
        /// The arm that differs.
        strategy: &'static str,
        /// The arm it was compared with.
        reference: &'static str,
        /// Rows in the batch.
        rows: usize,
        /// Batch index.
        batch: usize,
        /// `cold` or `warm`.
        phase: &'static str,
    },
    /// The configuration cannot run.
    #[error("{0}")]
    Config(String),
    /// The batches would need more memory than the machine has.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// How cold batches are made cold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColdMode {
    /// Before each cold batch, the table's byte range is dropped from this
    /// process's page tables and from the page cache
    /// (`posix_fadvise(DONTNEED)`), verified with `mincore`.
    Evict,
    /// Nothing is evicted: each cold batch's rows are drawn among rows
    /// whose pages `mincore` reports nonresident (the reference's method).
    Mincore,
    /// No cold arms: warm arms only.
    None,
}

impl ColdMode {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ColdMode::Evict => "evict",
            ColdMode::Mincore => "mincore",
            ColdMode::None => "none",
        }
    }
}

impl FromStr for ColdMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [ColdMode::Evict, ColdMode::Mincore, ColdMode::None]
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown cold mode {s:?} (known: evict, mincore, none)"))
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Batch sizes (rows per gather).
    pub rows: Vec<usize>,
    /// Strategies to run (`fault` is added if missing: ratios need it).
    pub strategies: Vec<Strategy>,
    /// Cold batches per size (also the number of distinct warm row lists).
    pub batches: usize,
    /// How cold batches are made.
    pub cold: ColdMode,
    /// Seed of the row lists.
    pub seed: u64,
    /// Include the `limit` arm (the device floor, cold) and the
    /// `limit-warm` arm (the warm floor, [`crate::warm_floor`]).
    pub limit: bool,
    /// What the gathers write: f32 (the default), bf16, f16 or the stored
    /// bytes (`raw`).
    pub dtype: Dtype,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            rows: vec![16, 1792, 8192],
            strategies: Strategy::ALL.to_vec(),
            batches: 30,
            cold: ColdMode::Evict,
            seed: 1,
            limit: true,
            dtype: Dtype::F32,
        }
    }
}

/// The machine a run happened on.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    /// CPU model (`/proc/cpuinfo`).
    pub cpu: String,
    /// Logical CPUs available to this process.
    pub cpus: usize,
    /// Physical memory in bytes (`/proc/meminfo`).
    pub mem_bytes: u64,
    /// Kernel release.
    pub kernel: String,
    /// Page size in bytes.
    pub page_bytes: u64,
}

impl Machine {
    /// Describes this machine (fields the OS does not tell stay empty).
    pub fn detect() -> Machine {
        let (cpu, mem_bytes, kernel) = crate::os::machine();
        Machine {
            cpu,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            mem_bytes,
            kernel,
            page_bytes: sys::page_size(),
        }
    }
}

pub use crate::os::{peak_rss, process_read_bytes as proc_read_bytes, reset_peak_rss};

/// A buffer too large for this machine, refused before allocating it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} needs {}, more than this machine's {} of memory: ask for less", need.map_or_else(|| "more bytes than 64 bits count".to_string(), |n| format!("{n} bytes")), if *.mem == u64::MAX { "address space".to_string() } else { format!("{} bytes", .mem) })]
pub struct MemoryError {
    /// What the memory is for (names the option that sized it).
    pub what: String,
    /// Bytes needed (`None`: the count overflowed 64 bits).
    pub need: Option<u64>,
    /// The machine's physical memory (`u64::MAX` when unknown).
    pub mem: u64,
}

/// Checks that `need` bytes (computed with checked arithmetic: `None` when
/// it overflowed) fit in this machine's physical memory, before anything
/// that big is allocated.
pub fn check_memory(what: impl FnOnce() -> String, need: Option<u64>) -> Result<(), MemoryError> {
    let mem = match Machine::detect().mem_bytes {
        0 => u64::MAX,
        m => m,
    };
    // Allocations are also limited to isize::MAX bytes.
    let limit = mem.min(isize::MAX as u64);
    match need {
        Some(n) if n <= limit => Ok(()),
        _ => Err(MemoryError {
            what: what(),
            need,
            mem,
        }),
    }
}

/// Pages an eviction check probes when it must read-probe (see
/// [`Evictor::evict`]): each costs a one-page device read, dropped again.
pub const EVICT_PROBES: u64 = 64;

/// Evicts a table's bytes from the page cache and proves it: per file the
/// table is in, the range from its first to its last byte there (for a
/// checkpoint, the tensors between its shards in that file too).
#[derive(Debug)]
pub struct Evictor {
    files: Vec<EvictFile>,
}

/// One file's part of an eviction.
#[derive(Debug)]
struct EvictFile {
    /// The file's index in the table ([`pleio::layout::ShardPart::file`]).
    index: usize,
    file: File,
    range: Range<u64>,
    wide: Range<u64>,
}

/// Per file index, the hull of the table's regions in it.
pub fn table_ranges(t: &Layout) -> Vec<(usize, Range<u64>)> {
    let mut out: Vec<(usize, Range<u64>)> = Vec::new();
    for r in t.regions() {
        match out.iter_mut().find(|(f, _)| *f == r.file) {
            Some((_, h)) => *h = h.start.min(r.range.start)..h.end.max(r.range.end),
            None => out.push((r.file, r.range)),
        }
    }
    out.sort_by_key(|(f, _)| *f);
    out
}

impl Evictor {
    /// An evictor for `range` of the file at `path` (file 0 of a table).
    /// Eviction covers the range widened to whole 2 MiB blocks: the page
    /// cache may hold a file in large folios (up to 2 MiB on x86_64), and a
    /// folio only partly inside the range cannot be dropped. Only `range`
    /// is checked.
    pub fn new(path: &Path, range: Range<u64>) -> Result<Evictor, BenchError> {
        Ok(Evictor {
            files: vec![EvictFile::new(0, path, range)?],
        })
    }

    /// An evictor for every file of `reader`'s table ([`table_ranges`]).
    pub fn of_table(reader: &Table) -> Result<Evictor, BenchError> {
        let files = table_ranges(reader.layout())
            .into_iter()
            .map(|(i, range)| EvictFile::new(i, reader.file_path(i), range))
            .collect::<Result<_, _>>()?;
        Ok(Evictor { files })
    }

    /// Drops `reader`'s page-table entries for the ranges, then the page
    /// cache's pages (`posix_fadvise(DONTNEED)`), retrying until the page
    /// cache holds at most the two partial edge pages of each (pages under
    /// readahead I/O cannot be dropped until it completes). Also tells
    /// `reader` to forget what `auto` believed resident.
    ///
    /// The check asks the mapping ([`pleio::map::Mapping::sample_resident`]):
    /// exact with `cachestat` or `mincore`; for a reader the kernel hides
    /// residency from (neither owner nor writer of the file), a sample of
    /// [`EVICT_PROBES`] pages read-probed and dropped again.
    pub fn evict(&self, reader: &Table) -> Result<(), BenchError> {
        for f in &self.files {
            f.evict(reader)?;
        }
        reader.forget_residency();
        reader.clear_cache();
        Ok(())
    }
}

impl EvictFile {
    fn new(index: usize, path: &Path, range: Range<u64>) -> Result<EvictFile, BenchError> {
        let err = |e: std::io::Error| BenchError::Evict(format!("{}: {e}", path.display()));
        let file = File::open(path).map_err(err)?;
        let len = file.metadata().map_err(err)?.len();
        const FOLIO: u64 = 2 << 20;
        let wide =
            range.start / FOLIO * FOLIO..range.end.div_ceil(FOLIO).saturating_mul(FOLIO).min(len);
        Ok(EvictFile {
            index,
            file,
            range,
            wide,
        })
    }

    fn evict(&self, reader: &Table) -> Result<(), BenchError> {
        let m = reader
            .mapping_of(self.index)
            .ok_or_else(|| BenchError::Evict("the table's file is not mapped".into()))?;
        let mut left = u64::MAX;
        for attempt in 0..200 {
            if attempt == 1 {
                // Dirty pages (a file just written) cannot be dropped:
                // write them back once.
                self.file
                    .sync_data()
                    .map_err(|e| BenchError::Evict(format!("fdatasync: {e}")))?;
            }
            if !m.drop_resident(self.wide.clone()) {
                return Err(BenchError::Evict("MADV_DONTNEED refused".into()));
            }
            sys::evict(&self.file, self.wide.clone())
                .map_err(|e| BenchError::Evict(format!("posix_fadvise: {e}")))?;
            left = m
                .sample_resident(self.range.clone(), EVICT_PROBES)
                .ok_or_else(|| {
                    BenchError::Evict("page-cache residency cannot be asked here".into())
                })?
                .resident;
            if left <= 2 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(BenchError::Evict(format!(
            "{left} pages still resident after 200 tries (a tmpfs file, or mapped by another process?)"
        )))
    }
}

/// One measured arm: one strategy (or `limit`) at one batch size, cold or warm.
#[derive(Debug, Clone, Default)]
pub struct Arm {
    /// Strategy name, or `limit`.
    pub strategy: &'static str,
    /// Rows per gather.
    pub rows: usize,
    /// Cold (true) or warm.
    pub cold: bool,
    /// Timed gathers.
    pub samples: usize,
    /// Mean latency of one gather, microseconds.
    pub mean_us: f64,
    /// Median latency.
    pub median_us: f64,
    /// 99th percentile latency (nearest rank).
    pub p99_us: f64,
    /// Mean microseconds per requested row.
    pub us_per_row: f64,
    /// Mean distinct pages per gather.
    pub distinct_pages: f64,
    /// Mean bytes read from the device per gather (`/proc/self/io`).
    pub bytes_read: f64,
    /// Mean major faults per gather (gathering thread).
    pub major_faults: f64,
    /// Advice calls refused, summed over the arm.
    pub advice_failures: u64,
    /// Mean read requests per gather.
    pub read_requests: f64,
    /// Mean rows per gather read as cold (`auto`: believed cold).
    pub cold_rows: f64,
    /// Gathers in which `auto` detected an eviction and re-armed.
    pub rearms: u64,
    /// The backend stood in for an unavailable one (e.g. no io_uring).
    pub fallback: bool,
    /// Largest peak RSS seen during one gather of the arm, bytes.
    pub peak_rss: Option<u64>,
    /// `cached`: mean distinct rows per gather served from the row cache.
    pub cache_hits: f64,
    /// `cached`: mean distinct rows per gather read into the row cache.
    pub cache_misses: f64,
    /// `cached`: mean rows per gather evicted from the row cache.
    pub cache_evictions: f64,
    /// `cached`: the most bytes of rows the cache held after a gather.
    pub cache_bytes: Option<u64>,
    /// `mean_us` over `fault`'s at the same size and temperature.
    pub ratio_to_fault: Option<f64>,
    /// `mean_us` over the floor's `median_us` at the same size: `limit`'s
    /// for cold arms, `limit-warm`'s for warm ones (for a floor itself, its
    /// mean over its median).
    pub ratio_to_limit: Option<f64>,
    /// Every timed gather (or floor read), microseconds, ascending.
    pub times_us: Vec<f64>,
}

/// Costs of the ways `auto` could learn residency (measured in the run).
#[derive(Debug, Clone, Default)]
pub struct ResidencyCosts {
    /// One clock read (`Instant::now`), nanoseconds: the warm path pays one
    /// per 16 rows.
    pub clock_ns: f64,
    /// How the mapping asks the page cache (`cachestat`, `mincore`,
    /// `read-probe`; see [`pleio::map::ResidencyMethod`]).
    pub method: &'static str,
    /// One probe of a row's pages, microseconds: what `auto` pays per row
    /// it does not know.
    pub probe_row_us: f64,
    /// One exact count over the whole table, milliseconds: a full refresh
    /// (NaN with read probes, which would read every uncached page).
    pub probe_table_ms: f64,
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// The file.
    pub file: PathBuf,
    /// The file's size.
    pub file_bytes: u64,
    /// The table.
    pub table: Layout,
    /// How cold batches were made.
    pub cold: ColdMode,
    /// Seed of the row lists.
    pub seed: u64,
    /// Batches per size.
    pub batches: usize,
    /// What the gathers wrote.
    pub dtype: Dtype,
    /// Measured costs of residency checks.
    pub residency: ResidencyCosts,
    /// The floor's queue-depth sweep (with a `limit` arm).
    pub floor: Option<DepthSweep>,
    /// The Redis address of the `redis` arms (password hidden).
    pub remote: Option<String>,
    /// Every arm, by size, cold before warm.
    pub arms: Vec<Arm>,
}

/// Progress of a run: `done` of `total` gathers, and what runs now.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// Steps done.
    pub done: u64,
    /// Steps in the run.
    pub total: u64,
    /// The current phase (`cold 1792 rows` ...).
    pub phase: &'a str,
}

/// Warm gathers timed per row list: enough to make a 16-row gather's
/// microseconds visible, few for big batches.
fn warm_reps(rows: usize) -> usize {
    (16_384 / rows.max(1)).clamp(3, 256)
}

impl Report {
    /// Adds floor reads taken later in the run (`us`, microseconds, of the
    /// same `rows`-row batches: [`Bench::floor_samples`]) to the cold
    /// `limit` arm of that size, and rescales every cold arm's ratio to it.
    /// Floor samples spread over a long run are what keeps the floor from
    /// moving with a shared disk's minute-to-minute drift.
    pub fn add_floor_samples(&mut self, rows: usize, us: &[f64]) {
        let Some(limit) = self
            .arms
            .iter_mut()
            .find(|a| a.cold && a.rows == rows && a.strategy == "limit")
        else {
            return;
        };
        limit.times_us.extend_from_slice(us);
        let (mean, median, p99) = summary(&mut limit.times_us);
        limit.samples = limit.times_us.len();
        limit.mean_us = mean;
        limit.median_us = median;
        limit.p99_us = p99;
        limit.us_per_row = mean / rows.max(1) as f64;
        for a in self.arms.iter_mut().filter(|a| a.cold && a.rows == rows) {
            a.ratio_to_limit = (median > 0.0).then(|| a.mean_us / median);
        }
    }
}

/// A gather's output: f32 rows, or rows of another [`Dtype`] as bytes.
#[derive(Debug, Clone, PartialEq)]
enum OutBuf {
    F32(Vec<f32>),
    Bytes(Dtype, Vec<u8>),
}

impl OutBuf {
    /// Room for `n` rows of `t` as `dtype`.
    fn new(t: &Table, dtype: Dtype, n: usize) -> Result<OutBuf, BenchError> {
        let too_big = || BenchError::Config(format!("{n} rows as {dtype} overflow memory"));
        Ok(match dtype {
            Dtype::F32 => OutBuf::F32(vec![
                0f32;
                n.checked_mul(t.row_elems()).ok_or_else(too_big)?
            ]),
            d => OutBuf::Bytes(d, vec![0u8; t.out_bytes(d, n).ok_or_else(too_big)?]),
        })
    }

    fn gather(&mut self, t: &Table, s: Strategy, rows: &[u64]) -> Result<GatherStats, Error> {
        match self {
            OutBuf::F32(o) => t.gather_with(s, rows, o),
            OutBuf::Bytes(d, o) => t.gather_as_with(s, *d, rows, o),
        }
    }

    fn floor(&mut self, t: &Table, f: &WarmFloor) -> Result<(), Error> {
        match self {
            OutBuf::F32(o) => f.run(t, o),
            OutBuf::Bytes(d, o) => f.run_as(t, *d, o),
        }
    }

    /// Bit-for-bit equal (NaN payloads included).
    fn same(&self, other: &OutBuf) -> bool {
        match (self, other) {
            (OutBuf::F32(a), OutBuf::F32(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (a, b) => a == b,
        }
    }
}

/// Accumulates one arm's samples.
#[derive(Default)]
struct Acc {
    times: Vec<f64>,
    pages: u64,
    read: u64,
    faults: u64,
    failures: u64,
    requests: u64,
    cold_rows: u64,
    rearms: u64,
    fallback: bool,
    peak: Option<u64>,
    gathers: u64,
    cache_hits: u64,
    cache_misses: u64,
    cache_evictions: u64,
    cache_bytes: Option<u64>,
}

impl Acc {
    fn add(&mut self, s: &GatherStats) {
        self.failures += s.advice_failures;
        self.requests += s.read_requests;
        self.cold_rows += s.cold_rows;
        self.rearms += u64::from(s.rearmed);
        self.fallback |= s.fallback;
        self.cache_hits += s.cache_hits;
        self.cache_misses += s.cache_misses;
        self.cache_evictions += s.cache_evictions;
        self.cache_bytes = self.cache_bytes.max(s.cache_bytes);
    }

    /// One timed floor read of `pages` pages in `requests` requests.
    fn add_read(&mut self, s: &Sample, pages: u64, requests: u64) {
        self.times.push(s.us);
        self.read += s.read;
        self.peak = self.peak.max(s.peak);
        self.pages += pages;
        self.requests += requests;
        self.gathers += 1;
    }

    fn arm(mut self, strategy: &'static str, rows: usize, cold: bool) -> Arm {
        let (mean, median, p99) = summary(&mut self.times);
        let per = |x: u64| x as f64 / self.gathers.max(1) as f64;
        Arm {
            strategy,
            rows,
            cold,
            samples: self.times.len(),
            mean_us: mean,
            median_us: median,
            p99_us: p99,
            us_per_row: mean / rows.max(1) as f64,
            distinct_pages: per(self.pages),
            bytes_read: per(self.read),
            major_faults: per(self.faults),
            advice_failures: self.failures,
            read_requests: per(self.requests),
            cold_rows: per(self.cold_rows),
            rearms: self.rearms,
            fallback: self.fallback,
            peak_rss: self.peak,
            cache_hits: per(self.cache_hits),
            cache_misses: per(self.cache_misses),
            cache_evictions: per(self.cache_evictions),
            cache_bytes: self.cache_bytes,
            ratio_to_fault: None,
            ratio_to_limit: None,
            times_us: self.times,
        }
    }
}

/// A table opened for benchmarking.
pub struct Bench {
    path: PathBuf,
    reader: Table,
    evictor: Evictor,
    page: u64,
    /// The same table published in Redis ([`Bench::with_remote`]).
    remote: Option<Table>,
}

/// One measured arm: a strategy on the benched file, or on its copy in
/// Redis (`remote`).
#[derive(Debug, Clone, Copy)]
struct Lane {
    name: &'static str,
    strategy: Strategy,
    remote: bool,
}

/// The arms of the Redis copy: every row from the store, and the
/// machine-wide cache in front of it.
const REMOTE_LANES: [Lane; 2] = [
    Lane {
        name: "redis",
        strategy: Strategy::Fault,
        remote: true,
    },
    Lane {
        name: "redis-shared",
        strategy: Strategy::Shared,
        remote: true,
    },
];

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bench").field("path", &self.path).finish()
    }
}

/// What one timed call measured.
struct Sample {
    us: f64,
    read: u64,
    faults: u64,
    peak: Option<u64>,
}

/// Times `f` with the process's device reads, the thread's major faults and
/// the peak RSS around it (all read outside the timed region).
fn measure<T>(f: impl FnOnce() -> T) -> (T, Sample) {
    reset_peak_rss();
    let read0 = proc_read_bytes().unwrap_or(0);
    let faults0 = sys::thread_major_faults().unwrap_or(0);
    let t = Instant::now();
    let r = f();
    let us = t.elapsed().as_secs_f64() * 1e6;
    let faults = sys::thread_major_faults()
        .unwrap_or(0)
        .saturating_sub(faults0);
    let read = proc_read_bytes().unwrap_or(0).saturating_sub(read0);
    let sample = Sample {
        us,
        read,
        faults,
        peak: peak_rss(),
    };
    (r, sample)
}

impl Bench {
    /// Opens the PLE table (or `tensor`) of the GGUF file or safetensors
    /// checkpoint at `path`.
    pub fn open(path: &Path, tensor: Option<&str>) -> Result<Bench, BenchError> {
        Bench::open_with(path, &pleio::OpenOptions::new().tensor(tensor))
    }

    /// [`Bench::open`] with every open option (tensor, PLE layer, ...).
    pub fn open_with(path: &Path, options: &pleio::OpenOptions) -> Result<Bench, BenchError> {
        let reader = options.open(path).map_err(|error| BenchError::Gather {
            strategy: "open",
            error,
        })?;
        let page = reader
            .mapping()
            .map_or_else(sys::page_size, |m| m.page_size());
        Ok(Bench {
            path: path.to_path_buf(),
            evictor: Evictor::of_table(&reader)?,
            reader,
            page,
            remote: None,
        })
    }

    /// Adds the arms `redis` (every row read from the store) and
    /// `redis-shared` (the machine-wide cache in front of it, emptied
    /// before each cold batch) on the table published at `url`, which
    /// must hold the benched table (`pleio publish FILE URL`): the same
    /// geometry here, the same bytes out (checked like every arm).
    pub fn with_remote(mut self, url: &str) -> Result<Bench, BenchError> {
        let remote = Table::open(url).map_err(|error| BenchError::Gather {
            strategy: "redis",
            error,
        })?;
        let (here, there) = (&self.reader, &remote);
        let shape = |t: &Table| (t.rows(), t.row_elems(), t.row_bytes(), t.type_name());
        if shape(here) != shape(there) {
            let say = |t: &Table| {
                format!(
                    "{} holds {} rows of {} {} elements ({} bytes each)",
                    t.path().display(),
                    t.rows(),
                    t.row_elems(),
                    t.type_name(),
                    t.row_bytes()
                )
            };
            return Err(BenchError::Config(format!(
                "{}, but {}: publish this table there first (pleio publish)",
                say(there),
                say(here)
            )));
        }
        self.remote = Some(remote);
        Ok(self)
    }

    /// The reader measured.
    pub fn reader(&self) -> &Table {
        &self.reader
    }

    /// Gives the reader a row cache of `budget` bytes (strategy `cached`).
    pub fn with_cache_budget(mut self, budget: u64) -> Result<Bench, BenchError> {
        self.reader = self
            .reader
            .with_budget(budget)
            .map_err(|error| BenchError::Gather {
                strategy: "cached",
                error,
            })?;
        Ok(self)
    }

    /// The table's geometry.
    pub fn layout(&self) -> Layout {
        self.reader.layout().clone()
    }

    /// Distinct pages (file index, absolute page index; sorted) the rows
    /// touch.
    pub fn distinct_pages(&self, rows: &[u64]) -> Vec<(usize, u64)> {
        let t = self.reader.layout();
        let mut pages: Vec<(usize, u64)> = Vec::with_capacity(rows.len() * 2);
        for &r in rows {
            for e in t.extents(r).iter().flat_map(|x| x.as_slice()) {
                let page = |o: u64| (e.file, o / self.page);
                let (a, b) = (page(e.offset), page(e.offset + e.len.max(1) - 1));
                pages.extend((a.1..=b.1).map(|p| (e.file, p)));
            }
        }
        pages.sort_unstable();
        pages.dedup();
        pages
    }

    /// True if no page of any part of `row` is in the page cache (asked
    /// exactly, see [`pleio::map::Mapping::resident_pages`]); `None` where
    /// a file is not mapped or residency cannot be asked.
    fn row_cold(&self, row: u64) -> Option<bool> {
        let ext = self.reader.layout().extents(row).ok()?;
        let mut cold = true;
        for e in ext.as_slice() {
            let m = self.reader.mapping_of(e.file)?;
            cold &= m.resident_pages(e.offset..e.offset + e.len)? == 0;
        }
        Some(cold)
    }

    fn random_rows(&self, rng: &mut Rng, n: usize) -> Vec<u64> {
        let total = self.reader.layout().rows();
        (0..n).map(|_| rng.below(total)).collect()
    }

    /// `n` random rows none of whose pages is in the page cache (asked
    /// exactly, see [`pleio::map::Mapping::resident_pages`]).
    fn nonresident_rows(&self, rng: &mut Rng, n: usize) -> Result<Vec<u64>, BenchError> {
        let t = self.reader.layout();
        if self.reader.mapping().is_none() {
            return Err(BenchError::Config(
                "--cold mincore needs the table mapped".into(),
            ));
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n.saturating_mul(64).max(1024) {
            if out.len() == n {
                break;
            }
            let r = rng.below(t.rows());
            if self.row_cold(r) == Some(true) {
                out.push(r);
            }
        }
        if out.len() < n {
            return Err(BenchError::NoColdRows {
                found: out.len(),
                want: n,
            });
        }
        Ok(out)
    }

    /// The device floor of this table, its queue depth chosen by a sweep
    /// ([`Floor::fastest`]).
    pub fn floor(&self, seed: u64) -> Result<(Floor, DepthSweep), BenchError> {
        Floor::fastest(&self.reader, self.page, seed)
            .map_err(|e| BenchError::Config(format!("limit arm (O_DIRECT io_uring): {e}")))
    }

    /// The row lists of a run at `n` rows per batch.
    pub fn row_lists(&self, cfg: &BenchConfig, n: usize) -> Vec<Vec<u64>> {
        self.lists_and_rng(cfg, n).0
    }

    /// [`Bench::row_lists`], and the generator that drew them (it goes on
    /// to draw `--cold mincore` rows).
    fn lists_and_rng(&self, cfg: &BenchConfig, n: usize) -> (Vec<Vec<u64>>, Rng) {
        let mut rng = Rng::new(cfg.seed ^ (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let lists = (0..cfg.batches)
            .map(|_| self.random_rows(&mut rng, n))
            .collect();
        (lists, rng)
    }

    /// Measures what `auto`'s residency options cost here (see
    /// [`ResidencyCosts`]), on `rows` random rows.
    pub fn residency_costs(&self, rows: usize) -> ResidencyCosts {
        let t = self.reader.layout();
        let mut rng = Rng::new(0x5eed);
        let list = self.random_rows(&mut rng, rows.max(1));
        let n = 100_000;
        let c = Instant::now();
        for _ in 0..n {
            std::hint::black_box(Instant::now());
        }
        let clock_ns = c.elapsed().as_secs_f64() * 1e9 / f64::from(n);
        let (mut method, mut probe_row_us, mut probe_table_ms) =
            ("unavailable", f64::NAN, f64::NAN);
        if let Some(m) = self.reader.mapping() {
            method = m.residency_method().name();
            let c = Instant::now();
            for &r in &list {
                for e in t.extents(r).iter().flat_map(|x| x.as_slice()) {
                    let m = self.reader.mapping_of(e.file);
                    std::hint::black_box(
                        m.and_then(|m| m.all_resident(e.offset..e.offset + e.len)),
                    );
                }
            }
            probe_row_us = c.elapsed().as_secs_f64() * 1e6 / list.len() as f64;
            if m.residency_method() != ResidencyMethod::ReadProbe {
                let c = Instant::now();
                for (i, range) in table_ranges(t) {
                    let m = self.reader.mapping_of(i);
                    std::hint::black_box(m.and_then(|m| m.resident_pages(range)));
                }
                probe_table_ms = c.elapsed().as_secs_f64() * 1e3;
            }
        }
        ResidencyCosts {
            clock_ns,
            method,
            probe_row_us,
            probe_table_ms,
        }
    }

    /// The table `lane` reads.
    fn table_of(&self, lane: Lane) -> &Table {
        match (&self.remote, lane.remote) {
            (Some(remote), true) => remote,
            _ => &self.reader,
        }
    }

    fn gather(
        &self,
        lane: Lane,
        rows: &[u64],
        out: &mut OutBuf,
        acc: &mut Acc,
    ) -> Result<(), BenchError> {
        let table = self.table_of(lane);
        let (r, sample) = measure(|| out.gather(table, lane.strategy, rows));
        let stats = r.map_err(|source| BenchError::Gather {
            strategy: lane.name,
            error: source,
        })?;
        acc.add(&stats);
        acc.times.push(sample.us);
        acc.read += sample.read;
        acc.faults += sample.faults;
        acc.peak = acc.peak.max(sample.peak);
        acc.gathers += 1;
        Ok(())
    }

    /// Runs every arm of `cfg`, reporting progress.
    pub fn run(
        &self,
        cfg: &BenchConfig,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Report, BenchError> {
        if cfg.batches == 0 || cfg.rows.is_empty() || cfg.rows.contains(&0) {
            return Err(BenchError::Config(
                "need at least one batch and non-zero batch sizes".into(),
            ));
        }
        let elems = self.reader.row_elems();
        for &n in &cfg.rows {
            // Per batch size: the row lists, two outputs, the page list.
            let per_row = (cfg.batches as u64)
                .checked_mul(8)
                .and_then(|l| l.checked_add((elems as u64).checked_mul(8)?))
                .and_then(|b| b.checked_add(16));
            check_memory(
                || format!("--rows {n} with --batches {}", cfg.batches),
                per_row.and_then(|b| b.checked_mul(n as u64)),
            )?;
        }
        let mut strategies = cfg.strategies.clone();
        strategies.dedup();
        if !strategies.contains(&Strategy::Fault) {
            strategies.insert(0, Strategy::Fault);
        }
        let mut lanes: Vec<Lane> = strategies
            .iter()
            .map(|&strategy| Lane {
                name: strategy.name(),
                strategy,
                remote: false,
            })
            .collect();
        if self.remote.is_some() {
            lanes.extend(REMOTE_LANES);
        }
        // Make the row cache (`cached`) and attach (or make) the
        // machine-wide cache (`shared`) before anything is timed: a process
        // sets them up once, not per gather (the row cache's first gather
        // maps its shards' arrays and sets up its ring: milliseconds, which
        // fell in the arm's first cold batch and moved its mean).
        for &lane in lanes
            .iter()
            .filter(|l| matches!(l.strategy, Strategy::Shared | Strategy::Cached))
        {
            let table = self.table_of(lane);
            let mut out = OutBuf::new(table, cfg.dtype, 1)?;
            out.gather(table, lane.strategy, &[0])
                .map_err(|error| BenchError::Gather {
                    strategy: lane.name,
                    error,
                })?;
            table.clear_cache();
        }
        let cold_on = cfg.cold != ColdMode::None;
        let limit_on = cold_on && cfg.limit;
        let floor = if limit_on {
            Some(self.floor(cfg.seed)?)
        } else {
            None
        };
        let floor_reps = MIN_FLOOR_SAMPLES.div_ceil(cfg.batches);
        let arms_per_batch = lanes.len() as u64;
        // Progress steps (saturating: only a progress bar's length).
        let total: u64 = (cfg.rows.len() as u64)
            .saturating_mul(cfg.batches as u64)
            .saturating_mul(
                u64::from(cold_on) * (arms_per_batch + u64::from(limit_on)) + arms_per_batch,
            );
        let mut done = 0u64;
        let mut arms = Vec::new();
        for &n in &cfg.rows {
            let (lists, mut rng) = self.lists_and_rng(cfg, n);
            let mut reference = OutBuf::new(&self.reader, cfg.dtype, n)?;
            let mut out = reference.clone();
            let phases: &[bool] = if cold_on { &[true, false] } else { &[false] };
            for &cold in phases {
                let label = format!("{} {n} rows", if cold { "cold" } else { "warm" });
                let mut accs: Vec<Acc> = lanes.iter().map(|_| Acc::default()).collect();
                let mut limit = Acc::default();
                let mut page1 = Acc::default();
                let mut warm_floor = Acc::default();
                for (b, list) in lists.iter().enumerate() {
                    for (k, &lane) in lanes.iter().enumerate() {
                        progress(Progress {
                            done,
                            total,
                            phase: &label,
                        });
                        let rows = if cold && cfg.cold == ColdMode::Mincore {
                            self.nonresident_rows(&mut rng, n)?
                        } else {
                            list.clone()
                        };
                        if cold {
                            if lane.remote {
                                // Cold for the client: nothing cached here.
                                self.table_of(lane).clear_cache();
                            } else if cfg.cold == ColdMode::Evict {
                                self.evictor.evict(&self.reader)?;
                            }
                            self.gather(lane, &rows, &mut out, &mut accs[k])?;
                            accs[k].pages += self.distinct_pages(&rows).len() as u64;
                        } else {
                            // Bring the rows in, then time repeats.
                            let mut untimed = Acc::default();
                            self.gather(lane, &rows, &mut out, &mut untimed)?;
                            for _ in 0..warm_reps(n) {
                                self.gather(lane, &rows, &mut out, &mut accs[k])?;
                                accs[k].pages += self.distinct_pages(&rows).len() as u64;
                            }
                        }
                        self.check(
                            cfg,
                            (lane.name, k, lanes[0].name),
                            &rows,
                            &out,
                            &mut reference,
                            b,
                            cold,
                        )?;
                        done += 1;
                    }
                    if !cold && cfg.limit {
                        // The warm floor of the same rows, checked against
                        // the first arm's output.
                        let floor_err = |error| BenchError::Gather {
                            strategy: "limit-warm",
                            error,
                        };
                        let f = WarmFloor::new(&self.reader, list).map_err(|e| match e {
                            WarmFloorError::Read(error) => floor_err(error),
                            e => BenchError::Config(e.to_string()),
                        })?;
                        out.floor(&self.reader, &f).map_err(floor_err)?;
                        for _ in 0..warm_reps(n) {
                            let (r, sample) = measure(|| out.floor(&self.reader, &f));
                            r.map_err(floor_err)?;
                            warm_floor.times.push(sample.us);
                            warm_floor.peak = warm_floor.peak.max(sample.peak);
                            warm_floor.gathers += 1;
                        }
                        if !out.same(&reference) {
                            return Err(BenchError::Mismatch {
                                strategy: "limit-warm",
                                reference: lanes[0].name,
                                rows: n,
                                batch: b,
                                phase: "warm",
                            });
                        }
                    }
                    if let (true, Some((floor, _))) = (cold, &floor) {
                        progress(Progress {
                            done,
                            total,
                            phase: &label,
                        });
                        let rows = if cfg.cold == ColdMode::Mincore {
                            self.nonresident_rows(&mut rng, n)?
                        } else {
                            self.evictor.evict(&self.reader)?;
                            list.clone()
                        };
                        let extents = floor.extents(&rows);
                        let pages = self.distinct_pages(&rows).len() as u64;
                        // One page alone first (queue depth 1): the floor of
                        // any cold gather, the yardstick for small batches.
                        let (file, e0) = &extents[0];
                        let first = e0.start / self.page * self.page;
                        let one_page = vec![(*file, first..first + self.page)];
                        for _ in 0..floor_reps {
                            let (r, one) = measure(|| floor.read(&one_page));
                            let stats = r.map_err(BenchError::Limit)?;
                            page1.add_read(&one, 1, stats.requests);
                            let (r, sample) = measure(|| floor.read(&extents));
                            let stats = r.map_err(BenchError::Limit)?;
                            limit.add_read(&sample, pages, stats.requests);
                        }
                        done += 1;
                    }
                }
                let mut group: Vec<Arm> = lanes
                    .iter()
                    .zip(accs)
                    .map(|(l, a)| a.arm(l.name, n, cold))
                    .collect();
                if cold && limit_on {
                    group.push(limit.arm("limit", n, true));
                    group.push(page1.arm("qd1-page", n, true));
                }
                if !cold && cfg.limit {
                    group.push(warm_floor.arm("limit-warm", n, false));
                }
                let fault = group
                    .iter()
                    .find(|a| a.strategy == "fault")
                    .map(|a| a.mean_us);
                let floor_name = if cold { "limit" } else { "limit-warm" };
                let lim = group
                    .iter()
                    .find(|a| a.strategy == floor_name)
                    .map(|a| a.median_us);
                for a in &mut group {
                    a.ratio_to_fault = fault.filter(|&f| f > 0.0).map(|f| a.mean_us / f);
                    a.ratio_to_limit = lim.filter(|&l| l > 0.0).map(|l| a.mean_us / l);
                }
                arms.extend(group);
            }
        }
        progress(Progress {
            done: total,
            total,
            phase: "done",
        });
        Ok(Report {
            machine: Machine::detect(),
            file: self.path.clone(),
            file_bytes: std::fs::metadata(&self.path).map_or(0, |m| m.len()),
            table: self.layout(),
            cold: cfg.cold,
            seed: cfg.seed,
            batches: cfg.batches,
            dtype: cfg.dtype,
            residency: self.residency_costs(1792),
            floor: floor.map(|(_, sweep)| sweep),
            remote: self.remote.as_ref().map(|t| t.path().display().to_string()),
            arms,
        })
    }

    /// Checks `out` against the batch's reference: the first arm's output
    /// for the same rows (with `--cold mincore` cold rows differ per arm, so
    /// the reference is a `fault` gather of the same rows).
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        cfg: &BenchConfig,
        (name, k, first): (&'static str, usize, &'static str),
        rows: &[u64],
        out: &OutBuf,
        reference: &mut OutBuf,
        batch: usize,
        cold: bool,
    ) -> Result<(), BenchError> {
        let phase = if cold { "cold" } else { "warm" };
        let reference_name;
        if cold && cfg.cold == ColdMode::Mincore {
            reference
                .gather(&self.reader, Strategy::Fault, rows)
                .map_err(|source| BenchError::Gather {
                    strategy: "fault",
                    error: source,
                })?;
            reference_name = "fault";
        } else if k == 0 {
            reference.clone_from(out);
            return Ok(());
        } else {
            reference_name = first;
        }
        if out.same(reference) {
            Ok(())
        } else {
            Err(BenchError::Mismatch {
                strategy: name,
                reference: reference_name,
                rows: rows.len(),
                batch,
                phase,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::SynthSpec;
    use pleio::quant::GgmlType;

    /// A file on the build's disk: the floor reads with `O_DIRECT`, which
    /// a tmpfs `TMPDIR` may refuse.
    fn disk_file() -> tempfile::NamedTempFile {
        tempfile::NamedTempFile::new_in(pleio_testkit::disk_dir!()).unwrap()
    }

    fn bench() -> (tempfile::NamedTempFile, Bench) {
        let file = disk_file();
        SynthSpec::qwen(GgmlType::IQ4_NL, 4000, 2)
            .write(file.reopen().unwrap(), &mut |_| {})
            .unwrap();
        let b = Bench::open(file.path(), None).unwrap();
        (file, b)
    }

    #[test]
    fn a_different_bit_fails_the_check() {
        let (_f, b) = bench();
        let cfg = BenchConfig::default();
        let rows = [1u64, 7, 3999];
        let mut want = OutBuf::new(b.reader(), Dtype::F32, rows.len()).unwrap();
        want.gather(b.reader(), Strategy::Fault, &rows).unwrap();
        let mut reference = want.clone();
        let first = ("fault", 0, "fault");
        b.check(&cfg, first, &rows, &want, &mut reference, 0, true)
            .unwrap();
        let same = ("uring", 1, "fault");
        b.check(&cfg, same, &rows, &want, &mut reference, 0, true)
            .unwrap();
        let mut bad = want.clone();
        if let OutBuf::F32(v) = &mut bad {
            v[200] = f32::from_bits(v[200].to_bits() ^ 1);
        }
        let e = b
            .check(&cfg, same, &rows, &bad, &mut reference, 3, false)
            .unwrap_err();
        assert!(
            matches!(
                e,
                BenchError::Mismatch {
                    strategy: "uring",
                    reference: "fault",
                    rows: 3,
                    batch: 3,
                    phase: "warm"
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn warm_floor_writes_what_every_strategy_writes() {
        // A GGUF table and multi-part checkpoints (FP8 with per-row scales:
        // two parts; MLX 4-bit: three), every dtype, a batch with repeats.
        let dir = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
        let (_f, gguf) = bench();
        let mut tables = vec![gguf];
        for enc in [
            crate::synth_ckpt::CkptEncoding::Fp8Row,
            crate::synth_ckpt::CkptEncoding::Mlx4,
        ] {
            let path = dir.path().join(enc.name());
            let spec = crate::synth_ckpt::CkptSpec::new(enc, 3000, 2, 3);
            crate::synth_ckpt::write_checkpoint(&spec, &path, &mut |_| {}).unwrap();
            tables.push(Bench::open(&path, None).unwrap());
        }
        for b in &tables {
            let t = b.reader();
            let last = t.rows() - 1;
            let rows = [5u64, last, 5, 0, 1234, 77, last];
            let f = WarmFloor::new(t, &rows).unwrap();
            for &d in Dtype::ALL {
                let mut want = OutBuf::new(t, d, rows.len()).unwrap();
                want.gather(t, Strategy::Pread, &rows).unwrap();
                let mut got = OutBuf::new(t, d, rows.len()).unwrap();
                got.floor(t, &f).unwrap();
                assert!(got.same(&want), "{d} of {}", t.path().display());
            }
        }
    }

    #[test]
    fn a_warm_run_has_a_checked_limit_warm_arm_and_ratios_to_it() {
        let (_f, b) = bench();
        let cfg = BenchConfig {
            rows: vec![16, 300],
            strategies: vec![Strategy::Fault, Strategy::Auto],
            batches: 2,
            cold: ColdMode::None,
            dtype: Dtype::Raw,
            ..BenchConfig::default()
        };
        let r = b.run(&cfg, &mut |_| {}).unwrap();
        for n in [16, 300] {
            let floor = r
                .arms
                .iter()
                .find(|a| a.strategy == "limit-warm" && a.rows == n)
                .unwrap();
            assert!(!floor.cold);
            assert_eq!(floor.samples, 2 * warm_reps(n));
            let auto = r
                .arms
                .iter()
                .find(|a| a.strategy == "auto" && a.rows == n)
                .unwrap();
            let want = auto.mean_us / floor.median_us;
            assert_eq!(auto.ratio_to_limit, Some(want));
        }
        // Without the floors, no arm and no ratio.
        let cfg = BenchConfig {
            limit: false,
            ..cfg
        };
        let r = b.run(&cfg, &mut |_| {}).unwrap();
        assert!(r.arms.iter().all(|a| a.strategy != "limit-warm"));
        assert!(r.arms.iter().all(|a| a.ratio_to_limit.is_none()));
    }

    /// Runs of consecutive numbers in sorted, distinct `pages`.
    fn runs(pages: &[(usize, u64)]) -> u64 {
        1 + pages
            .windows(2)
            .filter(|w| w[1] != (w[0].0, w[0].1 + 1))
            .count() as u64
    }

    #[test]
    fn limit_reads_one_request_per_contiguous_extent_of_two_page_rows() {
        // Gemma 4 Q5_K rows: 7392 bytes, each spanning two or three pages.
        let file = disk_file();
        SynthSpec::gemma(GgmlType::Q5_K, 3000, 42, 9)
            .write(file.reopen().unwrap(), &mut |_| {})
            .unwrap();
        let b = Bench::open(file.path(), None).unwrap();
        assert_eq!(b.reader().layout().row_bytes(), 7392);
        let (floor, sweep) = match b.floor(1) {
            Ok(f) => f,
            Err(e) => pleio_testkit::skip!("{e}"),
        };
        assert_eq!(sweep.points.len(), crate::floor::QUEUE_DEPTHS.len());
        assert!(crate::floor::QUEUE_DEPTHS.contains(&sweep.best));
        assert_eq!(floor.queue_depth(), sweep.best);
        let page = sys::page_size();
        assert_eq!(floor.grain().page, page);
        // Adjacent rows (5, 6, 7 and 2900, 2901) share an extent: one
        // request per run of contiguous pages, fewer than half the pages.
        let rows = [5, 6, 100, 2900, 2901, 7, 2000, 5];
        let pages = b.distinct_pages(&rows);
        let extents = floor.extents(&rows);
        assert_eq!(extents.len(), 4);
        assert_eq!(extents.len() as u64, runs(&pages));
        assert!(extents.len() < pages.len() / 2);
        let stats = floor.read(&extents).unwrap();
        assert_eq!(stats.requests, extents.len() as u64);
        let bytes: u64 = extents.iter().map(|(_, e)| e.end - e.start).sum();
        assert_eq!(stats.bytes, bytes);
        assert!(bytes <= pages.len() as u64 * page);

        // The bench's limit arm: one request per extent of each batch.
        let cfg = BenchConfig {
            rows: vec![16, 256],
            strategies: vec![Strategy::Fault],
            batches: 2,
            ..BenchConfig::default()
        };
        let mut report = b.run(&cfg, &mut |_| {}).unwrap();
        assert!(report.floor.is_some());
        for &n in &cfg.rows {
            let lists = b.row_lists(&cfg, n);
            let want = lists
                .iter()
                .map(|l| runs(&b.distinct_pages(l)) as f64)
                .sum::<f64>()
                / lists.len() as f64;
            let limit = report
                .arms
                .iter()
                .find(|a| a.strategy == "limit" && a.rows == n)
                .unwrap();
            assert!((limit.read_requests - want).abs() < 1e-9, "{n}: {limit:?}");
            assert!(limit.read_requests < limit.distinct_pages, "{limit:?}");
            assert!(limit.samples >= MIN_FLOOR_SAMPLES, "{limit:?}");
        }

        // Floor reads taken later join the arm: its figures are those of
        // every sample, and every cold arm's ratio follows the new median.
        let extra = floor.time_reads(&b.row_lists(&cfg, 16), 3).unwrap();
        assert_eq!(extra.len(), 2 * 3);
        let limit_of = |r: &Report| {
            r.arms
                .iter()
                .find(|a| a.strategy == "limit" && a.rows == 16)
                .unwrap()
                .clone()
        };
        let before = limit_of(&report);
        report.add_floor_samples(16, &extra);
        let after = limit_of(&report);
        assert_eq!(after.samples, before.samples + extra.len());
        let mut all = before.times_us.clone();
        all.extend_from_slice(&extra);
        let (mean, median, p99) = summary(&mut all);
        assert_eq!(
            (after.mean_us, after.median_us, after.p99_us),
            (mean, median, p99)
        );
        for a in report.arms.iter().filter(|a| a.cold && a.rows == 16) {
            assert_eq!(a.ratio_to_limit, Some(a.mean_us / median), "{a:?}");
        }
        let other = limit_of(&report);
        report.add_floor_samples(256, &[]);
        assert_eq!(limit_of(&report).samples, other.samples);

        // A replay phase's floor from passes taken one at a time: each
        // pass reads every step's cold extents once.
        let steps: Vec<&[u64]> = vec![&rows[..4], &rows[4..]];
        let mut samples = floor.phase_samples(&steps);
        for _ in 0..3 {
            floor.pass(&mut samples).unwrap();
        }
        let phase = samples.floor();
        assert_eq!((phase.steps, phase.timing.samples), (2, 3));
        // The first step reads all its extents; the second only pages the
        // first did not read (row 5 again: nothing new for it).
        let first = floor.extents(steps[0]).len() as u64;
        assert!(
            phase.extents > first && phase.extents <= first + floor.extents(steps[1]).len() as u64
        );
        let whole = floor.phase(&steps).unwrap();
        assert_eq!((whole.extents, whole.bytes), (phase.extents, phase.bytes));
        assert!(phase.timing.median_us > 0.0);
    }

    #[test]
    fn summary_and_pages() {
        let mut xs: Vec<f64> = (1..=100).map(f64::from).collect();
        xs.reverse();
        let (mean, median, p99) = summary(&mut xs);
        assert_eq!((mean, median, p99), (50.5, 51.0, 99.0));
        let (_f, b) = bench();
        let t = b.reader().layout().clone();
        // Duplicates count once; a straddling row counts both pages.
        let page = sys::page_size();
        let straddler = (0..t.rows())
            .find(|r| {
                let s = t.offset() + r * t.row_bytes();
                s / page != (s + t.row_bytes() - 1) / page
            })
            .unwrap();
        assert_eq!(b.distinct_pages(&[straddler, straddler]).len(), 2);
        assert_eq!("mincore".parse::<ColdMode>(), Ok(ColdMode::Mincore));
        assert!("hot".parse::<ColdMode>().is_err());
    }
}
