//! Fetching rows: the strategies that turn row ids into decoded f32 rows.
//!
//! Every strategy produces identical bytes for the same request; they differ
//! only in how the row bytes get from the disk into memory. This stage
//! validates every id before any I/O, so a bad id never yields partial output.
//!
//! - mapped (`fault`, `advise`): row bytes copied out of the file mapping
//!   into per-thread staging (a file that shrank under the mapping is an
//!   error there, not `SIGBUS`: see [`crate::sys::SIGBUS_PROTECTED`]), then
//!   decoded;
//! - direct (`pread`, `uring`, `uring-direct`, `pool`, in [`direct`]):
//!   sorted, deduplicated rows read by positioned reads into reused staging,
//!   no mapping touched (a truncated file is an error, never SIGBUS);
//! - `auto` ([`auto`]): resident rows mapped, rows believed cold advised
//!   all at once then mapped, residency tracked by a per-table page bitmap
//!   ([`known_pages`]) that re-arms itself on an eviction signature;
//! - `cached` ([`cached`]): a budgeted row cache in pleio's own memory
//!   ([`crate::cache`]), misses read with `O_DIRECT`;
//! - [`warm`]: prewarming the row cache or the page cache from a profile;
//! - [`lookahead`]: a batch fetched in the background while the current one
//!   computes ([`Table::prefetch`]).
//!
//! On any error the caller's output is untouched: every strategy reads all
//! of a batch's bytes before it writes the output.

mod auto;
mod cached;
mod shared;
mod direct;
mod known_pages;
mod order;
mod remote;
#[cfg(feature = "internals")]
pub mod lookahead;
#[cfg(not(feature = "internals"))]
pub(crate) mod lookahead;
mod totals;
mod warm;

pub use crate::sys::guard::SigbusGuard;
pub use cached::DEFAULT_BUDGET;
pub use totals::GatherTotals;
pub use warm::{rank_by_frequency, WarmReport};

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use crate::cache::{CacheCounters, CachePolicy, Sizing};
use crate::checkpoint::{CheckpointError, CheckpointTable, TableKind};
use crate::error::{Error, ErrorKind};
use crate::io::IoError;
use crate::layout::{shard_of, BatchExtent, ExtentOrder, Layout, RowFormat, RowId, TableError};
use crate::map::{CopyError, Mapping};
use crate::model::Model;
use crate::ngram::{Gemma4Rows, ModelRows, OwnedSequence};
use crate::output::{Decoder, Dtype, Out, Rounding};
use crate::coalesce::page::{Bounds, Planner, RowSpan};
use crate::quant::DecodeError;
use crate::sys::{self, AdviceOutcome, Advisor, MemRun};
use lookahead::{Lookahead, Prefetch, Prefetcher};

/// How row bytes are brought in from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// Plain read-only mapping (the table's pages `MADV_RANDOM`): each cold
    /// row is a synchronous page fault.
    Fault,
    /// The reference design: the batch's row pages are planned, sorted,
    /// merged and `MADV_WILLNEED`-advised in chunks of up to 256 rows, then
    /// the same mapped gather as `Fault` runs on pages already being read.
    Advise,
    /// Sorted, deduplicated rows read with `pread` one span after another
    /// (queue depth 1) into staging, then decoded. No mapping.
    Pread,
    /// The same reads all in flight on one persistent io_uring (queue depth
    /// 64), buffered. Falls back to `Pool` where io_uring is unavailable.
    Uring,
    /// `Uring` with `O_DIRECT`: the aligned blocks covering each row are
    /// read past the page cache into aligned scratch.
    UringDirect,
    /// The same reads spread over a persistent pool of 32 reader threads
    /// (inline below 3 reads).
    Pool,
    /// Rows pleio knows resident are decoded straight from the mapping (no
    /// system call); only the pages of rows believed cold are advised (as
    /// `Advise` does), then those rows are decoded from the mapping too.
    Auto,
    /// A row cache in pleio's own memory, within the handle's byte budget
    /// ([`OpenOptions::cache_budget`](crate::OpenOptions::cache_budget)): hits are decoded from it, misses read with
    /// `O_DIRECT` (nothing enters the page cache) and stored as their stored
    /// bytes.
    Cached,
    /// One row cache per machine, in shared memory every process serving
    /// the same table maps (`/dev/shm/pleio-<identity>`), within the
    /// budget of the process that created it: hits are copied out with no
    /// lock or system call, and a missing row is read from the device once
    /// machine-wide (`O_DIRECT`, as [`Strategy::Cached`]).
    Shared,
}

impl Strategy {
    /// Every strategy this build has.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) const ALL: &'static [Strategy] = &[
        Strategy::Fault,
        Strategy::Advise,
        Strategy::Pread,
        Strategy::Uring,
        Strategy::UringDirect,
        Strategy::Pool,
        Strategy::Auto,
        Strategy::Cached,
        Strategy::Shared,
    ];

    /// The name used on the command line (an engine has `Display`).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Strategy::Fault => "fault",
            Strategy::Advise => "advise",
            Strategy::Pread => "pread",
            Strategy::Uring => "uring",
            Strategy::UringDirect => "uring-direct",
            Strategy::Pool => "pool",
            Strategy::Auto => "auto",
            Strategy::Cached => "cached",
            Strategy::Shared => "shared",
        }
    }

    /// True for the strategies that decode from the mapping only.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn is_mapped(self) -> bool {
        matches!(self, Strategy::Fault | Strategy::Advise)
    }
}

impl Default for Strategy {
    /// [`Strategy::Auto`].
    fn default() -> Self {
        Strategy::Auto
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .iter()
            .copied()
            .find(|st| st.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<_> = Strategy::ALL.iter().map(|s| s.name()).collect();
                format!("unknown strategy {s:?} (known: {})", names.join(", "))
            })
    }
}

/// Errors from a gather. Messages include their causes; `source()` does
/// not repeat them (a printed chain names every cause once).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatherError {
    /// A row id is out of range (nothing was read or written).
    #[error(transparent)]
    Table(#[from] TableError),
    /// The table's type cannot be decoded.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A row's bytes are not inside the mapped file (the table was built by
    /// hand with a wrong offset, or the file shrank).
    #[error("row bytes at offset {offset} (+{len}) are outside the file")]
    OutsideFile {
        /// Absolute offset of the row.
        offset: u64,
        /// Row bytes.
        len: u64,
    },
    /// A row's bytes lie in a fragment of the file that was unmapped.
    #[error("row bytes at offset {offset} (+{len}) lie in an unmapped fragment of the file")]
    Unmapped {
        /// Absolute offset of the row.
        offset: u64,
        /// Row bytes.
        len: u64,
    },
    /// Reading a row through the mapping failed (`SIGBUS`, caught): the file
    /// shrank under the mapping (truncated, or rewritten in place) or the
    /// device could not read it. Nothing was written to the output.
    #[error("{}: row {row}: {}", display_path(path), CopyError::Fault { index: 0, offset: *offset, file_len: *file_len })]
    MappedRead {
        /// The mapped file (empty if unknown).
        path: PathBuf,
        /// The row that could not be read.
        row: u64,
        /// File offset of the byte that could not be read.
        offset: u64,
        /// The file's length right after the fault, if it could be read.
        file_len: Option<u64>,
    },
    /// Reading the rows' bytes from the file failed (e.g. the file is
    /// shorter than its table: an error naming the offset, not SIGBUS).
    #[error("{backend}: {error}")]
    Read {
        /// The read backend (`pread`, `uring`, `uring-direct`, `pool`).
        backend: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        error: IoError,
    },
    /// A read backend could not be set up (the file cannot be opened, no
    /// thread could start).
    #[error("cannot set up the {backend} reader: {reason}")]
    Setup {
        /// The backend.
        backend: &'static str,
        /// Why.
        reason: String,
    },
    /// The strategy reads the file by path, but the reader was built from a
    /// bare mapping ([`Table::from_mapping`]) without one.
    #[error(
        "strategy {strategy} reads the file by path; build the reader with Table::new or with_file"
    )]
    NoFile {
        /// The strategy asked for.
        strategy: &'static str,
    },
    /// Reading rows from a remote table source failed, or a row's check
    /// did not match (nothing was written to the output).
    #[error(transparent)]
    Remote(#[from] crate::remote::RemoteError),
    /// The output buffer does not hold `rows * row_elems` floats.
    #[error("output holds {got} floats but {rows} rows of {row_elems} need {need}")]
    OutputLength {
        /// Floats given.
        got: usize,
        /// Floats needed.
        need: usize,
        /// Rows requested.
        rows: usize,
        /// Elements per row.
        row_elems: u64,
    },
}

impl GatherError {
    /// True when the source failed (a remote node, a row's check, a file's
    /// read or set-up), not the request: what a next tier may serve.
    fn is_source_failure(&self) -> bool {
        matches!(
            self,
            GatherError::Remote(_)
                | GatherError::Read { .. }
                | GatherError::MappedRead { .. }
                | GatherError::OutsideFile { .. }
                | GatherError::Unmapped { .. }
                | GatherError::Setup { .. }
                | GatherError::NoFile { .. }
        )
    }
}

/// A path for a message: `the mapped file` when unknown.
fn display_path(path: &Path) -> std::borrow::Cow<'_, str> {
    if path.as_os_str().is_empty() {
        "the mapped file".into()
    } else {
        path.to_string_lossy()
    }
}

counters! {
/// What one gather did: [`GatherStats::rows`], [`GatherStats::bytes`],
/// [`GatherStats::backend`], and every counter by name in
/// [`GatherStats::fields`]. New counters may be added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GatherStats {
    /// Row ids requested (duplicates counted).
    rows: u64,
    /// Row bytes copied out of the file (duplicates counted).
    bytes: u64,
    /// Distinct pages the rows touch (with detailed stats).
    pages: Option<u64>,
    /// Page runs handed to the kernel as advice.
    runs_advised: u64,
    /// Advice system calls made.
    advice_syscalls: u64,
    /// Runs (or calls) whose advice the kernel refused; those rows were
    /// demand-paged, the output is unaffected.
    advice_failures: u64,
    /// Major page faults taken by the gathering thread during the gather
    /// (with detailed stats, where the OS can tell).
    major_faults: Option<u64>,
    /// Rows (duplicates counted) fetched cold: with positioned reads for the
    /// direct strategies and the row-cache misses of `cached`; the rows
    /// believed cold (advised, then mapped) for `auto`.
    cold_rows: u64,
    /// `auto` only: rows the residency bitmap did not know that a probe
    /// found in the page cache; they were decoded from the mapping.
    found_resident: u64,
    /// Read requests issued (syscalls or ring entries, resubmits included).
    read_requests: u64,
    /// Bytes asked of the file by those reads (coalescing gaps and
    /// `O_DIRECT` alignment slack included).
    read_bytes: u64,
    /// The read backend that served the reads, if any (`pread`, `uring`,
    /// `uring-direct`, `pool`).
    backend: Option<&'static str>,
    /// True when the strategy's backend was unavailable (io_uring disabled,
    /// `O_DIRECT` refused) and a fallback served the reads.
    fallback: bool,
    /// `auto` only: a warm-believed part of the batch was slow and a probe
    /// confirmed pages had been evicted behind pleio's back, so the
    /// residency bitmap was reset and those rows were read as cold.
    rearmed: bool,
    /// `cached` and `shared` only: distinct rows of the gather served from
    /// the row cache (a row another gather was reading at the time counts
    /// here once it arrives: it was read once, for both).
    cache_hits: u64,
    /// `cached` and `shared` only: distinct rows read from the device
    /// (with `O_DIRECT`, [`GatherStats::read_bytes`] is then what the
    /// device delivered).
    cache_misses: u64,
    /// `cached` only: rows evicted from the cache to make room.
    cache_evictions: u64,
    /// `cached` only: bytes of rows in the cache after the gather.
    cache_bytes: Option<u64>,
    /// 1 if the gather found pleio's `SIGBUS` handler displaced by the
    /// host's (see [`Table::sigbus_guard`]; 0 if it read no mapping).
    guard_displaced: u64,
    /// 1 if it then installed the handler again (the host had restored the
    /// default disposition).
    guard_reinstalled: u64,
    /// 1 if it read mapped rows with `pread` instead (another handler had
    /// displaced pleio's, or the thread had a `SIGBUS` pending and blocked).
    guard_fallbacks: u64,
    /// 1 if the table's first source failed (a Redis cluster that did not
    /// answer or gave a row whose check failed, or a file that could not
    /// be read) and its next tier served the gather (see
    /// docs/remote.md#tiers).
    tier_fallbacks: u64,
}
}

impl GatherStats {
    /// Row ids requested (duplicates counted).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Row bytes copied out of the file (duplicates counted).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The read backend that served the reads, if any (`pread`, `uring`,
    /// `uring-direct`, `pool`).
    pub fn backend(&self) -> Option<&'static str> {
        self.backend
    }

    /// Every counter with its name, in a fixed order, for reports and
    /// bindings: `None` for one not measured (`pages`, `major_faults`
    /// without detailed stats; `cache_bytes` outside `cached`), flags as 0
    /// or 1. The names are the fields' (see their docs): `rows`, `bytes`,
    /// `pages`, `runs_advised`, `advice_syscalls`, `advice_failures`,
    /// `major_faults`, `cold_rows`, `found_resident`, `read_requests`,
    /// `read_bytes`, `fallback`, `rearmed`, `cache_hits`, `cache_misses`,
    /// `cache_evictions`, `cache_bytes`, `guard_displaced`,
    /// `guard_reinstalled`, `guard_fallbacks`, `tier_fallbacks`.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, Option<u64>)> {
        [
            ("rows", Some(self.rows)),
            ("bytes", Some(self.bytes)),
            ("pages", self.pages),
            ("runs_advised", Some(self.runs_advised)),
            ("advice_syscalls", Some(self.advice_syscalls)),
            ("advice_failures", Some(self.advice_failures)),
            ("major_faults", self.major_faults),
            ("cold_rows", Some(self.cold_rows)),
            ("found_resident", Some(self.found_resident)),
            ("read_requests", Some(self.read_requests)),
            ("read_bytes", Some(self.read_bytes)),
            ("fallback", Some(u64::from(self.fallback))),
            ("rearmed", Some(u64::from(self.rearmed))),
            ("cache_hits", Some(self.cache_hits)),
            ("cache_misses", Some(self.cache_misses)),
            ("cache_evictions", Some(self.cache_evictions)),
            ("cache_bytes", self.cache_bytes),
            ("guard_displaced", Some(self.guard_displaced)),
            ("guard_reinstalled", Some(self.guard_reinstalled)),
            ("guard_fallbacks", Some(self.guard_fallbacks)),
            ("tier_fallbacks", Some(self.tier_fallbacks)),
        ]
        .into_iter()
    }

    /// Adds the counters of `o` (for totals over many gathers); `pages`,
    /// `major_faults` and `cache_bytes` take the later value, flags are
    /// or-ed.
    #[cfg(feature = "internals")]
    pub fn add(&mut self, o: &GatherStats) {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.rows += o.rows;
        self.bytes += o.bytes;
        self.pages = sum(self.pages, o.pages);
        self.runs_advised += o.runs_advised;
        self.advice_syscalls += o.advice_syscalls;
        self.advice_failures += o.advice_failures;
        self.major_faults = sum(self.major_faults, o.major_faults);
        self.cold_rows += o.cold_rows;
        self.found_resident += o.found_resident;
        self.read_requests += o.read_requests;
        self.read_bytes += o.read_bytes;
        self.backend = o.backend.or(self.backend);
        self.fallback |= o.fallback;
        self.rearmed |= o.rearmed;
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.cache_evictions += o.cache_evictions;
        self.cache_bytes = o.cache_bytes.or(self.cache_bytes);
        self.guard_displaced += o.guard_displaced;
        self.guard_reinstalled += o.guard_reinstalled;
        self.guard_fallbacks += o.guard_fallbacks;
        self.tier_fallbacks += o.tier_fallbacks;
    }
}

/// Per-thread reusable planning storage, so a warm gather allocates nothing.
#[derive(Default)]
struct Scratch {
    planner: Planner,
    mem: Vec<MemRun>,
    /// The batch's extents and copies (a table of several regions).
    copy: PartScratch,
    /// (shard, row in the shard) of each row (a table of several regions).
    local: Vec<(usize, u64)>,
    /// One shard's local rows.
    ids: Vec<u64>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Per-thread staging of row bytes copied out of the mapping: the mapped
/// paths decode from here, never from the mapping itself, so a read that
/// faults leaves the caller's output untouched.
#[derive(Default)]
struct Staged {
    /// Row bytes, one row after another.
    bytes: Vec<u8>,
    /// Request index of each staged row (`auto`).
    slots: Vec<usize>,
    /// Distinct rows' bytes put back in request order, to be decoded as
    /// one batch (`cached`, `redis`: [`cached::put_groups`]).
    ordered: Vec<u8>,
}

/// Staging kept between gathers up to this size; larger is freed after use.
const STAGED_KEEP: usize = 64 << 20;

thread_local! {
    static STAGED: RefCell<Staged> = RefCell::new(Staged::default());
}

/// Runs `f` with this thread's staging (a fresh one if it is in use).
fn with_staged<R>(f: impl FnOnce(&mut Staged) -> R) -> R {
    STAGED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => {
            let r = f(&mut s);
            if s.bytes.capacity().max(s.ordered.capacity()) > STAGED_KEEP {
                *s = Staged::default();
            }
            r
        }
        Err(_) => f(&mut Staged::default()),
    })
}

/// The files a table's rows are in.
enum Source {
    /// A GGUF model: its shard files.
    Model(Arc<Model>),
    /// A safetensors checkpoint: the files of its table, each mapped.
    Checkpoint {
        /// The table as found.
        table: Arc<CheckpointTable>,
        /// The path it was opened from (directory, index, file, manifest).
        path: PathBuf,
        /// One mapping per file of [`CheckpointTable::files`].
        maps: Vec<Mapping>,
    },
    /// A table published to Redis (`redis://...`).
    Remote {
        /// The open table.
        table: Arc<crate::remote::RemoteTable>,
        /// Its address, without the password.
        url: PathBuf,
    },
}

/// `qwen4exp.ple.layers` of a qwen4exp model, sorted and deduplicated
/// (empty when absent, malformed, or another architecture).
fn gguf_ple_layers(model: &Model) -> Vec<u64> {
    if model.architecture() != Some(crate::ngram::QWEN_ARCH) {
        return Vec::new();
    }
    let key = format!("{}.{}", crate::ngram::QWEN_ARCH, crate::ngram::keys::LAYERS);
    let mut layers = model
        .metadata()
        .get(&key)
        .and_then(crate::gguf::Value::as_u64_array)
        .unwrap_or_default();
    layers.sort_unstable();
    layers.dedup();
    layers
}

/// The part of a table handle its clones share: the files, the layout, the
/// lazily created read backends and the residency bitmap.
struct Shared {
    source: Source,
    table: Layout,
    backends: direct::Backends,
    residency: OnceLock<known_pages::Residency>,
    /// Every region lies in a retained part of its file's mapping (the
    /// mappings do not change once the table is made), found on first use.
    wholly_mapped: OnceLock<bool>,
    totals: totals::Totals,
    /// The source to gather from when this one fails (a local copy behind
    /// Redis, or Redis behind a local copy).
    next_tier: Option<Table>,
}

/// A table of an open model, ready to gather rows: the entry point of pleio.
///
/// ```no_run
/// # fn main() -> pleio::Result<()> {
/// let table = pleio::Table::open("model-00001-of-00003.gguf")?; // the PLE table
/// let mut rows = vec![0f32; 3 * table.row_elems()];
/// table.gather(&[7, 42, 7], &mut rows)?; // request order, duplicates repeated
/// # Ok(()) }
/// ```
///
/// A handle owns its file (mapped once), its layout and its read
/// backends. It is `Send + Sync` and cheap to clone (an `Arc` inside):
/// clones share the backends (created once, on first use) and `auto`'s
/// residency knowledge, and `gather` takes `&self`, so many threads may
/// gather at once. Every id is checked before any I/O: a bad id fails the
/// gather with nothing written. Every [`Strategy`] yields the same bytes.
#[derive(Clone)]
pub struct Table {
    shared: Arc<Shared>,
    /// The rows' decoder, following `rounding`.
    decoder: Arc<Decoder>,
    rounding: Rounding,
    advisor: Arc<dyn Advisor>,
    strategy: Strategy,
    detailed: bool,
    cache: Arc<cached::CacheCell>,
    /// The worker of [`Table::prefetch`], started on first use and shared
    /// by the clones and the handles made from this one (each batch carries
    /// the handle it was prefetched on, so their strategy and rounding
    /// apply).
    prefetcher: Arc<Prefetcher>,
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("layout", &self.shared.table)
            .field("path", &self.path())
            .field("strategy", &self.strategy)
            .field("rounding", &self.rounding)
            .finish()
    }
}

impl Table {
    /// A GGUF file's (or split set's) PLE table, or its 2-D tensor
    /// `tensor`; `layer`, if given, must be a PLE layer of the model.
    pub(crate) fn open_gguf(
        path: &Path,
        tensor: Option<&str>,
        layer: Option<u64>,
    ) -> Result<Table, Error> {
        if let (Some(l), Some(t)) = (layer, tensor) {
            return Err(Error::from(CheckpointError::Unsupported {
                what: format!("PLE layer {l} together with tensor {t:?}: name one or the other"),
            })
            .in_file(path));
        }
        let model = Model::open(path).map_err(|e| Error::from(e).in_file(path))?;
        if let Some(l) = layer {
            if model.architecture() == Some(crate::ngram::GEMMA_ARCH) {
                return Err(Error::from(CheckpointError::Unsupported {
                    what: format!(
                        "PLE layer {l} of a gemma4 file: its one table holds every layer in each row (open it without a layer)"
                    ),
                })
                .in_file(path));
            }
            let layers = gguf_ple_layers(&model);
            if !layers.contains(&l) {
                return Err(
                    Error::from(CheckpointError::NoSuchLayer { layer: l, layers }).in_file(path),
                );
            }
        }
        Table::of_tensor_or_ple(Arc::new(model), tensor).map_err(|e| e.in_file(path))
    }

    /// The decoder layers (0-based) holding this table, sorted: a
    /// checkpoint's PLE layers (every one found, not only this table's), a
    /// qwen4exp GGUF file's `qwen4exp.ple.layers` (0-based decoder layer
    /// indices, as llama.cpp's `il`); empty for Gemma 4 (one table for all
    /// layers), another tensor, or a file that does not say.
    pub fn ple_layers(&self) -> Vec<u64> {
        match &self.shared.source {
            Source::Checkpoint { table, .. } => table.ple_layers.clone(),
            Source::Model(m) if self.name() == crate::layout::PLE_TENSOR => gguf_ple_layers(m),
            Source::Model(_) => Vec::new(),
            Source::Remote { table, .. } => table.manifest().ple_layers.clone(),
        }
    }

    /// The decoder layer (0-based) whose PLE table this is: the one asked
    /// for, or the lowest PLE layer when none was; `None` when unknown
    /// (Gemma 4, another tensor, a file that does not say).
    pub fn layer(&self) -> Option<u64> {
        match &self.shared.source {
            Source::Checkpoint { table, .. } => table.layer,
            Source::Remote { table, .. } => table.manifest().layer,
            Source::Model(_) => match self.ple_layers().as_slice() {
                [one] => Some(*one),
                _ => None,
            },
        }
    }

    /// A table over a checkpoint table found by [`CheckpointTable::open`]
    /// from `path`: its files are opened and mapped.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn from_checkpoint(table: Arc<CheckpointTable>, path: &Path) -> Result<Table, Error> {
        let layout = Layout::of_checkpoint(&table).map_err(|e| Error::from(e).in_file(path))?;
        let mut maps = Vec::with_capacity(table.files.len());
        for f in &table.files {
            let io = |source| {
                Error::from(CheckpointError::Io {
                    path: f.clone(),
                    source,
                })
            };
            let file = crate::sys::open_regular(f).map_err(io)?;
            maps.push(Mapping::map(&file).map_err(io)?);
        }
        let paths = table.files.clone();
        Table::build(
            Source::Checkpoint {
                table,
                path: path.to_path_buf(),
                maps,
            },
            layout,
            paths,
        )
        .map_err(|e| e.in_file(path))
    }

    /// `self` gathering from `next` when its own source fails, after
    /// checking that both hold the same table (rows, row size and format).
    pub(crate) fn with_next_tier(mut self, next: Table) -> Result<Table, Error> {
        let (a, b) = (&self.shared.table, &next.shared.table);
        if (a.rows(), a.row_bytes(), a.row_elems(), a.ty()) != (b.rows(), b.row_bytes(), b.row_elems(), b.ty()) {
            return Err(Error::from(CheckpointError::Unsupported {
                what: format!(
                    "tiers of different tables: {} has {} rows of {} ({} bytes), {} has {} rows of {} ({} bytes)",
                    self.source_path().display(),
                    a.rows(),
                    a.ty(),
                    a.row_bytes(),
                    next.source_path().display(),
                    b.rows(),
                    b.ty(),
                    b.row_bytes()
                ),
            }));
        }
        match Arc::get_mut(&mut self.shared) {
            Some(s) => s.next_tier = Some(next),
            None => {
                return Err(Error::from(CheckpointError::Unsupported {
                    what: "a next tier for a table already shared".into(),
                }))
            }
        }
        Ok(self)
    }

    /// The table published at `url` (`redis://...`, see `docs/remote.md`).
    pub(crate) fn from_remote(url: &str) -> Result<Table, Error> {
        let shown = PathBuf::from(crate::remote::url::redact(url));
        let table = crate::remote::RemoteTable::open(url).map_err(|e| Error::from(e).in_file(&shown))?;
        let layout = table.manifest().layout().map_err(|e| Error::from(e).in_file(&shown))?;
        let url = PathBuf::from(table.url().to_string());
        Table::build(
            Source::Remote {
                table: Arc::new(table),
                url: url.clone(),
            },
            layout,
            vec![url.clone()],
        )
        .map_err(|e| e.in_file(&url))
    }

    /// Opens the 2-D tensor `tensor` of a GGUF file (or split set) as a table.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn open_tensor(path: impl AsRef<Path>, tensor: &str) -> Result<Table, Error> {
        let path = path.as_ref();
        let model = Model::open(path).map_err(|e| Error::from(e).in_file(path))?;
        Table::tensor_of(Arc::new(model), tensor).map_err(|e| e.in_file(path))
    }

    /// The per-layer-embedding table of an open model.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn from_model(model: Arc<Model>) -> Result<Table, Error> {
        let layout = Layout::of_ple(&model)?;
        Table::of_model(model, layout)
    }

    /// The 2-D tensor `tensor` of an open model.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn tensor_of(model: Arc<Model>, tensor: &str) -> Result<Table, Error> {
        let layout = Layout::of_tensor(&model, tensor)?;
        Table::of_model(model, layout)
    }

    /// [`Table::tensor_of`] when a name is given, else [`Table::from_model`]
    /// (for tools whose `--tensor` is optional).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn of_tensor_or_ple(model: Arc<Model>, tensor: Option<&str>) -> Result<Table, Error> {
        let layout = Layout::of_tensor_or_ple(&model, tensor)?;
        Table::of_model(model, layout)
    }

    fn of_model(model: Arc<Model>, table: Layout) -> Result<Table, Error> {
        let paths = model
            .shards()
            .iter()
            .map(|s| s.path().to_path_buf())
            .collect();
        Table::build(Source::Model(model), table, paths)
    }

    fn build(source: Source, table: Layout, paths: Vec<PathBuf>) -> Result<Table, Error> {
        let decoder =
            Decoder::for_layout(&table).map_err(|e| Error::from(e).in_tensor(table.name()))?;
        let mut files: Vec<usize> = table.regions().map(|r| r.file).collect();
        files.sort_unstable();
        files.dedup();
        let reader = Table {
            shared: Arc::new(Shared {
                source,
                table,
                backends: direct::Backends::new(paths, files),
                residency: OnceLock::new(),
                wholly_mapped: OnceLock::new(),
                totals: totals::Totals::default(),
                next_tier: None,
            }),
            decoder: Arc::new(decoder),
            rounding: Rounding::Exact,
            advisor: sys::os_advisor(),
            strategy: Strategy::default(),
            detailed: false,
            cache: Arc::new(cached::CacheCell::new(
                DEFAULT_BUDGET,
                CachePolicy::default(),
            )),
            prefetcher: Arc::default(),
        };
        for r in reader.shared.table.regions() {
            if let Some(m) = reader.mapping_of(r.file) {
                // A table outside its file is reported by the gather, row by row.
                let _ = m.register_lazy(r.range, &*reader.advisor);
            }
        }
        Ok(reader)
    }

    /// Uses `strategy` for [`Table::gather`] and [`Table::gather_as`]
    /// (default [`Strategy::Auto`]).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn with_strategy(mut self, strategy: Strategy) -> Table {
        self.strategy = strategy;
        self
    }

    /// Uses `advisor` for page advice (tests pass a recording one).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn with_advisor(mut self, advisor: Arc<dyn Advisor>) -> Table {
        self.advisor = advisor;
        self
    }

    /// Also reports distinct pages and major faults in every
    /// [`GatherStats`] (costs a plan and two `getrusage` calls per gather).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn with_detailed_stats(mut self, on: bool) -> Table {
        self.detailed = on;
        self
    }

    /// Rounds 16-bit outputs by `rounding` (see [`Rounding`]); a rule
    /// that does not apply to this table's encoding is an
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) error.
    ///
    /// The rule belongs to this handle and the clones made from it
    /// afterwards (clones made before keep theirs); they share the files,
    /// backends and caches. On error `self` is dropped unchanged: no
    /// handle with a half-applied rule exists.
    pub fn with_rounding(mut self, rounding: Rounding) -> Result<Table, Error> {
        if rounding == self.rounding {
            return Ok(self);
        }
        // Always from the exact decoder, so rules never stack.
        let decoder = Decoder::for_layout(&self.shared.table)
            .and_then(|d| d.with_rounding(rounding))
            .map_err(|e| {
                Error::from(e)
                    .in_file(self.source_path())
                    .in_tensor(self.shared.table.name())
            })?;
        self.decoder = Arc::new(decoder);
        self.rounding = rounding;
        Ok(self)
    }

    /// The rounding rule of this handle's outputs (see [`Rounding`]).
    pub fn rounding(&self) -> Rounding {
        self.rounding
    }

    /// The strategy [`Table::gather`] uses.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Gives this handle (and clones made from it afterwards) its own row
    /// cache for [`Strategy::Cached`], holding at most `bytes` of memory:
    /// the row slots, their bookkeeping and the staging the reads that fill
    /// them use. Made on first use; without this call a handle's cache has
    /// [`DEFAULT_BUDGET`]. A budget too small for the staging of one read
    /// plus one row is an error ([`crate::ErrorKind::Setup`]) naming the
    /// smallest that works.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn with_budget(mut self, bytes: u64) -> Result<Table, Error> {
        let policy = self.cache.policy;
        // The alignment is known once the file is opened for O_DIRECT; the
        // check here assumes the common worst case (4096) and the cache
        // checks again when it is made.
        Sizing::for_table(bytes, &self.shared.table, 4096, policy).map_err(|e| {
            self.locate(GatherError::Setup {
                backend: "cached",
                reason: e.to_string(),
            })
        })?;
        self.cache = Arc::new(cached::CacheCell::new(bytes, policy));
        Ok(self)
    }

    /// Uses `policy` to pick rows to evict from this handle's row cache (a
    /// new, empty cache with the same budget; default [`CachePolicy::Sieve`]).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn with_cache_policy(mut self, policy: CachePolicy) -> Table {
        self.cache = Arc::new(cached::CacheCell::new(self.cache.budget, policy));
        self
    }

    /// The row cache's budget in bytes.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn cache_budget(&self) -> u64 {
        self.cache.budget
    }

    /// The row cache's eviction policy.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn cache_policy(&self) -> CachePolicy {
        self.cache.policy
    }

    /// What the row cache holds and has evicted so far (`None` until a
    /// [`Strategy::Cached`] gather made it).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn cache_counters(&self) -> Option<CacheCounters> {
        self.cache.made().map(|c| c.cache.counters())
    }

    /// Bytes the row cache has allocated (slots, bookkeeping and staging),
    /// at most its budget; 0 until it is made.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn cache_allocated_bytes(&self) -> u64 {
        self.cache.made().map_or(0, |c| c.cache.allocated_bytes())
    }

    /// True if `row` is in the row cache now.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn is_cached(&self, row: u64) -> bool {
        self.cache.made().is_some_and(|c| c.cache.contains(row))
    }

    /// Empties the row cache (its memory stays allocated for reuse), and
    /// the machine-wide one if this handle attached it: the next
    /// [`Strategy::Cached`] and [`Strategy::Shared`] gathers start cold.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn clear_cache(&self) {
        if let Some(c) = self.cache.made() {
            c.cache.clear();
        }
        self.clear_shared();
    }

    /// Forgets which pages `auto` believes resident, so its next gathers
    /// treat every row as cold until read. Call it after evicting the table
    /// yourself (benchmarks); eviction by others is detected without it.
    pub fn forget_residency(&self) {
        if let Some(r) = self.shared.residency.get() {
            r.clear();
        }
    }

    /// Totals of every successful gather of this table (all clones and
    /// threads, the lookahead worker's included) since it was opened.
    pub fn stats(&self) -> GatherTotals {
        self.shared.totals.get()
    }

    /// Pages of the table `auto` currently believes resident.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn believed_resident_pages(&self) -> u64 {
        self.shared.residency.get().map_or(0, |r| r.count())
    }

    /// Where the rows are: name, type, row count and size, and the row ->
    /// extents table.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn layout(&self) -> &Layout {
        &self.shared.table
    }

    /// The open GGUF model the table belongs to (`None` for a checkpoint).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn model(&self) -> Option<&Arc<Model>> {
        match &self.shared.source {
            Source::Model(m) => Some(m),
            Source::Checkpoint { .. } | Source::Remote { .. } => None,
        }
    }

    /// The checkpoint table this is (`None` for a GGUF table).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn checkpoint(&self) -> Option<&Arc<CheckpointTable>> {
        match &self.shared.source {
            Source::Model(_) | Source::Remote { .. } => None,
            Source::Checkpoint { table, .. } => Some(table),
        }
    }

    /// The file holding row 0 (for a GGUF table, the file holding the
    /// tensor: its shard, for a split set).
    pub fn path(&self) -> &Path {
        self.file_path(self.shared.table.shard())
    }

    /// The path of file `file` of the table (see
    /// [`crate::layout::ShardPart::file`]); empty if there is none.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn file_path(&self, file: usize) -> &Path {
        self.shared.backends.path(file).unwrap_or(Path::new(""))
    }

    /// The path the table was opened from: the GGUF file holding it, or the
    /// checkpoint directory, index, file or manifest given.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn source_path(&self) -> &Path {
        match &self.shared.source {
            Source::Model(_) => self.path(),
            Source::Checkpoint { path, .. } => path,
            Source::Remote { url, .. } => url,
        }
    }

    /// Tensor name.
    pub fn name(&self) -> &str {
        self.shared.table.name()
    }

    /// How the rows are stored: a ggml type or a checkpoint encoding.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn ty(&self) -> RowFormat {
        self.shared.table.ty()
    }

    /// The name of the stored row format: ggml's type name for a GGUF table
    /// (`iq4_nl`, `q8_0`, ...), the encoding of a checkpoint table (`bf16`,
    /// `fp8`, `nvfp4`, `mlx4`).
    pub fn type_name(&self) -> &'static str {
        self.shared.table.ty().name()
    }

    /// ggml's number of the stored type (e.g. 20 for IQ4_NL) for a GGUF
    /// table; `None` for a checkpoint table.
    pub fn ggml_type(&self) -> Option<u32> {
        self.shared.table.ty().ggml().map(|g| g.id())
    }

    /// Number of rows.
    pub fn rows(&self) -> u64 {
        self.shared.table.rows()
    }

    /// Stored bytes per row.
    pub fn row_bytes(&self) -> u64 {
        self.shared.table.row_bytes()
    }

    /// Elements one row decodes to.
    pub fn row_elems(&self) -> usize {
        self.shared.table.row_elems() as usize
    }

    /// Bytes `n` rows take in `dtype` (`None` if that overflows `usize`).
    pub fn out_bytes(&self, dtype: Dtype, n: usize) -> Option<usize> {
        dtype.row_out_bytes(&self.shared.table)?.checked_mul(n)
    }

    /// How this table's token ids map to row ids: the qwen4exp n-gram hash
    /// from the file's metadata, or gemma4's identity. `row_ids()?.sequence()`
    /// maps one token stream, carrying n-gram history across calls.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn row_ids(&self) -> Result<ModelRows, Error> {
        match &self.shared.source {
            Source::Model(model) => ModelRows::from_model(model, &self.shared.table)
                .map_err(|e| Error::from(e).in_file(self.path())),
            Source::Checkpoint { table, path, .. } => match table.kind {
                TableKind::QwenNgram => table
                    .ngram_params()
                    .map(ModelRows::Qwen)
                    .map_err(|e| Error::from(e).in_file(path)),
                TableKind::Gemma4 => Ok(ModelRows::Gemma(Gemma4Rows::new(table.rows))),
            },
            Source::Remote { table, url } => match table.manifest().row_ids() {
                Ok(Some(rows)) => Ok(rows),
                Ok(None) => Err(Error::from(crate::ngram::NgramError::MissingKey {
                    key: "row_ids (the table was published without a row-id mapping)".into(),
                })
                .in_file(url)),
                Err(e) => Err(Error::from(e).in_file(url)),
            },
        }
    }

    /// A new token stream of this table's row-id mapping (qwen4exp: the
    /// n-gram hash with the file's constants, history carried across calls,
    /// reset by EOS; gemma4: the token is the row): map tokens with
    /// [`OwnedSequence::map_tokens`]. An error
    /// ([`crate::ErrorKind::RowIds`]) when the file has no mapping.
    pub fn sequence(&self) -> Result<OwnedSequence, Error> {
        Ok(OwnedSequence::new(Arc::new(self.row_ids()?)))
    }

    /// A background prefetcher over this table with its strategy: hand it
    /// the next batch's ids while the current one computes.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn lookahead(&self) -> Result<Lookahead, Error> {
        Ok(Lookahead::new(self.clone(), self.strategy)?)
    }

    /// This handle without its prefetch worker (what a worker's batch
    /// holds, so the worker never keeps itself alive).
    fn detached(&self) -> Table {
        Table {
            prefetcher: Arc::default(),
            ..self.clone()
        }
    }

    /// Starts fetching `rows` as `dtype` in the background and returns at
    /// once; [`Prefetch::wait`] (or `wait_into`) hands the rows over. One
    /// worker thread per table (started on the first prefetch, shared by
    /// the table's clones, stopped when the last is dropped) runs the whole
    /// gather, I/O and decode, with this handle's strategy and rounding;
    /// batches run in the order prefetched. The ids are checked now: a bad
    /// one is an error here, and nothing is queued. Overlap the next
    /// batch's reads with this batch's compute.
    pub fn prefetch(&self, rows: &[u64], dtype: Dtype) -> Result<Prefetch, Error> {
        self.shared
            .table
            .check_rows(rows)
            .map_err(|e| self.locate(GatherError::Table(e)))?;
        self.prefetcher.start()?;
        Ok(self.prefetcher.prefetch_on(self.detached(), dtype, rows))
    }

    /// The mapping of the file holding row 0 (for a GGUF table, the one
    /// holding the table), if that file exists.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn mapping(&self) -> Option<&Mapping> {
        self.mapping_of(self.shared.table.shard())
    }

    /// Whether a file of this table that shrinks or fails under it is an
    /// error for every strategy, now, rather than a `SIGBUS` that kills the
    /// process: [`SigbusGuard::Active`] when pleio's handler is in place
    /// (this installs it on first use, and again if the host restored the
    /// default disposition); [`SigbusGuard::Displaced`] when a handler the
    /// host installed later replaced it (the mapped strategies then read
    /// with `pread`: as safe, slower; counted in
    /// [`GatherStats::guard_fallbacks`]); [`SigbusGuard::Unprotected`] on a
    /// target without the guard. Costs a `sigaction` query.
    /// Details: docs/reliability.md.
    pub fn sigbus_guard(&self) -> SigbusGuard {
        match sys::guard::state() {
            SigbusGuard::Displaced
                if (0..)
                    .map_while(|f| self.mapping_of(f))
                    .any(|m| !m.has_file()) =>
            {
                SigbusGuard::Unprotected
            }
            s => s,
        }
    }

    /// The mapping of file `file` of the table (see
    /// [`crate::layout::ShardPart::file`]).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn mapping_of(&self, file: usize) -> Option<&Mapping> {
        match &self.shared.source {
            Source::Model(m) => m.shard_mapping(file),
            Source::Checkpoint { maps, .. } => maps.get(file),
            Source::Remote { .. } => None,
        }
    }

    /// Checks `ids` (held in any [`RowId`] type) and widens them to the row
    /// numbers [`Table::gather`] takes, in `rows` (cleared first). A
    /// negative id, or one not below [`Table::rows`], is a
    /// [`ErrorKind::RowOutOfRange`](crate::ErrorKind::RowOutOfRange) error
    /// naming it and the row count, as a gather's own check would be.
    pub fn rows_from<I: RowId>(&self, ids: &[I], rows: &mut Vec<u64>) -> Result<(), Error> {
        self.shared
            .table
            .rows_from(ids, rows)
            .map_err(|e| self.locate(GatherError::Table(e)))
    }

    /// Decodes `rows` to f32 with the table's strategy, in request order
    /// (duplicates repeated), into `out`, which must hold exactly
    /// `rows.len() * row_elems` floats.
    pub fn gather(&self, rows: &[u64], out: &mut [f32]) -> Result<GatherStats, Error> {
        self.gather_with(self.strategy, rows, out)
    }

    /// [`Table::gather`] with another strategy.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn gather_with(
        &self,
        strategy: Strategy,
        rows: &[u64],
        out: &mut [f32],
    ) -> Result<GatherStats, Error> {
        self.gather_inner(strategy, rows, Out::f32(out, &self.shared.table))
            .map_err(|e| self.locate(e))
    }

    /// Gathers `rows` into `out` as `dtype` (little-endian, rows back to
    /// back): f32, bf16 or f16 (rounded to nearest even from the exact f32
    /// value, or by the table's [`Rounding`] rule), or the stored bytes
    /// (`raw`). `out` must hold exactly
    /// [`Table::out_bytes`]`(dtype, rows.len())` bytes.
    pub fn gather_as(
        &self,
        dtype: Dtype,
        rows: &[u64],
        out: &mut [u8],
    ) -> Result<GatherStats, Error> {
        self.gather_as_with(self.strategy, dtype, rows, out)
    }

    /// [`Table::gather_as`] with another strategy.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn gather_as_with(
        &self,
        strategy: Strategy,
        dtype: Dtype,
        rows: &[u64],
        out: &mut [u8],
    ) -> Result<GatherStats, Error> {
        let got = out.len();
        let o = Out::bytes(dtype, &self.shared.table, out).ok_or_else(|| {
            self.locate(GatherError::OutputLength {
                got,
                need: usize::MAX,
                rows: 1,
                row_elems: self.shared.table.row_elems(),
            })
        })?;
        self.gather_inner(strategy, rows, o)
            .map_err(|e| self.locate(e))
    }

    /// The warm floor's copy-and-decode (`limit-warm` in pleio's lab): output
    /// row `i` is the stored row `order[i]` of `stored` (stored rows back to
    /// back, as [`Dtype::Raw`] gathers them), written as a gather into `out`
    /// would write it, straight from `stored`, one row after another.
    #[cfg(feature = "internals")]
    pub fn decode_stored(&self, stored: &[u8], order: &[u32], out: &mut [f32]) -> Result<(), Error> {
        let o = Out::f32(out, &self.shared.table);
        self.decode_stored_into(stored, order, o)
    }

    /// [`Table::decode_stored`] as `dtype` bytes.
    #[cfg(feature = "internals")]
    pub fn decode_stored_as(
        &self,
        dtype: Dtype,
        stored: &[u8],
        order: &[u32],
        out: &mut [u8],
    ) -> Result<(), Error> {
        let got = out.len();
        let o = Out::bytes(dtype, &self.shared.table, out).ok_or_else(|| {
            self.locate(GatherError::OutputLength {
                got,
                need: usize::MAX,
                rows: order.len(),
                row_elems: self.shared.table.row_elems(),
            })
        })?;
        self.decode_stored_into(stored, order, o)
    }

    #[cfg(feature = "internals")]
    fn decode_stored_into(&self, stored: &[u8], order: &[u32], mut out: Out<'_>) -> Result<(), Error> {
        let t = &self.shared.table;
        let rb = t.row_bytes() as usize;
        let need = order.len().checked_mul(out.row_len());
        if need != Some(out.len()) {
            return Err(self.locate(GatherError::OutputLength {
                got: out.len(),
                need: need.unwrap_or(usize::MAX),
                rows: order.len(),
                row_elems: t.row_elems(),
            }));
        }
        for (i, &k) in order.iter().enumerate() {
            let src = (k as usize)
                .checked_mul(rb)
                .and_then(|at| stored.get(at..at.checked_add(rb)?))
                .ok_or_else(|| {
                    self.locate(GatherError::OutputLength {
                        got: stored.len(),
                        need: (k as usize).saturating_add(1).saturating_mul(rb),
                        rows: order.len(),
                        row_elems: t.row_elems(),
                    })
                })?;
            out.put(i, src, &self.decoder)
                .map_err(|e| self.locate(GatherError::from(e)))?;
        }
        Ok(())
    }

    fn locate(&self, e: GatherError) -> Error {
        Error::from(e)
            .in_file(self.source_path())
            .in_tensor(self.shared.table.name())
    }

    /// The gather behind every public entry: checks the output size and
    /// every id, then runs `strategy`.
    pub(crate) fn gather_inner(
        &self,
        strategy: Strategy,
        rows: &[u64],
        mut out: Out<'_>,
    ) -> Result<GatherStats, GatherError> {
        let t = &self.shared.table;
        let need = rows.len().checked_mul(out.row_len());
        if need != Some(out.len()) {
            return Err(GatherError::OutputLength {
                got: out.len(),
                need: need.unwrap_or(usize::MAX),
                rows: rows.len(),
                row_elems: t.row_elems(),
            });
        }
        t.check_rows(rows)?;
        let faults_before = self.detailed.then(sys::thread_major_faults).flatten();
        let mut stats = GatherStats {
            rows: rows.len() as u64,
            bytes: (rows.len() as u64).saturating_mul(t.row_bytes()),
            ..GatherStats::default()
        };
        let remote = matches!(self.shared.source, Source::Remote { .. });
        match strategy {
            _ if remote => {}
            Strategy::Advise => self.plan(rows, &mut stats, true),
            _ if self.detailed => self.plan(rows, &mut stats, false),
            _ => {}
        }
        let out = &mut out;
        // Checks the SIGBUS guard once, when a mapping is first read.
        let guard = sys::guard::Scope::new();
        if let Err(e) = self.run_strategy(strategy, rows, out, &mut stats, &guard) {
            let next = self.shared.next_tier.as_ref().filter(|_| e.is_source_failure());
            let Some(next) = next else { return Err(e) };
            // Nothing was written: the next tier gathers the same rows, with
            // this handle's rounding.
            let next = next.clone().with_rounding(self.rounding).map_err(|_| e)?;
            stats.tier_fallbacks = 1;
            next.run_strategy(strategy, rows, out, &mut stats, &guard)?;
        }
        let events = guard.events();
        stats.guard_displaced = u64::from(events.displaced);
        stats.guard_reinstalled = u64::from(events.reinstalled);
        stats.guard_fallbacks = u64::from(events.fell_back);
        if let Some(before) = faults_before {
            stats.major_faults = sys::thread_major_faults().map(|now| now.saturating_sub(before));
        }
        self.shared.totals.add(&stats);
        Ok(stats)
    }

    /// Runs `strategy` over this table's source.
    fn run_strategy(
        &self,
        strategy: Strategy,
        rows: &[u64],
        out: &mut Out<'_>,
        stats: &mut GatherStats,
        guard: &sys::guard::Scope,
    ) -> Result<(), GatherError> {
        match (&self.shared.source, strategy) {
            // A row cache in front of the cluster: misses go to Redis.
            (Source::Remote { .. }, Strategy::Cached) => self.gather_cached(rows, out, stats),
            (Source::Remote { .. }, Strategy::Shared) => self.gather_shared(rows, out, stats, guard),
            // The file strategies have no file to read: straight from the cluster.
            (Source::Remote { table, .. }, _) => self.gather_remote(table, rows, out, stats),
            // The files, by the strategy.
            (_, Strategy::Fault | Strategy::Advise) => self.gather_mapped(rows, out, guard),
            (_, Strategy::Auto) => self.gather_auto(rows, out, stats, guard),
            (_, Strategy::Pread) => self.gather_direct(direct::Kind::Pread, rows, out, stats),
            (_, Strategy::Uring) => self.gather_direct(direct::Kind::Uring, rows, out, stats),
            (_, Strategy::UringDirect) => self.gather_direct(direct::Kind::UringDirect, rows, out, stats),
            (_, Strategy::Pool) => self.gather_direct(direct::Kind::Pool, rows, out, stats),
            (_, Strategy::Cached) => self.gather_cached(rows, out, stats),
            (_, Strategy::Shared) => self.gather_shared(rows, out, stats, guard),
        }
    }

    /// Plans the pages of `rows`; with `advise`, advises them chunk by chunk
    /// through the mapping (which refuses anything outside its retained
    /// fragments). A table of several regions is planned region by region,
    /// with each shard's rows. Never fails: advice problems are counted.
    fn plan(&self, rows: &[u64], stats: &mut GatherStats, advise: bool) {
        let t = &self.shared.table;
        let mut run = |s: &mut Scratch| {
            let mut pages = 0u64;
            if let Some(r) = t.single_region() {
                let span = RowSpan {
                    offset: r.range.start,
                    row_bytes: r.row_bytes,
                    n_rows: r.rows,
                };
                pages += self.plan_region(r.file, span, rows, stats, advise, s);
            } else {
                s.local.clear();
                // Checked rows: every one is in a shard.
                let shards = t.shards();
                s.local
                    .extend(rows.iter().filter_map(|&row| shard_of(shards, row)));
                s.local.sort_unstable();
                let mut i = 0;
                while i < s.local.len() {
                    let shard = s.local[i].0;
                    let n = s.local[i..].partition_point(|l| l.0 == shard);
                    let mut ids = std::mem::take(&mut s.ids);
                    ids.clear();
                    ids.extend(s.local[i..i + n].iter().map(|l| l.1));
                    let sh = &t.shards()[shard];
                    for p in &sh.parts {
                        let span = RowSpan {
                            offset: p.offset,
                            row_bytes: p.row_bytes,
                            n_rows: sh.rows,
                        };
                        pages += self.plan_region(p.file, span, &ids, stats, advise, s);
                    }
                    s.ids = ids;
                    i += n;
                }
            }
            if self.detailed {
                stats.pages = Some(pages);
            }
        };
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => run(&mut s),
            Err(_) => run(&mut Scratch::default()),
        });
    }

    /// Plans (and with `advise`, advises) the pages of rows `ids` of one
    /// region, read through the mapping of file `file`; adds the advice
    /// counts to `stats` and returns the distinct pages planned. Only a
    /// region wholly inside one lazy range is planned.
    fn plan_region(
        &self,
        file: usize,
        span: RowSpan,
        ids: &[u64],
        stats: &mut GatherStats,
        advise: bool,
        s: &mut Scratch,
    ) -> u64 {
        let Some(m) = self.mapping_of(file) else {
            return 0;
        };
        let Some(lazy) = m.lazy_range_containing(span.offset, span.row_bytes * span.n_rows) else {
            return 0;
        };
        let bounds = Bounds {
            page: m.page_size(),
            lazy,
            file_len: m.len() as u64,
            retained: m.retained(),
        };
        s.planner.plan(span, ids, &bounds);
        if advise {
            let mut outcome = AdviceOutcome::default();
            let Scratch { planner, mem, .. } = s;
            for chunk in planner.chunks().filter(|c| !c.is_empty()) {
                outcome.add(m.advise_will_need(chunk, &*self.advisor, mem));
            }
            stats.runs_advised += outcome.runs;
            stats.advice_syscalls += outcome.syscalls;
            stats.advice_failures += outcome.failures;
        }
        s.planner.distinct_pages()
    }

    /// The error of a failed copy of `rows` of file `file` (parts of `len`
    /// bytes).
    fn copy_error(&self, file: usize, rows: &[u64], len: u64, e: CopyError) -> GatherError {
        match e {
            CopyError::Fault {
                index,
                offset,
                file_len,
            } => GatherError::MappedRead {
                path: self.file_path(file).to_path_buf(),
                row: rows.get(index).copied().unwrap_or_default(),
                offset,
                file_len,
            },
            CopyError::NotMapped { start, .. } => GatherError::OutsideFile { offset: start, len },
            CopyError::Destination { need, got } => GatherError::OutputLength {
                got,
                need: usize::try_from(need).unwrap_or(usize::MAX),
                rows: rows.len(),
                row_elems: self.shared.table.row_elems(),
            },
        }
    }

    /// Copies `rows` (all inside the table) out of the mappings into `dst`,
    /// one after another, each row's parts concatenated. A fault is an
    /// error naming the file, the row and the offset; rows outside the
    /// mapping are `OutsideFile` or `Unmapped`. `guard`: the gather's.
    fn copy_mapped(
        &self,
        guard: &sys::guard::Scope,
        rows: &[u64],
        dst: &mut [u8],
    ) -> Result<(), GatherError> {
        let t = &self.shared.table;
        let rb = t.row_bytes();
        if let Some(r) = t.single_region() {
            let Some(m) = self.mapping_of(r.file) else {
                let offset = rows
                    .first()
                    .map_or(r.range.start, |&row| r.range.start + row * rb);
                return Err(GatherError::OutsideFile { offset, len: rb });
            };
            match m.copy_rows_in(guard, r.range.start, rb, rows, dst) {
                // Usual case: the whole table is mapped, one check for all rows.
                Err(CopyError::NotMapped { .. }) => {}
                res => return res.map_err(|e| self.copy_error(r.file, rows, rb, e)),
            }
        }
        // Several regions, or part of the table is not mapped: part by part,
        // to name the row.
        with_part_scratch(|s| {
            t.batch_extents(rows, ExtentOrder::Rows, &mut s.parts)?;
            self.copy_extents(guard, rows, &s.parts, false, dst, &mut s.addrs, &mut s.spill)
        })
    }

    /// The general case of [`Table::copy_mapped`]: the parts `parts` (of
    /// `rows`, in row order) copied by one guarded call per part number
    /// ([`Table::copy_parts_at_once`]), or, where that cannot be (a part
    /// not mapped, a fault, an unguarded thread), each part of each row
    /// on its own, to name the failing part or read it with `pread`. Every
    /// part's lines are prefetched once, before the first copy (of several
    /// part numbers or of single parts), so the copies do not wait for
    /// memory one after another, unless `ahead` (the caller asked memory for
    /// them earlier). `addrs`, `spill`: scratch.
    #[allow(clippy::too_many_arguments)]
    fn copy_extents(
        &self,
        guard: &sys::guard::Scope,
        rows: &[u64],
        parts: &[BatchExtent],
        ahead: bool,
        dst: &mut [u8],
        addrs: &mut Vec<u64>,
        spill: &mut Vec<u8>,
    ) -> Result<(), GatherError> {
        let t = &self.shared.table;
        let rb = t.row_bytes();
        let per_row = t.parts().max(1);
        // One part a row is copied at once with no wait between rows; a
        // batch copied part number by part number would wait for memory
        // once a part number (MLX 4-bit's warm 16-row windows: 1.8x).
        if per_row > 1 && !ahead {
            self.prefetch_extents(parts);
        }
        if self.copy_parts_at_once(guard, parts, dst, addrs, spill) {
            return Ok(());
        }
        if per_row == 1 {
            self.prefetch_extents(parts);
        }
        for (i, (slot, row_parts)) in dst
            .chunks_exact_mut(rb as usize)
            .zip(parts.chunks_exact(per_row))
            .enumerate()
        {
            let mut at = 0usize;
            for e in row_parts.iter().map(|p| &p.extent) {
                let (offset, len) = (e.offset, e.len);
                let part = &mut slot[at..at + len as usize];
                at += len as usize;
                let Some(m) = self.mapping_of(e.file) else {
                    return Err(GatherError::OutsideFile { offset, len });
                };
                match m.copy_rows_in(guard, offset, len, &[0], part) {
                    Ok(()) => {}
                    Err(CopyError::NotMapped { .. }) => {
                        let inside = offset.checked_add(len).is_some_and(|e| e <= m.len() as u64);
                        return Err(if inside {
                            GatherError::Unmapped { offset, len }
                        } else {
                            GatherError::OutsideFile { offset, len }
                        });
                    }
                    Err(err) => return Err(self.copy_error(e.file, &rows[i..=i], len, err)),
                }
            }
        }
        Ok(())
    }

    /// Asks memory for the lines of every one of `parts` (a software
    /// prefetch: no fault, no wait).
    fn prefetch_extents(&self, parts: &[BatchExtent]) {
        for p in parts {
            if let Some(m) = self.mapping_of(p.extent.file) {
                m.prefetch(p.extent.offset, p.extent.len);
            }
        }
    }

    /// Copies the batch's `parts` (in row order, [`Table::parts`] a row)
    /// into `dst` with one guarded copy per part number: a table of one
    /// part a row straight into `dst`, otherwise part `k` of every row into
    /// `spill`, then into each row's slot. A warm 1792-row FP8 gather made
    /// 1792 checked copy calls before. False (`dst` unspecified) where the
    /// mapping cannot serve them all at once; `addrs`, `spill`: scratch.
    fn copy_parts_at_once(
        &self,
        guard: &sys::guard::Scope,
        parts: &[BatchExtent],
        dst: &mut [u8],
        addrs: &mut Vec<u64>,
        spill: &mut Vec<u8>,
    ) -> bool {
        let per_row = self.shared.table.parts().max(1);
        let Some(first) = parts.get(..per_row) else {
            return parts.is_empty();
        };
        // Part `k` of every row, if all of them are `len` bytes long.
        let part = |k: usize, len: u64| {
            parts.iter().skip(k).step_by(per_row).map(move |p| {
                let e = &p.extent;
                (e.len == len)
                    .then(|| self.mapping_of(e.file))
                    .flatten()
                    .map(|m| (m, e.offset))
            })
        };
        if per_row == 1 {
            let len = first[0].extent.len;
            return Mapping::copy_parts_in(guard, part(0, len), len, addrs, dst);
        }
        let rb = self.shared.table.row_bytes() as usize;
        let rows = parts.len() / per_row;
        let mut at = 0usize;
        for (k, p) in first.iter().enumerate() {
            let len = p.extent.len;
            let Some(bytes) = usize::try_from(len).ok().filter(|&l| at + l <= rb) else {
                return false;
            };
            spill.resize(rows * bytes, 0);
            if !Mapping::copy_parts_in(guard, part(k, len), len, addrs, spill) {
                return false;
            }
            for (slot, src) in dst.chunks_exact_mut(rb).zip(spill.chunks_exact(bytes)) {
                slot[at..at + bytes].copy_from_slice(src);
            }
            at += bytes;
        }
        true
    }

    /// Writes `staged` rows (one after another) into the output slots
    /// `slots` (request indices; `None`: in order).
    fn put_staged(
        &self,
        staged: &[u8],
        slots: Option<&[usize]>,
        out: &mut Out<'_>,
    ) -> Result<(), GatherError> {
        let rb = self.shared.table.row_bytes() as usize;
        let rows = staged.chunks_exact(rb);
        match slots {
            None if out.put_raw_rows(staged) => {}
            None if out.put_decoded_rows(staged, &self.decoder)? => {}
            None => {
                for (i, src) in rows.enumerate() {
                    out.put(i, src, &self.decoder)?;
                }
            }
            Some(slots) => {
                for (src, &j) in rows.zip(slots) {
                    out.put(j, src, &self.decoder)?;
                }
            }
        }
        Ok(())
    }

    /// The mapped path: the rows' bytes copied out of the mapping into
    /// per-thread staging (a shrunk file is an error there, not `SIGBUS`),
    /// then written to `out`, which is touched only once every row was
    /// read. Never reads outside the retained fragments: such a row is an
    /// error.
    fn gather_mapped(
        &self,
        rows: &[u64],
        out: &mut Out<'_>,
        guard: &sys::guard::Scope,
    ) -> Result<(), GatherError> {
        with_staged(|s| {
            let need = self.stage_rows(&mut s.bytes, rows.len(), rows.len(), out)?;
            self.copy_mapped(guard, rows, &mut s.bytes[..need])?;
            self.put_staged(&s.bytes[..need], None, out)
        })
    }

    /// Grows `bytes` to hold at least `n` rows and returns their length;
    /// an overflow is the output-size error of a request of `requested`
    /// ids.
    fn stage_rows(
        &self,
        bytes: &mut Vec<u8>,
        n: usize,
        requested: usize,
        out: &Out<'_>,
    ) -> Result<usize, GatherError> {
        let need = n
            .checked_mul(self.shared.table.row_bytes() as usize)
            .ok_or(GatherError::OutputLength {
                got: out.len(),
                need: usize::MAX,
                rows: requested,
                row_elems: self.shared.table.row_elems(),
            })?;
        if bytes.len() < need {
            bytes.resize(need, 0);
        }
        Ok(need)
    }
}

/// Runs `f` with the copy scratch taken from this thread's [`Scratch`]
/// (a fresh one if that is in use), put back after.
fn with_part_scratch<R>(f: impl FnOnce(&mut PartScratch) -> R) -> R {
    let mut ps = SCRATCH
        .with(|c| c.try_borrow_mut().map(|mut s| std::mem::take(&mut s.copy)))
        .unwrap_or_default();
    let r = f(&mut ps);
    SCRATCH.with(|c| {
        if let Ok(mut s) = c.try_borrow_mut() {
            s.copy = ps;
        }
    });
    r
}

/// The scratch of [`Table::copy_extents`], taken from this thread's
/// [`Scratch`] for the call ([`with_part_scratch`]).
#[derive(Default)]
struct PartScratch {
    /// A batch's extents, in row order.
    parts: Vec<BatchExtent>,
    /// A whole batch's extents, in row order, while `auto` copies it a
    /// window at a time.
    batch: Vec<BatchExtent>,
    /// The source address of each part copied at once.
    addrs: Vec<u64>,
    /// One part of every row of a batch (a table of several parts a row).
    spill: Vec<u8>,
}

impl From<GatherError> for Error {
    fn from(e: GatherError) -> Error {
        match e {
            GatherError::Table(t) => Error::from(t),
            GatherError::Decode(d) => Error::from(d),
            GatherError::Remote(r) => Error::from(r),
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
                        (ErrorKind::Io, error.offset(), Some(path.clone()))
                    }
                    GatherError::OutputLength { .. } => (ErrorKind::OutputSize, None, None),
                    _ => (ErrorKind::Setup, None, None),
                };
                Error::new(kind, e).at(row, offset, path)
            }
        }
    }
}
