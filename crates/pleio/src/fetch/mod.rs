//! Fetching rows: the strategies that turn row ids into decoded f32 rows.
//!
//! Every strategy produces identical bytes for the same request; they differ
//! only in how the row bytes get from the disk into memory. This stage
//! validates every id before any I/O, so a bad id never yields partial output.
//!
//! - mapped (`fault`, `advise`): decode straight from the file mapping;
//! - direct (`pread`, `uring`, `uring-direct`, `pool`, in [`direct`]):
//!   sorted, deduplicated rows read by positioned reads into reused staging,
//!   no mapping touched (a truncated file is an error, never SIGBUS);
//! - `auto` ([`auto`]): resident rows mapped, rows believed cold read
//!   through io_uring, residency tracked by a per-table page bitmap
//!   ([`residency`]) that re-arms itself on an eviction signature.

mod auto;
mod direct;
mod known_pages;

use std::cell::RefCell;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use crate::io::IoError;
use crate::map::Mapping;
use crate::model::Model;
use crate::page_plan::{Bounds, Planner, RowSpan};
use crate::quant::{DecodeError, RowDecoder};
use crate::sys::{self, AdviceOutcome, Advisor, MemRun};
use crate::table::{Table, TableError};

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
    /// system call); only rows believed cold are read through `Uring`.
    Auto,
}

impl Strategy {
    /// Every strategy this build has.
    pub const ALL: &'static [Strategy] = &[
        Strategy::Fault,
        Strategy::Advise,
        Strategy::Pread,
        Strategy::Uring,
        Strategy::UringDirect,
        Strategy::Pool,
        Strategy::Auto,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Fault => "fault",
            Strategy::Advise => "advise",
            Strategy::Pread => "pread",
            Strategy::Uring => "uring",
            Strategy::UringDirect => "uring-direct",
            Strategy::Pool => "pool",
            Strategy::Auto => "auto",
        }
    }

    /// True for the strategies that decode from the mapping only.
    pub fn is_mapped(self) -> bool {
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

/// Errors from a gather.
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
    /// Reading the rows' bytes from the file failed (e.g. the file is
    /// shorter than its table: an error naming the offset, not SIGBUS).
    #[error("{backend} read of {path}: {source}")]
    Read {
        /// The read backend (`pread`, `uring`, `uring-direct`, `pool`).
        backend: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: IoError,
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
    /// bare mapping ([`TableReader::from_mapping`]) without one.
    #[error("strategy {strategy} reads the file by path; build the reader with TableReader::new or with_file")]
    NoFile {
        /// The strategy asked for.
        strategy: &'static str,
    },
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

/// What one gather did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GatherStats {
    /// Row ids requested (duplicates counted).
    pub rows: u64,
    /// Row bytes copied out of the file (duplicates counted).
    pub bytes: u64,
    /// Distinct pages the rows touch (with detailed stats).
    pub pages: Option<u64>,
    /// Page runs handed to the kernel as advice.
    pub runs_advised: u64,
    /// Advice system calls made.
    pub advice_syscalls: u64,
    /// Runs (or calls) whose advice the kernel refused; those rows were
    /// demand-paged, the output is unaffected.
    pub advice_failures: u64,
    /// Major page faults taken by the gathering thread during the gather
    /// (with detailed stats, where the OS can tell).
    pub major_faults: Option<u64>,
    /// Rows (duplicates counted) fetched with positioned reads rather than
    /// through the mapping: all rows for the direct strategies, the rows
    /// believed cold for `auto`.
    pub cold_rows: u64,
    /// `auto` only: rows the residency bitmap did not know that `mincore`
    /// found in the page cache; they were decoded from the mapping.
    pub found_resident: u64,
    /// Read requests issued (syscalls or ring entries, resubmits included).
    pub read_requests: u64,
    /// Bytes asked of the file by those reads (coalescing gaps and
    /// `O_DIRECT` alignment slack included).
    pub read_bytes: u64,
    /// The read backend that served the reads, if any (`pread`, `uring`,
    /// `uring-direct`, `pool`).
    pub backend: Option<&'static str>,
    /// True when the strategy's backend was unavailable (io_uring disabled,
    /// `O_DIRECT` refused) and a fallback served the reads.
    pub fallback: bool,
    /// `auto` only: a warm-believed part of the batch was slow and `mincore`
    /// confirmed pages had been evicted behind pleio's back, so the
    /// residency bitmap was reset and those rows were read as cold.
    pub rearmed: bool,
}

/// Where a reader's bytes come from.
#[derive(Debug, Clone)]
enum Source {
    Model(Arc<Model>),
    Mapping(Arc<Mapping>),
}

/// Per-thread reusable planning storage, so a warm gather allocates nothing.
#[derive(Default)]
struct Scratch {
    planner: Planner,
    mem: Vec<MemRun>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The part of a reader its clones share: the table, the lazily created
/// read backends and the residency bitmap.
struct Shared {
    source: Source,
    table: Table,
    decoder: RowDecoder,
    backends: direct::Backends,
    residency: OnceLock<known_pages::Residency>,
}

/// Gathers rows of one table of an open model (or of one mapped file).
///
/// `Send + Sync` and cheap to clone (an `Arc` inside): clones share the read
/// backends (created once, on first use) and `auto`'s residency knowledge,
/// so a background thread can gather through a clone. `gather` takes
/// `&self` and may run on many threads at once.
#[derive(Clone)]
pub struct TableReader {
    shared: Arc<Shared>,
    advisor: Arc<dyn Advisor>,
    detailed: bool,
}

impl fmt::Debug for TableReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableReader")
            .field("table", &self.shared.table)
            .field("path", &self.shared.backends.path())
            .field("detailed", &self.detailed)
            .finish()
    }
}

impl TableReader {
    /// A reader for `table` of `model`; fails if the type has no decoder.
    /// Registers the table's bytes as a lazy range of its shard's mapping.
    pub fn new(model: Arc<Model>, table: Table) -> Result<TableReader, GatherError> {
        let path = model
            .shards()
            .get(table.shard)
            .map(|s| s.path().to_path_buf());
        TableReader::with_source(Source::Model(model), table, path)
    }

    /// A reader for `table` (offsets in the file of `mapping`), e.g. for an
    /// engine that maps and unmaps fragments itself. Without a path (see
    /// [`TableReader::with_file`]) only the mapped strategies work, and
    /// `auto` decodes everything from the mapping.
    pub fn from_mapping(mapping: Arc<Mapping>, table: Table) -> Result<TableReader, GatherError> {
        TableReader::with_source(Source::Mapping(mapping), table, None)
    }

    /// Like [`TableReader::from_mapping`], with the path of the mapped file
    /// for the strategies that read it directly.
    pub fn with_file(
        mapping: Arc<Mapping>,
        table: Table,
        path: impl Into<PathBuf>,
    ) -> Result<TableReader, GatherError> {
        TableReader::with_source(Source::Mapping(mapping), table, Some(path.into()))
    }

    fn with_source(
        source: Source,
        table: Table,
        path: Option<PathBuf>,
    ) -> Result<TableReader, GatherError> {
        let decoder = RowDecoder::new(table.ty)?;
        let reader = TableReader {
            shared: Arc::new(Shared {
                source,
                table,
                decoder,
                backends: direct::Backends::new(path),
                residency: OnceLock::new(),
            }),
            advisor: sys::os_advisor(),
            detailed: false,
        };
        if let Some(m) = reader.mapping() {
            let t = &reader.shared.table;
            let range = t.offset..t.offset.saturating_add(t.bytes());
            // A table outside its file is reported by the gather, row by row.
            let _ = m.register_lazy(range, &*reader.advisor);
        }
        Ok(reader)
    }

    /// Uses `advisor` for page advice (tests pass a recording one).
    pub fn with_advisor(mut self, advisor: Arc<dyn Advisor>) -> TableReader {
        self.advisor = advisor;
        self
    }

    /// Also reports distinct pages and major faults in every
    /// [`GatherStats`] (costs a plan and two `getrusage` calls per gather).
    pub fn with_detailed_stats(mut self, on: bool) -> TableReader {
        self.detailed = on;
        self
    }

    /// Forgets which pages `auto` believes resident, so its next gathers
    /// treat every row as cold until read. Call it after evicting the table
    /// yourself (benchmarks); eviction by others is detected without it.
    pub fn forget_residency(&self) {
        if let Some(r) = self.shared.residency.get() {
            r.clear();
        }
    }

    /// Pages of the table `auto` currently believes resident.
    pub fn believed_resident_pages(&self) -> u64 {
        self.shared.residency.get().map_or(0, |r| r.count())
    }

    /// The table read.
    pub fn table(&self) -> &Table {
        &self.shared.table
    }

    /// Floats one row decodes to.
    pub fn row_elems(&self) -> usize {
        self.shared.table.row_elems as usize
    }

    /// The mapping holding the table, if its shard exists.
    pub fn mapping(&self) -> Option<&Mapping> {
        match &self.shared.source {
            Source::Model(m) => m.shard_mapping(self.shared.table.shard),
            Source::Mapping(m) => Some(m),
        }
    }

    fn span(&self) -> RowSpan {
        let t = &self.shared.table;
        RowSpan {
            offset: t.offset,
            row_bytes: t.row_bytes,
            n_rows: t.n_rows,
        }
    }

    /// Decodes `rows` (in request order, duplicates repeated) into `out`,
    /// which must hold `rows.len() * row_elems` floats.
    ///
    /// Every id is checked first: a bad id fails the gather before any I/O.
    /// Output bytes are the same for every strategy.
    pub fn gather(
        &self,
        strategy: Strategy,
        rows: &[u64],
        out: &mut [f32],
    ) -> Result<GatherStats, GatherError> {
        let t = &self.shared.table;
        let elems = self.row_elems();
        let need = rows.len().saturating_mul(elems);
        if out.len() != need {
            return Err(GatherError::OutputLength {
                got: out.len(),
                need,
                rows: rows.len(),
                row_elems: t.row_elems,
            });
        }
        t.check_rows(rows)?;
        let faults_before = self.detailed.then(sys::thread_major_faults).flatten();
        let mut stats = GatherStats {
            rows: rows.len() as u64,
            bytes: rows.len() as u64 * t.row_bytes,
            ..GatherStats::default()
        };
        match strategy {
            Strategy::Advise => self.plan(rows, &mut stats, true),
            _ if self.detailed => self.plan(rows, &mut stats, false),
            _ => {}
        }
        match strategy {
            Strategy::Fault | Strategy::Advise => self.gather_mapped(rows, out)?,
            Strategy::Auto => self.gather_auto(rows, out, &mut stats)?,
            Strategy::Pread => self.gather_direct(direct::Kind::Pread, rows, out, &mut stats)?,
            Strategy::Uring => self.gather_direct(direct::Kind::Uring, rows, out, &mut stats)?,
            Strategy::UringDirect => {
                self.gather_direct(direct::Kind::UringDirect, rows, out, &mut stats)?
            }
            Strategy::Pool => self.gather_direct(direct::Kind::Pool, rows, out, &mut stats)?,
        }
        if let Some(before) = faults_before {
            stats.major_faults = sys::thread_major_faults().map(|now| now.saturating_sub(before));
        }
        Ok(stats)
    }

    /// Plans the pages of `rows`; with `advise`, advises them chunk by chunk
    /// through the mapping (which refuses anything outside its retained
    /// fragments). Never fails: advice problems are counted.
    fn plan(&self, rows: &[u64], stats: &mut GatherStats, advise: bool) {
        let Some(m) = self.mapping() else { return };
        let t = &self.shared.table;
        // Only a table wholly inside one lazy range is planned.
        let Some(lazy) = m.lazy_range_containing(t.offset, t.bytes()) else {
            return;
        };
        let bounds = Bounds {
            page: m.page_size(),
            lazy,
            file_len: m.len() as u64,
            retained: m.retained(),
        };
        let mut run = |s: &mut Scratch| {
            s.planner.plan(self.span(), rows, &bounds);
            if advise {
                let mut outcome = AdviceOutcome::default();
                let Scratch { planner, mem } = s;
                for chunk in planner.chunks().filter(|c| !c.is_empty()) {
                    outcome.add(m.advise_will_need(chunk, &*self.advisor, mem));
                }
                stats.runs_advised = outcome.runs;
                stats.advice_syscalls = outcome.syscalls;
                stats.advice_failures = outcome.failures;
            }
            if self.detailed {
                stats.pages = Some(s.planner.distinct_pages());
            }
        };
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => run(&mut s),
            Err(_) => run(&mut Scratch::default()),
        });
    }

    /// The straight mapped path: copy-free decode from the mapping. Never
    /// reads outside the retained fragments: such a row is an error.
    fn gather_mapped(&self, rows: &[u64], out: &mut [f32]) -> Result<(), GatherError> {
        let t = &self.shared.table;
        let rb = t.row_bytes;
        let mapping = self.mapping();
        // Usual case: the whole table is mapped, one check for all rows.
        let whole = mapping.and_then(|m| m.bytes(t.offset, t.bytes()));
        for (&row, dst) in rows.iter().zip(out.chunks_exact_mut(self.row_elems())) {
            let src = match whole {
                Some(tb) => {
                    // check_rows passed, so the row lies inside `tb`.
                    let s = (row * rb) as usize;
                    tb.get(s..s + rb as usize).ok_or(GatherError::OutsideFile {
                        offset: t.offset + row * rb,
                        len: rb,
                    })?
                }
                None => {
                    let offset = t.row_offset(row)?;
                    let inside = offset
                        .checked_add(rb)
                        .zip(mapping)
                        .is_some_and(|(end, m)| end <= m.len() as u64);
                    match mapping.and_then(|m| m.bytes(offset, rb)) {
                        Some(b) => b,
                        None if inside => return Err(GatherError::Unmapped { offset, len: rb }),
                        None => return Err(GatherError::OutsideFile { offset, len: rb }),
                    }
                }
            };
            self.shared.decoder.decode(src, dst)?;
        }
        Ok(())
    }
}
