//! `pleio.Table`, `pleio.Prefetch`, `pleio.Sequence`: thin wrappers of the
//! engine's `Table`, lookahead and row-id mapping. Every gather, prefetch
//! and wait runs with the GIL released.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use numpy::{PyArray1, PyArrayMethods, PyUntypedArray};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use pleio::{Dtype, OpenOptions, OwnedSequence, Rounding, Strategy};

use crate::convert::{IntSlice, Ints, OutBuf, Target};
use crate::dlpack::DlView;
use crate::errors::{self, IntoPy};

thread_local! {
    /// Row ids widened for the engine, reused across calls.
    static ROWS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Row-id buffers above this many ids are freed after the call rather
/// than kept for the next (8 MiB).
const ROWS_KEEP: usize = 1 << 20;

/// Runs `f` on `ids` as the engine's row ids: copied once into this
/// thread's reused buffer, then checked (a negative id or one past the end
/// is an error naming it) and used from that copy only
/// ([`IntSlice::rows_into`]). The ids are the caller's NumPy array or
/// tensor, which another Python thread may be changing while the GIL is
/// released: reading them twice (a check, then the gather) would let an id
/// change after its check.
fn with_rows<R>(
    table: &pleio::Table,
    ids: IntSlice<'_>,
    f: impl FnOnce(&[u64]) -> pleio::Result<R>,
) -> pleio::Result<R> {
    ROWS.with(|cell| {
        let mut rows = cell.take();
        let r = ids.rows_into(table, &mut rows).and_then(|()| f(&rows));
        if rows.capacity() > ROWS_KEEP {
            rows = Vec::new();
        }
        cell.replace(rows);
        r
    })
}

/// The dtype argument: "float32"/"f32", "bfloat16"/"bf16",
/// "float16"/"f16", "raw", or a NumPy dtype (or type) of those names.
fn parse_dtype(obj: &Bound<'_, PyAny>) -> PyResult<Dtype> {
    let name = match obj.extract::<String>() {
        Ok(s) => s,
        Err(_) => obj
            .py()
            .import("numpy")?
            .getattr("dtype")?
            .call1((obj,))?
            .getattr("name")?
            .extract::<String>()?,
    };
    let name = if name == "uint8" {
        "raw".to_string()
    } else {
        name
    };
    name.parse::<Dtype>().map_err(PyValueError::new_err)
}

/// One table of a GGUF file, opened by :func:`pleio.open`.
///
/// Safe to share between threads: every method may run on many threads at
/// once, and gathers release the GIL.
#[pyclass(module = "pleio", frozen)]
pub struct Table {
    table: pleio::Table,
    /// The rule `table` was opened with.
    rounding: Rounding,
    /// The table with each other rule, made on first use by `gather(...,
    /// rounding=)` (clones share the file and backends).
    by_rule: [OnceLock<pleio::Table>; 3],
}

impl Table {
    /// The table gathering with `rounding` (a rule name; `None`: the one
    /// it was opened with).
    fn with_rule(&self, py: Python<'_>, rounding: Option<&str>) -> PyResult<&pleio::Table> {
        let Some(name) = rounding else {
            return Ok(&self.table);
        };
        let rule: Rounding = name.parse().map_err(PyValueError::new_err)?;
        if rule == self.rounding {
            return Ok(&self.table);
        }
        let slot = Rounding::ALL.iter().position(|r| *r == rule).unwrap_or(0);
        if let Some(t) = self.by_rule[slot].get() {
            return Ok(t);
        }
        let t = self.table.clone().with_rounding(rule).py_err(py)?;
        Ok(self.by_rule[slot].get_or_init(|| t))
    }

    fn elems(&self, dtype: Dtype) -> usize {
        match dtype {
            Dtype::Raw => self.table.row_bytes() as usize,
            _ => self.table.row_elems(),
        }
    }
}

/// Opens the per-layer-embedding table of a GGUF file (any shard of a split
/// set) or a safetensors checkpoint (its directory, index, one
/// ``.safetensors`` file or an mlx-vlm ``ple-store.json``), or the 2-D
/// tensor ``tensor`` of a GGUF file.
///
/// ``strategy`` picks how rows are read: "auto" (default), "fault",
/// "advise", "pread", "uring", "uring-direct", "pool", "cached" (a row
/// cache of ``budget`` bytes, default the library's 256 MiB) or "shared"
/// (one row cache per machine in shared memory, created with ``budget``
/// bytes by the first process that opens the table); ``cache="private"``
/// or ``cache="shared"`` is the same as ``strategy="cached"`` or
/// ``"shared"``; every strategy
/// gives the same bytes. ``layer`` opens the PLE table of decoder layer ``layer``
/// (0-based, ``model.model.layers[layer]``; default: the first PLE layer).
/// ``rounding`` is the rule of 16-bit outputs: "exact" (default), "vllm"
/// (also "sglang": an FP8 scale rounded to the output type first) or
/// "mlx" (``mx.dequantize``'s per-operation bf16 for MLX 4-bit). Raises
/// :class:`pleio.NotFoundError` (a ``FileNotFoundError``) for a missing
/// file and :class:`pleio.InvalidFileError` (a ``ValueError``) for a file,
/// tensor, layer or rule pleio cannot use.
#[pyfunction]
#[pyo3(signature = (path, tensor=None, strategy="auto", layer=None, rounding=None, budget=None, cache=None))]
#[allow(clippy::too_many_arguments)]
pub fn open(
    py: Python<'_>,
    path: PathBuf,
    tensor: Option<String>,
    strategy: &str,
    layer: Option<u64>,
    rounding: Option<&str>,
    budget: Option<u64>,
    cache: Option<&str>,
) -> PyResult<Table> {
    errors::guard(py, || {
        let mut strategy: Strategy = strategy.parse().map_err(PyValueError::new_err)?;
        if let Some(c) = cache {
            let by_cache = match c {
                "private" => Strategy::Cached,
                "shared" => Strategy::Shared,
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "unknown cache {c:?} (known: private, shared)"
                    )))
                }
            };
            if strategy != Strategy::Auto && strategy != by_cache {
                return Err(PyValueError::new_err(format!(
                    "cache={c:?} is strategy {by_cache}, but strategy={strategy} was given"
                )));
            }
            strategy = by_cache;
        }
        let rounding: Rounding = rounding
            .unwrap_or("exact")
            .parse()
            .map_err(PyValueError::new_err)?;
        let mut opts = OpenOptions::new()
            .tensor(tensor.as_deref())
            .layer(layer)
            .strategy(strategy)
            .rounding(rounding);
        if let Some(bytes) = budget {
            opts = opts.cache_budget(bytes);
        }
        let table = py.detach(|| opts.open(&path)).py_err(py)?;
        Ok(Table {
            table,
            rounding,
            by_rule: Default::default(),
        })
    })
}

impl Table {
    /// The gather behind `Table.gather` and `pleio.torch.gather`: with no
    /// `out`, a new NumPy array, or a new torch tensor when `torch_dtype`
    /// is given.
    fn gather_impl<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        dtype: Dtype,
        rounding: Option<&str>,
        torch_dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        errors::guard(py, || {
            let table = self.with_rule(py, rounding)?;
            let (ids, mut shape) = Ints::extract_shaped(ids, "ids")?;
            let ids = ids.slice();
            let n = ids.len();
            let elems = self.elems(dtype);
            let need = n
                .checked_mul(elems)
                .ok_or_else(|| errors::output(py, format!("{n} rows do not fit in memory")))?;
            let fresh;
            let out = match (out, torch_dtype) {
                (None, Some(tdt)) => {
                    shape.push(elems);
                    fresh = crate::dlpack::torch_empty(py, need, &shape, tdt)?;
                    Some(&fresh)
                }
                (o, _) => o,
            };
            let (mut np_buf, mut dl_buf);
            let (result, target) = match out {
                Some(o) if o.cast::<PyUntypedArray>().is_err() => match DlView::of_out(o)? {
                    Some(view) => {
                        dl_buf = view;
                        let bytes = dl_buf.out_bytes(py, dtype, need)?;
                        (o.clone(), Target::of_bytes(dtype, bytes))
                    }
                    None => {
                        np_buf = OutBuf::borrow(o, dtype, need)?;
                        (o.clone(), np_buf.target()?)
                    }
                },
                Some(o) => {
                    np_buf = OutBuf::borrow(o, dtype, need)?;
                    (o.clone(), np_buf.target()?)
                }
                None => {
                    shape.push(elems);
                    let (r, b) = OutBuf::new(py, dtype, &shape)?;
                    np_buf = b;
                    (r, np_buf.target()?)
                }
            };
            py.detach(|| {
                with_rows(table, ids, |rows| match target {
                    Target::F32(o) => table.gather(rows, o),
                    Target::Bytes(o) => table.gather_as(dtype, rows, o),
                })
            })
            .py_err(py)?;
            Ok(result)
        })
    }
}

/// The rows ``ids`` of ``table`` as a torch tensor of shape
/// ``ids.shape + (table.row_elems,)`` (``+ (table.row_bytes,)`` for
/// ``torch.uint8``, the stored bytes), in request order, duplicates
/// repeated. Releases the GIL.
///
/// ids: a CPU torch integer tensor of any shape (or anything
///     :meth:`pleio.Table.gather` takes). The ids are copied once, then
///     checked: a bad id raises :class:`pleio.RowOutOfRangeError` and
///     nothing is written.
/// dtype: torch.float32, torch.bfloat16, torch.float16 or torch.uint8.
/// out: optional C-contiguous CPU tensor of that dtype (pinned memory
///     included) with exactly the result's element count: written in place
///     and returned. A tensor on another device, of another dtype or
///     size, not contiguous, or requiring grad raises
///     :class:`pleio.OutputError` and is left untouched.
/// rounding: the rule of 16-bit outputs for this call ("exact", "vllm",
///     "sglang", "mlx"); default: the one the table was opened with.
#[pyfunction]
#[pyo3(name = "torch_gather", signature = (table, ids, dtype=None, out=None, rounding=None))]
pub fn torch_gather<'py>(
    py: Python<'py>,
    table: &Bound<'py, Table>,
    ids: &Bound<'py, PyAny>,
    dtype: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
    rounding: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let (dt, tdt) = crate::dlpack::torch_dtype(py, dtype)?;
    table
        .get()
        .gather_impl(py, ids, out, dt, rounding, Some(&tdt))
}

#[pymethods]
impl Table {
    /// Rows in the table.
    #[getter]
    fn rows(&self) -> u64 {
        self.table.rows()
    }

    /// Elements one row decodes to (the second dimension of ``gather``'s
    /// result for float32, bfloat16 and float16).
    #[getter]
    fn row_elems(&self) -> usize {
        self.table.row_elems()
    }

    /// Stored bytes per row (the second dimension for dtype="raw").
    #[getter]
    fn row_bytes(&self) -> u64 {
        self.table.row_bytes()
    }

    /// ggml's name of the stored element type, e.g. "IQ4_NL".
    #[getter]
    fn encoding(&self) -> &'static str {
        self.table.type_name()
    }

    /// The file holding the table (its shard, for a split set).
    #[getter]
    fn path(&self) -> PathBuf {
        self.table.path().to_path_buf()
    }

    /// The tensor's name.
    #[getter]
    fn tensor(&self) -> &str {
        self.table.name()
    }

    /// The strategy gathers use.
    #[getter]
    fn strategy(&self) -> String {
        self.table.strategy().to_string()
    }

    /// The rounding rule of 16-bit outputs ("exact", "vllm", "mlx").
    #[getter]
    fn rounding(&self) -> String {
        self.rounding.to_string()
    }

    /// Whether a file shrinking or failing under the mapped strategies is
    /// an error now: "active" (pleio's SIGBUS handler is in place),
    /// "displaced" (a handler installed later, e.g. ``faulthandler``'s,
    /// replaced it: mapped gathers read with ``pread`` instead) or
    /// "unprotected" (no guard on this platform).
    #[getter]
    fn sigbus_guard(&self) -> &'static str {
        match self.table.sigbus_guard() {
            pleio::SigbusGuard::Active => "active",
            pleio::SigbusGuard::Displaced => "displaced",
            _ => "unprotected",
        }
    }

    /// The decoder layer (0-based, ``model.model.layers[layer]``) whose
    /// PLE table this is, or None (a tensor named by ``tensor=``, Gemma 4).
    #[getter]
    fn layer(&self) -> Option<u64> {
        self.table.layer()
    }

    /// Every decoder layer of the model that holds a PLE table (0-based,
    /// sorted); ``layer=`` picks one, the first is the default.
    #[getter]
    fn ple_layers(&self) -> Vec<u64> {
        self.table.ple_layers()
    }

    fn __repr__(&self) -> String {
        let t = &self.table;
        let layers = t.ple_layers();
        let layer = match (t.layer(), layers.len()) {
            (Some(l), n) if n > 1 => format!(" layer={l} (of PLE layers {layers:?})"),
            (Some(l), _) => format!(" layer={l}"),
            (None, _) => String::new(),
        };
        let rounding = match self.rounding {
            Rounding::Exact => String::new(),
            r => format!(" rounding={r}"),
        };
        format!(
            "<pleio.Table {} {} rows={} row_elems={} row_bytes={}{layer} strategy={}{rounding} path={:?}>",
            t.name(),
            t.type_name(),
            t.rows(),
            t.row_elems(),
            t.row_bytes(),
            t.strategy(),
            t.path().display().to_string()
        )
    }

    /// Gathers the rows ``ids`` (in order, duplicates repeated) and returns
    /// them as an array of shape ``ids.shape + (row_elems,)``
    /// (``+ (row_bytes,)`` for "raw"); a list or tuple is 1-D.
    ///
    /// ids: integers of any shape (rows in C order): list, tuple, NumPy
    ///     array of any integer dtype (int64, uint64, int32 and uint32 are
    ///     read in place), anything with the buffer protocol, or a CPU
    ///     tensor with ``__dlpack__`` (torch tensors are read through
    ///     DLPack in Rust, their ids copied once before they are checked).
    /// dtype: "float32" (exactly ggml's to_float), "bfloat16" and "float16"
    ///     (rounded to nearest even from that float32; bfloat16 arrays are
    ///     ``ml_dtypes.bfloat16`` when ml_dtypes is importable, else
    ///     ``uint16`` bit patterns), or "raw" (``uint8``, the stored bytes).
    /// out: optional writable C-contiguous buffer of exactly the result's
    ///     element count and dtype (float32; bfloat16 or uint16; float16 or
    ///     uint16; uint8): a NumPy array, memoryview, bytearray, or a CPU
    ///     tensor with ``__dlpack__`` (e.g. pinned host memory; torch's
    ///     bfloat16 included). Rows are written into it in place, and it is
    ///     returned.
    /// rounding: the rule of 16-bit outputs for this call: "exact"
    ///     (default: the value rounded once), "vllm"/"sglang" or "mlx" (the
    ///     engine's own arithmetic); default the one :func:`pleio.open` was
    ///     given. A rule that does not apply to the table's encoding raises
    ///     :class:`pleio.InvalidFileError`.
    ///
    /// Every id and ``out`` are checked before anything is read; on any
    /// error nothing is written to ``out``. Raises
    /// :class:`pleio.RowOutOfRangeError` (``IndexError`` and ``ValueError``)
    /// naming a bad id and the row count, :class:`pleio.OutputError`
    /// (``ValueError``) for a bad ``out``, :class:`pleio.ReadError`
    /// (``OSError``) when reading fails. Releases the GIL.
    #[pyo3(signature = (ids, out=None, dtype=None, rounding=None))]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        rounding: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dtype = dtype.map(parse_dtype).transpose()?.unwrap_or(Dtype::F32);
        self.gather_impl(py, ids, out, dtype, rounding, None)
    }

    /// Starts fetching the rows ``ids`` as float32 in the background (one
    /// worker thread per table, batches in the order prefetched) and
    /// returns a :class:`pleio.Prefetch` at once; its ``wait()`` returns
    /// the rows. The ids are checked now (a bad id raises here) and copied.
    /// Overlap the next batch's reads with this batch's compute.
    fn prefetch(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<Prefetch> {
        errors::guard(py, || {
            let (ids, _) = Ints::extract_shaped(ids, "ids")?;
            let ids = ids.slice();
            let n = ids.len();
            let pending = py
                .detach(|| {
                    // Checked here (the engine checks them again: a bad id is
                    // an error now, not at the wait).
                    let mut rows = Vec::new();
                    ids.rows_into(&self.table, &mut rows)?;
                    self.table.prefetch(&rows, Dtype::F32)
                })
                .py_err(py)?;
            Ok(Prefetch {
                pending: Mutex::new(Some(pending)),
                rows: n,
                row_elems: self.table.row_elems(),
            })
        })
    }

    /// A new token stream of this file's row-id mapping (qwen4exp: the
    /// n-gram hash with the file's constants, history carried across
    /// calls, reset by EOS; gemma4: the token is the row). Raises
    /// :class:`pleio.InvalidFileError` when the file has none.
    fn sequence(&self, py: Python<'_>) -> PyResult<Sequence> {
        errors::guard(py, || {
            let seq = self.table.sequence().py_err(py)?;
            Ok(Sequence {
                seq: Mutex::new(seq),
            })
        })
    }

    /// Totals of every gather of this table since it was opened (all
    /// threads and the prefetch worker): ``gathers``, ``rows``, ``bytes``,
    /// ``cold_rows``, ``found_resident``, ``read_requests``, ``read_bytes``,
    /// ``runs_advised``, ``advice_syscalls``, ``advice_failures``,
    /// ``fallbacks``, ``rearms``, ``guard_displaced``, ``guard_reinstalled``,
    /// ``guard_fallbacks``, ``tier_fallbacks``.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        errors::guard(py, || {
            let s = self.table.stats();
            let d = PyDict::new(py);
            for (k, v) in s.fields() {
                d.set_item(k, v)?;
            }
            Ok(d)
        })
    }

    /// Forgets which pages the "auto" strategy believes are in the page
    /// cache (after evicting the file yourself, e.g. in a benchmark).
    fn forget_residency(&self, py: Python<'_>) -> PyResult<()> {
        errors::guard(py, || {
            self.table.forget_residency();
            Ok(())
        })
    }
}

/// A batch being fetched in the background (see :meth:`Table.prefetch`).
#[pyclass(module = "pleio", frozen)]
pub struct Prefetch {
    pending: Mutex<Option<pleio::Prefetch>>,
    rows: usize,
    row_elems: usize,
}

#[pymethods]
impl Prefetch {
    /// Waits for the batch (releasing the GIL) and returns its rows as a
    /// float32 array of shape ``(len(ids), row_elems)``, or copies them into
    /// ``out`` (a writable C-contiguous float32 buffer of exactly that
    /// size) and returns ``out``. A prefetch is waited for once; a bad
    /// ``out`` raises :class:`pleio.OutputError` before the batch is taken,
    /// so it can still be waited for.
    #[pyo3(signature = (out=None))]
    fn wait<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        errors::guard(py, || {
            // `out` is checked before the batch is taken: a bad one leaves the
            // prefetch waitable.
            let need = self.rows.saturating_mul(self.row_elems);
            let mut buf = out
                .map(|o| OutBuf::borrow(o, Dtype::F32, need))
                .transpose()?;
            let pending = self
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .ok_or_else(|| PyValueError::new_err("this prefetch was already waited for"))?;
            match (out, &mut buf) {
                (Some(o), Some(buf)) => {
                    let Target::F32(dst) = buf.target()? else {
                        unreachable!("a float32 out is borrowed as floats")
                    };
                    py.detach(|| pending.wait_into(dst)).py_err(py)?;
                    Ok(o.clone())
                }
                _ => {
                    let done = py.detach(|| pending.wait()).py_err(py)?;
                    let arr = PyArray1::from_vec(py, done.data);
                    Ok(arr.reshape([self.rows, self.row_elems])?.into_any())
                }
            }
        })
    }

    /// True once the batch is fetched (never blocks).
    fn ready(&self, py: Python<'_>) -> PyResult<bool> {
        errors::guard(py, || {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            Ok(p.as_mut().is_some_and(|p| p.is_ready()))
        })
    }
}

/// One token stream's row ids (see :meth:`Table.sequence`). Calls on one
/// sequence are serialized; use one sequence per stream.
#[pyclass(module = "pleio", frozen)]
pub struct Sequence {
    seq: Mutex<OwnedSequence>,
}

#[pymethods]
impl Sequence {
    /// Row ids per token (16 for the released qwen4exp, 1 for gemma4).
    #[getter]
    fn rows_per_token(&self) -> usize {
        self.seq
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rows_per_token()
    }

    /// Maps the next ``tokens`` of the stream to row ids: an int64 array of
    /// shape ``(len(tokens), rows_per_token)``, equal to ``pleio rows``.
    /// ``.ravel()`` it for :meth:`Table.gather`. The stream advances only
    /// on success.
    fn map<'py>(&self, py: Python<'py>, tokens: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        errors::guard(py, || {
            let tokens = Ints::extract(tokens, "tokens")?.slice().tokens()?;
            let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
            let per = seq.rows_per_token();
            let n = tokens.len().checked_mul(per).ok_or_else(|| {
                PyValueError::new_err(format!("{} tokens: too many row ids", tokens.len()))
            })?;
            let mut rows = vec![0u64; n];
            seq.map_into(&tokens, &mut rows).py_err(py)?;
            drop(seq);
            let ids: Vec<i64> = rows.into_iter().map(|r| r as i64).collect();
            Ok(PyArray1::from_vec(py, ids)
                .reshape([tokens.len(), per])?
                .into_any())
        })
    }

    /// Forgets the history: the next token starts a new sequence.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        errors::guard(py, || {
            self.seq.lock().unwrap_or_else(|e| e.into_inner()).reset();
            Ok(())
        })
    }
}

/// The row ids of ``tokens`` as one fresh sequence of ``table``'s model:
/// ``table.sequence().map(tokens)``.
#[pyfunction]
pub fn row_ids<'py>(
    py: Python<'py>,
    table: &Bound<'py, Table>,
    tokens: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    table.get().sequence(py)?.map(py, tokens)
}

/// Test hook: panics with ``message`` inside the boundary guard every entry
/// point runs in, to check that a panic reaches Python as
/// :class:`pleio.Error` (kind ``"internal"``), never as a
/// ``BaseException``.
#[pyfunction]
pub fn _panic_for_test(py: Python<'_>, message: &str) -> PyResult<()> {
    errors::guard(py, || panic!("{message}"))
}
