//! What the C functions do, in safe Rust over slices and tokens: open and
//! close tables, describe them, gather, prefetch, and map tokens to row ids.
//! [`crate::ffi`] only turns the caller's pointers into the slices these
//! take.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::path::Path;
use std::sync::Mutex;

use pleio::{GatherStats, OpenOptions, OwnedSequence, Prefetch, Rounding, RowId, Strategy, Table};

pub use pleio::Dtype;

use crate::handles::{Kind, Registry};
use crate::status::{Failure, Status};

/// What `pleio_table_info` reports about an open table.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct pleio_info {
    /// Rows in the table.
    pub rows: u64,
    /// Elements one row decodes to (floats per row for PLEIO_DTYPE_F32).
    pub row_elems: u64,
    /// Stored bytes per row (bytes per row for PLEIO_DTYPE_RAW).
    pub row_bytes: u64,
    /// Row ids per token of the model's row-id mapping (16 for the released
    /// qwen4exp, 1 for gemma4), 0 when the file has none (then
    /// `pleio_sequence_new` fails and says why).
    pub rows_per_token: u64,
    /// ggml's number of the stored element type (e.g. 20 for IQ4_NL);
    /// `UINT32_MAX` for a safetensors checkpoint table (see `type_name`).
    pub ggml_type: u32,
    /// ggml's name of the stored element type ("IQ4_NL").
    pub type_name: *const c_char,
    /// The tensor's name ("per_layer_token_embd.weight").
    pub tensor: *const c_char,
    /// The file holding the table (its shard, for a split set).
    pub path: *const c_char,
    /// The strategy gathers use ("auto", "uring", ...).
    pub strategy: *const c_char,
    /// The model's architecture ("qwen4exp", "gemma4"), "" when the row-id
    /// mapping is unavailable.
    pub architecture: *const c_char,
}

/// What one gather (or a prefetched batch) did; see `pleio::GatherStats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct pleio_stats {
    /// Row ids requested (duplicates counted).
    pub rows: u64,
    /// Row bytes copied out of the file (duplicates counted).
    pub bytes: u64,
    /// Rows fetched with positioned reads rather than through the mapping.
    pub cold_rows: u64,
    /// `auto`: rows found in the page cache by `mincore` and decoded from
    /// the mapping.
    pub found_resident: u64,
    /// Read requests issued (system calls or ring entries).
    pub read_requests: u64,
    /// Bytes asked of the file by those reads.
    pub read_bytes: u64,
    /// Page runs handed to the kernel as advice.
    pub runs_advised: u64,
    /// Advice system calls made.
    pub advice_syscalls: u64,
    /// Runs (or calls) whose advice the kernel refused (output unaffected).
    pub advice_failures: u64,
    /// Distinct pages the rows touch, -1 when not measured.
    pub pages: i64,
    /// Major page faults taken during the gather, -1 when not measured.
    pub major_faults: i64,
    /// 1 when the strategy's backend was unavailable and a fallback served
    /// the reads.
    pub fallback: u32,
    /// 1 when `auto` found pages evicted behind its back and re-read them.
    pub rearmed: u32,
    /// The read backend that served the reads ("pread", "uring",
    /// "uring-direct", "pool"), "" if none; NUL-terminated.
    pub backend: [c_char; 16],
}

/// The `GatherStats::fields` names `pleio_stats` has a member for (the
/// others, such as the `cached` counters, are not in the C ABI).
#[cfg(test)]
const STATS_FIELDS: [&str; 13] = [
    "rows",
    "bytes",
    "cold_rows",
    "found_resident",
    "read_requests",
    "read_bytes",
    "runs_advised",
    "advice_syscalls",
    "advice_failures",
    "pages",
    "major_faults",
    "fallback",
    "rearmed",
];

impl From<GatherStats> for pleio_stats {
    fn from(s: GatherStats) -> pleio_stats {
        let mut backend = [0 as c_char; 16];
        let name = s.backend().unwrap_or("").as_bytes();
        for (d, &b) in backend.iter_mut().zip(name.iter().take(15)) {
            *d = b as c_char;
        }
        let mut out = pleio_stats {
            backend,
            ..pleio_stats::default()
        };
        for (name, v) in s.fields() {
            let count = v.unwrap_or(0);
            let signed = v.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX));
            let flag = u32::from(count != 0);
            match name {
                "rows" => out.rows = count,
                "bytes" => out.bytes = count,
                "cold_rows" => out.cold_rows = count,
                "found_resident" => out.found_resident = count,
                "read_requests" => out.read_requests = count,
                "read_bytes" => out.read_bytes = count,
                "runs_advised" => out.runs_advised = count,
                "advice_syscalls" => out.advice_syscalls = count,
                "advice_failures" => out.advice_failures = count,
                "pages" => out.pages = signed,
                "major_faults" => out.major_faults = signed,
                "fallback" => out.fallback = flag,
                "rearmed" => out.rearmed = flag,
                _ => {}
            }
        }
        out
    }
}

/// An open table and what its handle lends out.
pub struct TableState {
    table: Table,
    /// The strings `pleio_table_info` points into.
    names: [CString; 5],
    rows_per_token: u64,
}

/// A prefetched batch until `pleio_wait` or `pleio_prefetch_cancel`.
pub struct PrefetchState {
    pending: Mutex<Option<Prefetch>>,
    row_elems: usize,
    rows: usize,
}

/// One token stream.
pub struct SequenceState {
    seq: Mutex<OwnedSequence>,
}

thread_local! {
    /// Row ids widened for the engine, reused across calls.
    static ROWS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

static TABLES: Registry<TableState> = Registry::new(Kind::Table);
static PREFETCHES: Registry<PrefetchState> = Registry::new(Kind::Prefetch);
static SEQUENCES: Registry<SequenceState> = Registry::new(Kind::Sequence);

fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// Opens `path` (its PLE table, or `tensor`), gathering with `strategy`
/// (default `auto`), and returns the handle's token.
pub fn open(path: &Path, tensor: Option<&str>, strategy: Option<&str>) -> Result<usize, Failure> {
    let strategy = match strategy {
        None => Strategy::default(),
        Some(s) => s.parse::<Strategy>().map_err(Failure::argument)?,
    };
    let table = OpenOptions::new()
        .tensor(tensor)
        .strategy(strategy)
        .open(path)?;
    register(table)
}

/// What `pleio_open_ex` passes: the options of [`OpenOptions`], each
/// `None` for its default.
#[derive(Debug, Default)]
pub struct OpenEx<'a> {
    /// A GGUF tensor instead of the PLE table.
    pub tensor: Option<&'a str>,
    /// The strategy's name.
    pub strategy: Option<&'a str>,
    /// The decoder layer whose PLE table to open.
    pub layer: Option<u64>,
    /// The rounding rule's name (`exact`, `vllm`, `sglang`, `mlx`).
    pub rounding: Option<&'a str>,
    /// The row cache's budget in bytes (`cached`, `shared`).
    pub budget: Option<u64>,
}

/// Opens `path` with [`OpenOptions`] made of `o`; returns the handle token.
pub fn open_ex(path: &Path, o: &OpenEx<'_>) -> Result<usize, Failure> {
    let strategy = match o.strategy {
        None => Strategy::default(),
        Some(s) => s.parse::<Strategy>().map_err(Failure::argument)?,
    };
    let rounding = match o.rounding {
        None => Rounding::default(),
        Some(r) => r.parse::<Rounding>().map_err(Failure::argument)?,
    };
    let mut opts = OpenOptions::new()
        .tensor(o.tensor)
        .layer(o.layer)
        .strategy(strategy)
        .rounding(rounding);
    if let Some(b) = o.budget {
        opts = opts.cache_budget(b);
    }
    let table = opts.open(path)?;
    register(table)
}

/// Registers an open table; returns its handle token.
fn register(table: Table) -> Result<usize, Failure> {
    let (arch, rows_per_token) = match table.sequence() {
        Ok(s) => (s.architecture(), s.rows_per_token() as u64),
        Err(_) => ("", 0),
    };
    let names = [
        cstring(table.type_name()),
        cstring(table.name()),
        cstring(&table.path().to_string_lossy()),
        cstring(&table.strategy().to_string()),
        cstring(arch),
    ];
    TABLES.insert(TableState {
        table,
        names,
        rows_per_token,
    })
}

/// Runs `f` on the table of `token`.
#[inline]
pub fn with_table<R>(
    token: usize,
    f: impl FnOnce(&TableState) -> Result<R, Failure>,
) -> Result<R, Failure> {
    TABLES.with(token, f)
}

/// Ends the handle `token`, once the calls in flight on it are done
/// (calls on other tables go on meanwhile).
pub fn close(token: usize) -> Result<(), Failure> {
    TABLES.remove(token).map(drop)
}

/// [`close`], waiting at most `timeout` for the calls in flight on the
/// handle: `PLEIO_ERR_BUSY` (the handle stays open) when they outlast it.
pub fn close_within(token: usize, timeout: std::time::Duration) -> Result<(), Failure> {
    TABLES.remove_within(token, Some(timeout)).map(drop)
}

/// Handle slots each registry has made (tables, prefetches, sequences):
/// the most handles of each kind open at once, since slots of ended
/// handles are reused. For tests and leak checks; not in the C header.
pub fn handle_slots() -> [usize; 3] {
    [TABLES.slots(), PREFETCHES.slots(), SEQUENCES.slots()]
}

impl TableState {
    /// What `pleio_table_info` reports; its strings live as long as `self`.
    pub fn info(&self) -> pleio_info {
        let t = &self.table;
        let [type_name, tensor, path, strategy, architecture] = &self.names;
        pleio_info {
            rows: t.rows(),
            row_elems: t.row_elems() as u64,
            row_bytes: t.row_bytes(),
            rows_per_token: self.rows_per_token,
            ggml_type: t.ggml_type().unwrap_or(u32::MAX),
            type_name: type_name.as_ptr(),
            tensor: tensor.as_ptr(),
            path: path.as_ptr(),
            strategy: strategy.as_ptr(),
            architecture: architecture.as_ptr(),
        }
    }

    /// Bytes `n` rows take as `dtype`.
    #[inline]
    pub fn out_bytes(&self, dtype: Dtype, n: usize) -> Result<usize, Failure> {
        self.table
            .out_bytes(dtype, n)
            .ok_or_else(|| Failure::argument(format!("{n} rows of {dtype} do not fit in memory")))
    }

    /// Checks that a buffer of `have` bytes holds `n` rows of `dtype` and
    /// returns the bytes they take.
    #[inline]
    pub fn need(&self, dtype: Dtype, n: usize, have: usize) -> Result<usize, Failure> {
        let need = self.out_bytes(dtype, n)?;
        if have < need {
            return Err(Failure::new(
                Status::PLEIO_ERR_OUTPUT_SIZE,
                format!("out_bytes is {have} but {n} rows of {dtype} need {need}"),
            ));
        }
        Ok(need)
    }

    /// Runs `f` on `ids` copied once into this thread's reused buffer,
    /// then checked there (negative or past the end is an error naming the
    /// id) and widened to the engine's row ids. `f` never sees the
    /// caller's memory: a caller thread that rewrites its ids during the
    /// call cannot turn checked ids into unchecked ones (issue 26), it only
    /// changes which rows are gathered.
    #[inline]
    fn with_rows<I: RowId, R>(
        &self,
        ids: &[I],
        f: impl FnOnce(&[u64]) -> Result<R, pleio::Error>,
    ) -> Result<R, Failure> {
        ROWS.with(|cell| {
            let mut rows = cell.take();
            let r = self.table.rows_from(ids, &mut rows).and_then(|()| f(&rows));
            cell.replace(rows);
            Ok(r?)
        })
    }

    /// Gathers f32 rows into `out` (exactly `n * row_elems` floats).
    #[inline]
    pub fn gather_f32<I: RowId>(&self, ids: &[I], out: &mut [f32]) -> Result<GatherStats, Failure> {
        self.with_rows(ids, |rows| self.table.gather(rows, out))
    }

    /// Gathers rows as `dtype` bytes into `out` (exactly the bytes needed).
    #[inline]
    pub fn gather_bytes<I: RowId>(
        &self,
        ids: &[I],
        dtype: Dtype,
        out: &mut [u8],
    ) -> Result<GatherStats, Failure> {
        self.with_rows(ids, |rows| self.table.gather_as(dtype, rows, out))
    }

    /// Starts fetching `ids` (as f32) in the background; returns the
    /// prefetch token. The ids are checked now.
    pub fn prefetch<I: RowId>(&self, ids: &[I]) -> Result<usize, Failure> {
        let pending = self.with_rows(ids, |rows| self.table.prefetch(rows, Dtype::F32))?;
        PREFETCHES.insert(PrefetchState {
            pending: Mutex::new(Some(pending)),
            row_elems: self.table.row_elems(),
            rows: ids.len(),
        })
    }

    /// A new token stream of this table's row-id mapping; returns its token.
    pub fn sequence(&self) -> Result<usize, Failure> {
        SEQUENCES.insert(SequenceState {
            seq: Mutex::new(self.table.sequence()?),
        })
    }
}

/// Ends the prefetch `token` (the batch is dropped; a batch not started is
/// skipped).
pub fn cancel(token: usize) -> Result<(), Failure> {
    PREFETCHES.remove(token).map(drop)
}

impl PrefetchState {
    /// Bytes of f32 output the batch needs.
    pub fn need(&self, have: usize) -> Result<usize, Failure> {
        let need = self
            .rows
            .checked_mul(self.row_elems)
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| Failure::argument("the batch does not fit in memory"))?;
        if have < need {
            return Err(Failure::new(
                Status::PLEIO_ERR_OUTPUT_SIZE,
                format!(
                    "out_bytes is {have} but the prefetched {} rows of f32 need {need}",
                    self.rows
                ),
            ));
        }
        Ok(need)
    }

    /// Waits for the batch and copies its floats into `out` (exactly the
    /// batch). The prefetch is used up whatever the outcome.
    pub fn wait_into(&self, out: &mut [f32]) -> Result<GatherStats, Failure> {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| {
                Failure::new(Status::PLEIO_ERR_HANDLE, "pleio_batch already waited for")
            })?;
        let done = pending.wait_into(out)?;
        Ok(done.stats)
    }
}

/// Ends the prefetch handle `token`, returning its batch.
pub fn take_prefetch(token: usize) -> Result<PrefetchState, Failure> {
    PREFETCHES.remove(token)
}

/// Runs `f` on the sequence of `token`.
pub fn with_sequence<R>(
    token: usize,
    f: impl FnOnce(&SequenceState) -> Result<R, Failure>,
) -> Result<R, Failure> {
    SEQUENCES.with(token, f)
}

/// Frees the sequence `token`.
pub fn free_sequence(token: usize) -> Result<(), Failure> {
    SEQUENCES.remove(token).map(drop)
}

impl SequenceState {
    /// Row ids per token.
    pub fn rows_per_token(&self) -> usize {
        self.seq
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rows_per_token()
    }

    /// Maps `tokens` (each must be non-negative) to row ids in `out`
    /// (exactly `tokens.len() * rows_per_token`), advancing the stream.
    pub fn map(&self, tokens: &[i32], out: &mut [u64]) -> Result<(), Failure> {
        let tokens: Vec<u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                u32::try_from(t)
                    .map_err(|_| Failure::argument(format!("token {t} (at {i}) is negative")))
            })
            .collect::<Result<_, _>>()?;
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        seq.map_into(&tokens, out)?;
        Ok(())
    }

    /// Forgets the stream's history: the next token starts a new sequence.
    pub fn reset(&self) {
        self.seq.lock().unwrap_or_else(|e| e.into_inner()).reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every member of `pleio_stats` is filled from a `GatherStats::fields`
    /// name: a renamed or dropped counter would otherwise read as 0.
    #[test]
    fn stats_members_are_gather_stats_fields() {
        let names: Vec<&str> = GatherStats::default().fields().map(|(n, _)| n).collect();
        for want in STATS_FIELDS {
            assert!(names.contains(&want), "GatherStats::fields has no {want:?}");
        }
        // Unmeasured counters are -1 in C.
        let c = pleio_stats::from(GatherStats::default());
        assert_eq!((c.pages, c.major_faults, c.rows), (-1, -1, 0));
    }
}
