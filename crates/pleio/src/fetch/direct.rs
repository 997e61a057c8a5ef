//! The direct strategies (`pread`, `uring`, `uring-direct`, `pool`): sorted,
//! deduplicated row ids, one read plan with small gaps coalesced, one
//! backend read into reused staging, then a decode from staging into the
//! output in request order (duplicates decoded again from the same bytes).
//!
//! Backends are created on first use, once per reader (clones share them),
//! and kept: no thread, ring or file is created per call. Staging and plan
//! storage are per-thread scratch reused across gathers, so a steady stream
//! of batches allocates nothing large.

use std::cell::RefCell;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::known_pages::Residency;
use super::{GatherError, GatherStats, Table};
use crate::io::{
    IoError, PoolBackend, PoolConfig, PreadBackend, ReadBackend, ReadPlan, RowReads, UringBackend,
    UringConfig,
};
use crate::output::Out;

/// Rows whose bytes are at most this far apart are read as one span (the
/// gap is read and ignored): one request instead of two for rows sharing a
/// page, at the cost of at most this many wasted bytes per merge.
pub(super) const COALESCE_GAP: usize = 1024;

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
    fn name(self) -> &'static str {
        match self {
            Kind::Pread => "pread",
            Kind::Pool => "pool",
            Kind::Uring => "uring",
            Kind::UringDirect => "uring-direct",
        }
    }
}

/// A backend ready to read, and whether it stands in for the one asked for.
#[derive(Clone)]
pub(super) struct Picked {
    pub(super) backend: Arc<dyn ReadBackend>,
    pub(super) fallback: bool,
}

type Slot = OnceLock<Result<Picked, String>>;

/// The read backends of one reader, each created on first use.
pub(super) struct Backends {
    path: Option<PathBuf>,
    file: OnceLock<Result<Arc<File>, String>>,
    pread: Slot,
    pool: Slot,
    uring: Slot,
    uring_direct: Slot,
}

impl Backends {
    pub(super) fn new(path: Option<PathBuf>) -> Backends {
        Backends {
            path,
            file: OnceLock::new(),
            pread: OnceLock::new(),
            pool: OnceLock::new(),
            uring: OnceLock::new(),
            uring_direct: OnceLock::new(),
        }
    }

    pub(super) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn file(&self, path: &Path) -> Result<Arc<File>, String> {
        self.file
            .get_or_init(|| {
                File::open(path)
                    .map(|f| {
                        crate::sys::random_reads(&f);
                        Arc::new(f)
                    })
                    .map_err(|e| format!("cannot open {}: {e}", path.display()))
            })
            .clone()
    }

    /// The backend for `kind`, created on first use. io_uring unavailable
    /// (or `O_DIRECT` refused) falls back to the pool (or buffered io_uring),
    /// flagged in [`Picked::fallback`].
    pub(super) fn get(&self, kind: Kind, strategy: &'static str) -> Result<Picked, GatherError> {
        let path = self
            .path
            .as_deref()
            .ok_or(GatherError::NoFile { strategy })?;
        let slot = match kind {
            Kind::Pread => &self.pread,
            Kind::Pool => &self.pool,
            Kind::Uring => &self.uring,
            Kind::UringDirect => &self.uring_direct,
        };
        slot.get_or_init(|| self.create(kind, path, strategy))
            .clone()
            .map_err(|reason| GatherError::Setup {
                backend: kind.name(),
                reason,
            })
    }

    fn create(&self, kind: Kind, path: &Path, strategy: &'static str) -> Result<Picked, String> {
        let exact = |backend: Arc<dyn ReadBackend>| Picked {
            backend,
            fallback: false,
        };
        let fall_back = |to: Kind| -> Result<Picked, String> {
            let mut p = self.get(to, strategy).map_err(|e| e.to_string())?;
            p.fallback = true;
            Ok(p)
        };
        match kind {
            Kind::Pread => Ok(exact(Arc::new(PreadBackend::new(self.file(path)?)))),
            Kind::Pool => PoolBackend::new(self.file(path)?, PoolConfig::default())
                .map(|b| exact(Arc::new(b)))
                .map_err(|e| e.to_string()),
            Kind::Uring | Kind::UringDirect => {
                let cfg = UringConfig {
                    direct: kind == Kind::UringDirect,
                    ..UringConfig::default()
                };
                match UringBackend::open(path, cfg) {
                    Ok(b) => Ok(exact(Arc::new(b))),
                    Err(IoError::UringUnavailable(_)) => fall_back(Kind::Pool),
                    Err(IoError::DirectUnsupported { .. }) => fall_back(Kind::Uring),
                    Err(e) => Err(e.to_string()),
                }
            }
        }
    }
}

/// Per-thread storage of a direct gather, reused across calls.
#[derive(Default)]
pub(super) struct Scratch {
    /// (row id, index in the request), sorted by row.
    pub(super) order: Vec<(u64, usize)>,
    /// Distinct rows, ascending.
    pub(super) uniq: Vec<u64>,
    pub(super) reads: RowReads,
    staging: Vec<u8>,
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
        let strategy = match kind {
            Kind::Pread => "pread",
            Kind::Pool => "pool",
            Kind::Uring => "uring",
            Kind::UringDirect => "uring-direct",
        };
        let picked = self.shared.backends.get(kind, strategy)?;
        with_scratch(|s| self.read_decode(&picked, rows, 0..rows.len(), out, None, s, stats))
    }

    /// Reads the rows `rows[i]` for `i` in `picks` (request indices, any
    /// order) with one plan through `picked`, decodes each into its output
    /// slot, and, with `mark`, records their pages as resident.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_decode(
        &self,
        picked: &Picked,
        rows: &[u64],
        picks: impl IntoIterator<Item = usize>,
        out: &mut Out<'_>,
        mark: Option<&Residency>,
        s: &mut Scratch,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        let t = &self.shared.table;
        let rb = t.row_bytes() as usize;
        s.order.clear();
        s.order.extend(picks.into_iter().map(|i| (rows[i], i)));
        if s.order.is_empty() {
            return Ok(());
        }
        s.order.sort_unstable();
        s.uniq.clear();
        s.uniq.extend(s.order.iter().map(|&(r, _)| r));
        s.uniq.dedup();
        ReadPlan::for_rows_into(t.offset(), rb, &s.uniq, COALESCE_GAP, &mut s.reads).map_err(
            |e| GatherError::Setup {
                backend: picked.backend.name(),
                reason: format!("planning reads: {e}"),
            },
        )?;
        let need = s.reads.plan.staging_len();
        if s.staging.len() < need {
            s.staging.resize(need, 0);
        }
        let result = picked.backend.read(&s.reads.plan, &mut s.staging[..need]);
        let io = match result {
            Ok(io) => io,
            Err(source) => {
                if s.staging.len() > STAGING_KEEP {
                    s.staging = Vec::new();
                }
                return Err(GatherError::Read {
                    backend: picked.backend.name(),
                    path: self
                        .shared
                        .backends
                        .path()
                        .map(Path::to_path_buf)
                        .unwrap_or_default(),
                    error: source,
                });
            }
        };
        stats.cold_rows += s.order.len() as u64;
        stats.read_requests += io.requests;
        stats.read_bytes += io.bytes;
        stats.backend = Some(picked.backend.name());
        stats.fallback |= picked.fallback;
        // Walk the sorted requests and the distinct rows together.
        let mut u = 0usize;
        let mut decoded = Ok(());
        for &(row, i) in &s.order {
            while s.uniq[u] != row {
                u += 1;
            }
            let at = s.reads.staging_offsets[u];
            if let Err(e) = out.put(i, &s.staging[at..at + rb], &self.shared.decoder) {
                decoded = Err(e.into());
                break;
            }
        }
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
}
