//! The direct strategies (`pread`, `uring`, `uring-direct`, `pool`): sorted,
//! deduplicated row ids, their extents ([`crate::layout::batch_extents`]),
//! one multi-file read plan with small gaps coalesced ([`crate::coalesce`],
//! gap mode), the reads of every file in one batch of one [`Reader`] into
//! reused staging, then a decode from staging into the output in request
//! order (duplicates decoded again from the same bytes).
//!
//! Readers are created on first use, one per kind over every file the
//! table's rows are in, once per table handle (clones share them), and
//! kept: no thread, ring or file is created per call. Staging and plan
//! storage are per-thread scratch reused across gathers, so a steady stream
//! of batches allocates nothing large.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::known_pages::Residency;
use super::{GatherError, GatherStats, Table};
use crate::coalesce::{Mode, Plan};
use crate::io::{Engine, IoError, Read, Reader, ReaderConfig};
use crate::layout::{BatchExtent, ExtentOrder};
use crate::output::Out;
use crate::tuning::TUNING;

/// Rows whose bytes are at most this far apart are read as one span
/// ([`Tuning::coalesce_gap`](crate::tuning::Tuning::coalesce_gap)).
pub(super) const COALESCE_GAP: usize = TUNING.coalesce_gap;

/// Staging kept between gathers up to this size; larger is freed after use
/// so one huge batch does not pin memory.
const STAGING_KEEP: usize = 64 << 20;

/// Which backend a direct gather asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Pread,
    Pool,
    Uring,
    UringDirect,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Pread => "pread",
            Kind::Pool => "pool",
            Kind::Uring => "uring",
            Kind::UringDirect => "uring-direct",
        }
    }
}

/// A reader ready to read, and whether it stands in for the one asked for.
#[derive(Clone)]
pub(super) struct Picked {
    pub(super) reader: Arc<Reader>,
    pub(super) fallback: bool,
}

type Slot = OnceLock<Result<Picked, String>>;

/// The readers of one table handle (and its clones), one per kind, each
/// created on first use over every file the table's rows are in.
pub(super) struct Backends {
    /// Every file of the table's source, indexed like
    /// [`crate::layout::ShardPart::file`].
    paths: Vec<PathBuf>,
    /// The files holding rows, ascending: a reader's file `k` is
    /// `paths[used[k]]`.
    used: Vec<usize>,
    pread: Slot,
    pool: Slot,
    uring: Slot,
    uring_direct: Slot,
}

impl Backends {
    /// Readers over the files `used` (ascending indices into `paths`, the
    /// ones that hold rows).
    pub(super) fn new(paths: Vec<PathBuf>, used: Vec<usize>) -> Backends {
        Backends {
            paths,
            used,
            pread: OnceLock::new(),
            pool: OnceLock::new(),
            uring: OnceLock::new(),
            uring_direct: OnceLock::new(),
        }
    }

    /// The path of file `file`.
    pub(super) fn path(&self, file: usize) -> Option<&Path> {
        self.paths.get(file).map(PathBuf::as_path)
    }

    /// The readers' index of file `file` (one holding rows).
    pub(super) fn slot(&self, file: usize) -> Option<usize> {
        self.used.binary_search(&file).ok()
    }

    /// The files the readers read, by reader index.
    pub(super) fn used(&self) -> &[usize] {
        &self.used
    }

    /// The reader for `kind`, created on first use. io_uring unavailable
    /// (or `O_DIRECT` refused) falls back to the pool (or buffered
    /// io_uring), flagged in [`Picked::fallback`].
    pub(super) fn get(&self, kind: Kind, strategy: &'static str) -> Result<Picked, GatherError> {
        if self.used.iter().any(|&f| f >= self.paths.len()) {
            return Err(GatherError::NoFile { strategy });
        }
        let slot = match kind {
            Kind::Pread => &self.pread,
            Kind::Pool => &self.pool,
            Kind::Uring => &self.uring,
            Kind::UringDirect => &self.uring_direct,
        };
        slot.get_or_init(|| self.create(kind, strategy))
            .clone()
            .map_err(|reason| GatherError::Setup {
                backend: kind.name(),
                reason,
            })
    }

    fn create(&self, kind: Kind, strategy: &'static str) -> Result<Picked, String> {
        let fall_back = |to: Kind| -> Result<Picked, String> {
            let mut p = self.get(to, strategy).map_err(|e| e.to_string())?;
            p.fallback = true;
            Ok(p)
        };
        let cfg = match kind {
            Kind::Pread => ReaderConfig::new(Engine::Pread),
            Kind::Pool => ReaderConfig::new(Engine::Pool),
            Kind::Uring | Kind::UringDirect => ReaderConfig {
                direct: kind == Kind::UringDirect,
                ..ReaderConfig::new(Engine::Uring)
            },
        };
        let paths: Vec<&Path> = self.used.iter().map(|&f| self.paths[f].as_path()).collect();
        match Reader::open(&paths, cfg) {
            Ok(reader) => Ok(Picked {
                reader: Arc::new(reader),
                fallback: false,
            }),
            Err(IoError::UringUnavailable(_)) => fall_back(Kind::Pool),
            Err(IoError::DirectUnsupported { .. }) => fall_back(Kind::Uring),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// A read of `reader` failed: the error, naming the file it is about (or
/// the first file, for one about none).
pub(super) fn read_error(reader: &Reader, error: IoError) -> GatherError {
    GatherError::Read {
        backend: reader.name(),
        path: error
            .path()
            .or_else(|| reader.path(0))
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        error,
    }
}

/// Per-thread storage of a direct gather, reused across calls.
#[derive(Default)]
pub(super) struct Scratch {
    /// (row id, index in the request), sorted by row.
    pub(super) order: Vec<(u64, usize)>,
    /// Buffers of the sort of `order`.
    pub(super) sort: super::order::SortBuffers,
    /// The request's first occurrences and repeats (`shared`'s first
    /// look, which does not sort).
    pub(super) repeats: super::order::Repeats,
    /// Distinct rows, ascending.
    pub(super) uniq: Vec<u64>,
    /// The row cache's lookups grouped by shard
    /// ([`crate::cache::RowCache::lookup_many`]).
    pub(super) by_shard: Vec<usize>,
    /// Every part of every distinct row (slot `u * parts + part` for
    /// distinct row `u`), sorted by file and offset.
    extents: Vec<BatchExtent>,
    /// Where each part landed in staging, by `u * parts + part`.
    at: Vec<usize>,
    /// The extents coalesced (gap mode), every file's runs.
    plan: Plan,
    /// The runs as the reader takes them.
    batch: Vec<Read>,
    staging: Vec<u8>,
    /// One row of several parts, put together.
    row: Vec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch (a fresh one if it is in use, e.g.
/// by a re-entrant call).
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

impl Table {
    /// A direct gather of every row through the backend `kind`.
    pub(super) fn gather_direct(
        &self,
        kind: Kind,
        rows: &[u64],
        out: &mut Out<'_>,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        with_scratch(|s| {
            self.read_decode(kind, kind.name(), rows, 0..rows.len(), out, None, s, stats)
        })
    }

    /// Reads the rows `rows[i]` for `i` in `picks` (request indices, any
    /// order) through the backend `kind` of each file they are in (one plan
    /// per file: every part of every distinct row, sorted, small gaps
    /// coalesced), decodes each into its output slot, and, with `mark`,
    /// records their pages as resident. Nothing is written before every
    /// read succeeded.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_decode(
        &self,
        kind: Kind,
        strategy: &'static str,
        rows: &[u64],
        picks: impl IntoIterator<Item = usize>,
        out: &mut Out<'_>,
        mark: Option<&Residency>,
        s: &mut Scratch,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        let t = &self.shared.table;
        let rb = t.row_bytes() as usize;
        let parts = t.parts();
        s.order.clear();
        s.order.extend(picks.into_iter().map(|i| (rows[i], i)));
        if s.order.is_empty() {
            return Ok(());
        }
        super::order::sort_pairs(&mut s.order, &mut s.sort);
        s.uniq.clear();
        s.uniq.extend(s.order.iter().map(|&(r, _)| r));
        s.uniq.dedup();
        t.batch_extents(&s.uniq, ExtentOrder::File, &mut s.extents)?;
        s.plan
            .sorted(
                Mode::Gap {
                    max_gap: COALESCE_GAP as u64,
                },
                s.extents
                    .iter()
                    .map(|b| (b.extent.file, b.extent.offset, b.extent.len)),
            )
            .map_err(|e| GatherError::Setup {
                backend: kind.name(),
                reason: format!("planning reads: {e}"),
            })?;
        s.at.clear();
        s.at.resize(s.uniq.len() * parts, 0);
        for (b, &at) in s.extents.iter().zip(s.plan.at()) {
            s.at[b.slot] = at;
        }
        let result = self.read_files(kind, strategy, s, stats);
        let decoded = result.and_then(|()| {
            // Walk the sorted requests and the distinct rows together.
            let Scratch {
                order,
                uniq,
                at,
                staging,
                row: joined,
                ..
            } = s;
            let mut u = 0usize;
            for &(row, i) in order.iter() {
                while uniq[u] != row {
                    u += 1;
                }
                let src = if parts == 1 {
                    &staging[at[u]..at[u] + rb]
                } else {
                    joined.clear();
                    for (k, p) in t.shards()[0].parts.iter().enumerate() {
                        let a = at[u * parts + k];
                        joined.extend_from_slice(&staging[a..a + p.row_bytes as usize]);
                    }
                    &joined[..]
                };
                out.put(i, src, &self.decoder)?;
            }
            Ok(())
        });
        if decoded.is_ok() {
            if let Some(res) = mark {
                for &row in &s.uniq {
                    res.mark(row);
                }
            }
        }
        if s.staging.len() > STAGING_KEEP {
            s.staging = Vec::new();
        }
        decoded
    }

    /// Reads `s.plan` (every file's coalesced runs, by file and offset)
    /// into `s.staging`, all files' reads in one batch of the `kind` reader.
    fn read_files(
        &self,
        kind: Kind,
        strategy: &'static str,
        s: &mut Scratch,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        let picked = self.shared.backends.get(kind, strategy)?;
        let reader = &picked.reader;
        s.batch.clear();
        for run in s.plan.runs() {
            let k = self
                .shared
                .backends
                .slot(run.file)
                .ok_or(GatherError::NoFile { strategy })?;
            let len = usize::try_from(run.len()).map_err(|_| GatherError::Setup {
                backend: reader.name(),
                reason: "planning reads: a read longer than the address space".into(),
            })?;
            s.batch.push(Read::new(k, run.start, len, run.dst));
        }
        let base = s.plan.staging_len();
        if s.staging.len() < base {
            s.staging.resize(base, 0);
        }
        let io = reader
            .read(&s.batch, &mut s.staging[..base])
            .map_err(|error| {
                if s.staging.len() > STAGING_KEEP {
                    s.staging = Vec::new();
                }
                read_error(reader, error)
            })?;
        stats.read_requests += io.requests;
        stats.read_bytes += io.bytes;
        stats.backend = Some(reader.name());
        stats.fallback |= picked.fallback;
        stats.cold_rows += s.order.len() as u64;
        Ok(())
    }
}
