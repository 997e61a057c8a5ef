//! The `extern "C"` functions of `include/pleio.h`.
//!
//! This is the crate's only module with `unsafe` code (`#[allow(unsafe_code)]`
//! here, `#![deny(unsafe_code)]` at the root): turning the caller's pointers
//! into slices and writing the caller's structs. Every such block has a
//! `// SAFETY:` comment, and each goes through one of four helpers
//! ([`slice`], [`slice_mut`], [`c_str`], [`put`]) that first reject NULL
//! (where the argument is required), misalignment and sizes past
//! `isize::MAX`. What remains is the caller's promise that a non-NULL
//! pointer points at as much memory as it says, stated on each function
//! under "Safety".
//!
//! Every function runs inside [`guard`]: a panic is caught and returned as
//! `PLEIO_ERR_INTERNAL`, never unwound into C.
//!
//! Ownership: handles (`pleio_table *`, `pleio_batch *`,
//! `pleio_sequence *`) are opaque tokens owned by the caller from the
//! function that returns them until the one that ends them (`pleio_close`,
//! `pleio_wait` / `pleio_prefetch_cancel`, `pleio_sequence_free`); pleio
//! never dereferences them, so a stale one is an error, not a crash. Every
//! other pointer is borrowed for the duration of the call only, except the
//! strings of `pleio_table_info`, which the table owns until `pleio_close`,
//! and `pleio_last_error()`'s, which its thread owns until its next failing
//! call.
#![allow(unsafe_code)]
#![allow(non_camel_case_types)] // the C names of include/pleio.h

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::mem::{align_of, size_of};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use crate::api::{self, Dtype};
use crate::status::{self, Failure, Status};

pub use crate::api::{pleio_info, pleio_stats};

/// An open table (opaque; see `pleio_open`). Thread-safe: any number of
/// threads may use one handle at once.
pub struct pleio_table {
    _opaque: [u8; 0],
}

/// A batch of rows being fetched in the background (opaque; see
/// `pleio_prefetch`).
pub struct pleio_batch {
    _opaque: [u8; 0],
}

/// One token stream's row-id state (opaque; see `pleio_sequence_new`).
pub struct pleio_sequence {
    _opaque: [u8; 0],
}

/// Output element types of `pleio_gather` (pass as the `dtype` argument).
///
/// The value is received as an integer and checked: anything else is
/// `PLEIO_ERR_ARGUMENT`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum pleio_dtype {
    /// float, exactly ggml's `to_float` (4 bytes per element).
    PLEIO_DTYPE_F32 = 0,
    /// bfloat16 bits (uint16_t), rounded to nearest even from the exact f32.
    PLEIO_DTYPE_BF16 = 1,
    /// IEEE half bits (uint16_t), rounded to nearest even from the exact f32.
    PLEIO_DTYPE_F16 = 2,
    /// The row's stored bytes, undecoded (`row_bytes` per row).
    PLEIO_DTYPE_RAW = 3,
}

/// How a `pleio_dtype` argument arrives: as the integer C passed, checked
/// before use (a C enum may hold any value of its type).
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct DtypeArg(pub u32);

impl DtypeArg {
    #[inline]
    fn get(self) -> Result<Dtype, Failure> {
        Ok(match self.0 {
            0 => Dtype::F32,
            1 => Dtype::Bf16,
            2 => Dtype::F16,
            3 => Dtype::Raw,
            v => {
                return Err(Failure::argument(format!(
                    "dtype {} is not a pleio_dtype (0..=3)",
                    v as i32
                )))
            }
        })
    }
}

/// Runs `f`, turning a panic into `PLEIO_ERR_INTERNAL` and a failure into
/// its code and this thread's last error.
fn guard(f: impl FnOnce() -> Result<(), Failure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => status::finish(r),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            status::fail(Failure::new(
                Status::PLEIO_ERR_INTERNAL,
                format!("internal error (a bug in pleio, please report it): {what}"),
            ))
        }
    }
}

/// `n` elements at `ptr` as a slice; `ptr` may be NULL when `n` is 0.
///
/// # Safety
/// A non-NULL `ptr` must point at `n` initialized `T`s that nothing writes
/// during the call.
#[inline]
unsafe fn slice<'a, T>(ptr: *const T, n: usize, what: &str) -> Result<&'a [T], Failure> {
    if n == 0 {
        return Ok(&[]);
    }
    check_ptr(ptr, n, what)?;
    // SAFETY: `ptr` is non-NULL, aligned for T and `n * size_of::<T>()`
    // fits in isize (check_ptr); the caller promises `n` readable T's that
    // stay unchanged during the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

/// `n` elements at `ptr` as a mutable slice; `ptr` may be NULL when `n` is
/// 0.
///
/// # Safety
/// A non-NULL `ptr` must point at `n` writable `T`s (any bit pattern is a
/// valid T for the types used here) that nothing else reads or writes
/// during the call.
#[inline]
unsafe fn slice_mut<'a, T>(ptr: *mut T, n: usize, what: &str) -> Result<&'a mut [T], Failure> {
    if n == 0 {
        return Ok(&mut []);
    }
    check_ptr(ptr, n, what)?;
    // SAFETY: as in `slice`, plus the caller's promise that the memory is
    // writable and not accessed by anyone else during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, n) })
}

#[inline]
fn check_ptr<T>(ptr: *const T, n: usize, what: &str) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::argument(format!(
            "{what} is NULL (with {n} elements)"
        )));
    }
    if !ptr.is_aligned() {
        return Err(Failure::argument(format!(
            "{what} ({ptr:p}) is not aligned to {} bytes",
            align_of::<T>()
        )));
    }
    match n.checked_mul(size_of::<T>()) {
        Some(b) if b <= isize::MAX as usize => Ok(()),
        _ => Err(Failure::argument(format!(
            "{what}: {n} elements is too many"
        ))),
    }
}

/// The NUL-terminated string at `ptr`, or `None` for NULL.
///
/// # Safety
/// A non-NULL `ptr` must point at a NUL-terminated string that stays
/// unchanged during the call.
unsafe fn c_str<'a>(ptr: *const c_char) -> Option<&'a CStr> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(ptr) })
}

/// Writes `value` to `*ptr`.
///
/// # Safety
/// A non-NULL `ptr` must point at writable memory for a `T`.
unsafe fn put<T>(ptr: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::argument(format!("{what} is NULL")));
    }
    if !ptr.is_aligned() {
        return Err(Failure::argument(format!(
            "{what} ({ptr:p}) is not aligned to {} bytes",
            align_of::<T>()
        )));
    }
    // SAFETY: non-NULL and aligned (checked above); the caller promises
    // writable memory for a T. `write` does not drop the old contents,
    // which may be uninitialized.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Writes `value` to `*ptr` unless `ptr` is NULL.
///
/// # Safety
/// As [`put`].
unsafe fn put_opt<T>(ptr: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if ptr.is_null() {
        return Ok(());
    }
    // SAFETY: forwarded; the caller's promise covers a non-NULL `ptr`.
    unsafe { put(ptr, value, what) }
}

/// Hands the new handle `token` to the caller through `*out`; when that
/// fails (`out` misaligned) the object is ended again with `undo`, so no
/// handle leaks.
///
/// # Safety
/// As [`put`]: a non-NULL `out` must point at writable memory for a pointer.
unsafe fn publish<H>(
    out: *mut *mut H,
    token: usize,
    what: &str,
    undo: fn(usize) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let handle = std::ptr::without_provenance_mut::<H>(token);
    // SAFETY: the caller's promise, forwarded.
    unsafe { put(out, handle, what) }.inspect_err(|_| {
        let _ = undo(token);
    })
}

/// Fails when the byte ranges of two buffers overlap.
#[inline]
fn disjoint(
    a: (*const c_void, usize),
    b: (*const c_void, usize),
    what: &str,
) -> Result<(), Failure> {
    let (a0, b0) = (a.0 as usize, b.0 as usize);
    if a.1 == 0 || b.1 == 0 || a0.saturating_add(a.1) <= b0 || b0.saturating_add(b.1) <= a0 {
        Ok(())
    } else {
        Err(Failure::argument(format!("{what} overlap")))
    }
}

/// Opens a path and tensor name given as C strings.
///
/// # Safety
/// `path` and (if not NULL) `tensor` and `strategy` must be NUL-terminated
/// strings.
unsafe fn open_common(
    path: *const c_char,
    tensor: *const c_char,
    strategy: *const c_char,
    out: *mut *mut pleio_table,
) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::argument("out (pleio_table **) is NULL"));
    }
    // SAFETY: the caller promises NUL-terminated strings where not NULL.
    let (path, tensor, strategy) = unsafe { (c_str(path), c_str(tensor), c_str(strategy)) };
    let path = path.ok_or_else(|| Failure::argument("path is NULL"))?;
    let path = Path::new(OsStr::from_bytes(path.to_bytes()));
    let tensor = tensor
        .map(|t| {
            t.to_str()
                .map_err(|_| Failure::argument("tensor name is not UTF-8"))
        })
        .transpose()?;
    let strategy = strategy
        .map(|s| {
            s.to_str()
                .map_err(|_| Failure::argument("strategy name is not UTF-8"))
        })
        .transpose()?;
    let token = api::open(path, tensor, strategy)?;
    // SAFETY: `out` is non-NULL (checked above); the caller promises it
    // points at a writable `pleio_table *`.
    unsafe { publish(out, token, "out (pleio_table **)", api::close) }
}

/// The options of `pleio_open_ex`. Zero-initialize it, set `size` to
/// `sizeof(struct pleio_open_options)`, then the fields wanted; NULL (or
/// -1 for `layer`) keeps a field's default.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct pleio_open_options {
    /// `sizeof(struct pleio_open_options)` as the caller compiled it:
    /// lets later versions add fields. A size this library does not know
    /// is `PLEIO_ERR_ARGUMENT`.
    pub size: usize,
    /// A 2-D tensor of a GGUF file to open instead of its PLE table; NULL:
    /// the PLE table.
    pub tensor: *const c_char,
    /// The gather strategy (as `pleio_open_with`); NULL: "auto".
    pub strategy: *const c_char,
    /// The decoder layer (0-based) whose PLE table to open, for a
    /// checkpoint with several; -1: the first PLE layer's. Other negative
    /// values are `PLEIO_ERR_ARGUMENT`.
    pub layer: i64,
    /// The rounding rule of the outputs: "exact" (the default, also for
    /// NULL), "vllm" or "sglang" (FP8 tables: the scale rounded to the
    /// output type first), "mlx" (MLX 4-bit: mlx's bf16 arithmetic). An
    /// unknown name is `PLEIO_ERR_ARGUMENT`; a rule that does not apply to
    /// the table's encoding is `PLEIO_ERR_UNSUPPORTED`. See docs/rounding.md.
    pub rounding: *const c_char,
    /// The row cache's budget in bytes, for "cached" (this handle's cache)
    /// and "shared" (the machine-wide segment's size, when this process is
    /// the one that makes it); 0: the default, 256 MiB. A budget too small
    /// for the table's rows is an error naming the smallest that works.
    /// (Added after `rounding`: a `size` that ends at `rounding` is read
    /// as a struct without it.)
    pub budget: u64,
}

/// `pleio_open` with options (see `struct pleio_open_options`); NULL
/// options are the defaults (as `pleio_open(path, NULL, out)`). Returns
/// 0 or a `pleio_status`; on failure `*out` is left unchanged.
///
/// # Safety
/// `path` must be a NUL-terminated string; a non-NULL `opts_or_null` must
/// point at a readable `struct pleio_open_options` of at least its `size`
/// field's bytes whose non-NULL strings are NUL-terminated; `out` must
/// point at writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pleio_open_ex(
    path: *const c_char,
    opts_or_null: *const pleio_open_options,
    out: *mut *mut pleio_table,
) -> c_int {
    // SAFETY: the caller's promise, forwarded.
    guard(|| unsafe { open_ex(path, opts_or_null, out) })
}

/// The body of `pleio_open_ex`.
///
/// # Safety
/// As `pleio_open_ex`.
unsafe fn open_ex(
    path: *const c_char,
    opts: *const pleio_open_options,
    out: *mut *mut pleio_table,
) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::argument("out (pleio_table **) is NULL"));
    }
    // SAFETY: the caller promises a NUL-terminated string where not NULL.
    let path = unsafe { c_str(path) }.ok_or_else(|| Failure::argument("path is NULL"))?;
    let path = Path::new(OsStr::from_bytes(path.to_bytes()));
    let known = size_of::<pleio_open_options>();
    let o = if opts.is_null() {
        None
    } else {
        check_ptr(opts, 1, "opts (struct pleio_open_options *)")?;
        // SAFETY: non-NULL and aligned (checked); the caller promises a
        // readable struct, whose first field is `size`.
        let size = unsafe { std::ptr::addr_of!((*opts).size).read() };
        // The struct before `budget` was added (a caller built against an
        // older pleio.h).
        let before_budget = std::mem::offset_of!(pleio_open_options, budget);
        if size != known && size != before_budget {
            return Err(Failure::argument(format!(
                "pleio_open_options.size is {size}: this library knows {known} \
                 (sizeof(struct pleio_open_options) of its pleio.h) and {before_budget} (before `budget`)"
            )));
        }
        let mut o = pleio_open_options {
            size,
            tensor: std::ptr::null(),
            strategy: std::ptr::null(),
            layer: -1,
            rounding: std::ptr::null(),
            budget: 0,
        };
        // SAFETY: as above; the caller's `size` says that many bytes of the
        // struct are there, and `size <= known`, so the copy stays inside
        // `o`; every field is plain data of which any bytes are a value.
        unsafe {
            std::ptr::copy_nonoverlapping(
                opts.cast::<u8>(),
                std::ptr::addr_of_mut!(o).cast::<u8>(),
                size,
            )
        };
        Some(o)
    };
    let text = |p: *const c_char, what: &str| -> Result<Option<&str>, Failure> {
        // SAFETY: the caller promises NUL-terminated strings where not NULL.
        unsafe { c_str(p) }
            .map(|s| {
                s.to_str()
                    .map_err(|_| Failure::argument(format!("{what} is not UTF-8")))
            })
            .transpose()
    };
    let ex = match &o {
        None => api::OpenEx::default(),
        Some(o) => api::OpenEx {
            tensor: text(o.tensor, "tensor name")?,
            strategy: text(o.strategy, "strategy name")?,
            layer: match o.layer {
                -1 => None,
                l => Some(u64::try_from(l).map_err(|_| {
                    Failure::argument(format!(
                        "layer {l}: a decoder layer is 0 or more (-1: the default)"
                    ))
                })?),
            },
            rounding: text(o.rounding, "rounding rule name")?,
            budget: (o.budget != 0).then_some(o.budget),
        },
    };
    let token = api::open_ex(path, &ex)?;
    // SAFETY: `out` is non-NULL (checked above); the caller promises it
    // points at a writable `pleio_table *`.
    unsafe { publish(out, token, "out (pleio_table **)", api::close) }
}

/// pleio's version ("0.1.0"), a static string.
#[no_mangle]
pub extern "C" fn pleio_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    VERSION.as_ptr()
}

/// The message of the most recent failed call on the calling thread: one
/// line naming the path, tensor, row and offset at fault where known; ""
/// if no call has failed on this thread. Successful calls leave it as it
/// is. The string belongs to the thread and stays valid until its next
/// failing pleio call (or its exit); copy it to keep it.
#[no_mangle]
pub extern "C" fn pleio_last_error() -> *const c_char {
    status::last_error()
}

/// Opens the per-layer-embedding table (`per_layer_token_embd.weight`) of
/// the GGUF file `path` (any shard of a split set), or its 2-D tensor
/// `tensor_or_null` when not NULL, and stores a new handle in `*out`.
/// Gathers use the `auto` strategy. Returns 0 or a `pleio_status`; on
/// failure `*out` is left unchanged.
///
/// The handle belongs to the caller until `pleio_close`; it may be used
/// from any number of threads at once.
///
/// # Safety
/// `path` and a non-NULL `tensor_or_null` must be NUL-terminated strings;
/// `out` must point at writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pleio_open(
    path: *const c_char,
    tensor_or_null: *const c_char,
    out: *mut *mut pleio_table,
) -> c_int {
    // SAFETY: the caller's promise, forwarded.
    guard(|| unsafe { open_common(path, tensor_or_null, std::ptr::null(), out) })
}

/// `pleio_open` with a gather strategy: "auto" (the default, also for
/// NULL), "fault", "advise", "pread", "uring", "uring-direct", "pool",
/// "cached" (a row cache of the library's default budget, 256 MiB; see
/// docs/strategies.md) or "shared" (one such cache per machine, shared by
/// every process serving the table; see docs/cache.md). An unknown name is
/// `PLEIO_ERR_ARGUMENT`.
///
/// # Safety
/// As `pleio_open`; a non-NULL `strategy_or_null` must be a NUL-terminated
/// string.
#[no_mangle]
pub unsafe extern "C" fn pleio_open_with(
    path: *const c_char,
    tensor_or_null: *const c_char,
    strategy_or_null: *const c_char,
    out: *mut *mut pleio_table,
) -> c_int {
    // SAFETY: the caller's promise, forwarded.
    guard(|| unsafe { open_common(path, tensor_or_null, strategy_or_null, out) })
}

/// Closes a table handle. NULL is ignored; a handle already closed (or not
/// a table) is ignored too, with `pleio_last_error` set. Calls on this
/// handle running on other threads finish first (the close waits for them,
/// and only for them: calls on other handles go on; see
/// `pleio_close_timeout` to bound the wait); later calls with the handle
/// fail with `PLEIO_ERR_HANDLE`. Prefetches and
/// sequences made from the table stay valid until they are ended
/// themselves.
#[no_mangle]
pub extern "C" fn pleio_close(t: *mut pleio_table) {
    if t.is_null() {
        return;
    }
    guard(|| api::close(t.addr()));
}

/// `pleio_close`, waiting at most `timeout_ms` milliseconds for the calls
/// running on this handle in other threads (a gather stuck on a dead
/// network file system, say). Returns 0 when the handle is closed,
/// `PLEIO_ERR_BUSY` when calls on it were still running at the timeout
/// (the handle then stays open and usable: close it again later), or
/// `PLEIO_ERR_HANDLE` for NULL or a handle already closed. Calls on other
/// handles never delay a close.
#[no_mangle]
pub extern "C" fn pleio_close_timeout(t: *mut pleio_table, timeout_ms: u32) -> c_int {
    guard(|| {
        api::close_within(
            t.addr(),
            std::time::Duration::from_millis(u64::from(timeout_ms)),
        )
    })
}

/// Describes the table in `*info`. Its strings belong to the table and
/// stay valid until `pleio_close(t)`.
///
/// # Safety
/// `info` must point at writable memory for a `pleio_info`.
#[no_mangle]
pub unsafe extern "C" fn pleio_table_info(t: *mut pleio_table, info: *mut pleio_info) -> c_int {
    guard(|| {
        // The strings live in the table, which the registry keeps until
        // pleio_close.
        let value = api::with_table(t.addr(), |state| Ok(state.info()))?;
        // SAFETY: the caller promises writable memory for the struct.
        unsafe { put(info, value, "info") }
    })
}

/// Stores in `*bytes` the output bytes `n` rows take as `dtype`:
/// `n * row_elems * 4` (F32), `n * row_elems * 2` (BF16, F16) or
/// `n * row_bytes` (RAW).
///
/// # Safety
/// `bytes` must point at writable memory for a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn pleio_out_bytes(
    t: *mut pleio_table,
    dtype: DtypeArg,
    n: usize,
    bytes: *mut usize,
) -> c_int {
    guard(|| {
        let need = api::with_table(t.addr(), |state| state.out_bytes(dtype.get()?, n))?;
        // SAFETY: the caller promises writable memory for a size_t.
        unsafe { put(bytes, need, "bytes") }
    })
}

/// The gather behind `pleio_gather` and `pleio_gather_i32`, on the ids
/// already taken as a slice (once per call).
///
/// # Safety
/// As `pleio_gather` for `out`, `out_bytes` and `stats`.
#[inline]
unsafe fn gather_common<I: pleio::RowId>(
    t: *mut pleio_table,
    ids: &[I],
    dtype: DtypeArg,
    out: *mut c_void,
    out_bytes: usize,
    stats: *mut pleio_stats,
) -> Result<(), Failure> {
    let dtype = dtype.get()?;
    let n = ids.len();
    api::with_table(t.addr(), |state| {
        let need = state.need(dtype, n, out_bytes)?;
        disjoint(
            (ids.as_ptr().cast(), size_of_val(ids)),
            (out.cast_const(), need),
            "ids and out",
        )?;
        if !stats.is_null() {
            disjoint(
                (stats.cast_const().cast(), size_of::<pleio_stats>()),
                (out.cast_const(), need),
                "stats and out",
            )?;
        }
        let done = if dtype == Dtype::F32 && out.cast::<f32>().is_aligned() {
            // SAFETY: the caller promises `out_bytes >= need` writable bytes at
            // `out`, touched by no one else during the call; `need` is a whole
            // number of floats; any bit pattern is a valid f32.
            let floats = unsafe { slice_mut(out.cast::<f32>(), need / 4, "out") }?;
            state.gather_f32(ids, floats)?
        } else {
            // SAFETY: as above, as bytes (no alignment needed).
            let bytes = unsafe { slice_mut(out.cast::<u8>(), need, "out") }?;
            state.gather_bytes(ids, dtype, bytes)?
        };
        if stats.is_null() {
            return Ok(());
        }
        // SAFETY: the caller promises a NULL or writable `stats`.
        unsafe { put(stats, done.into(), "stats") }
    })
}

/// Gathers the rows `ids[0..n]` (in order, duplicates repeated) of the
/// table into `out` as `dtype`, rows back to back, little-endian: exactly
/// `pleio_out_bytes(t, dtype, n)` bytes are written, so `out_bytes` must be
/// at least that (else `PLEIO_ERR_OUTPUT_SIZE`). Every id is checked before
/// anything is read: a negative id or one >= rows is
/// `PLEIO_ERR_ROW_OUT_OF_RANGE`, naming the id and the row count. On any
/// failure nothing is written to `out` or `stats`. `stats_or_null`, when
/// not NULL, receives what the gather did. `n == 0` is a no-op (then `ids`
/// and `out` may be NULL). F32 output into a 4-byte-aligned `out` is
/// decoded in place; other `out` alignments work too.
///
/// Thread-safe: any number of threads may gather from one handle at once.
///
/// # Safety
/// `ids` must point at `n` readable `int64_t`, `out` at `out_bytes`
/// writable bytes not overlapping `ids`, and `stats_or_null` be NULL or
/// point at a writable `pleio_stats`; none may be written by another thread
/// during the call. (The ids are copied once, then checked and used from
/// the copy: a thread rewriting them anyway changes which rows are
/// gathered, or makes the call fail, never reads outside the table.)
#[no_mangle]
pub unsafe extern "C" fn pleio_gather(
    t: *mut pleio_table,
    ids: *const i64,
    n: usize,
    dtype: DtypeArg,
    out: *mut c_void,
    out_bytes: usize,
    stats_or_null: *mut pleio_stats,
) -> c_int {
    guard(|| {
        // SAFETY: the caller promises `n` readable int64_t at `ids`.
        let ids = unsafe { slice(ids, n, "ids") }?;
        // Copied once, then checked and gathered from the copy (as every
        // id type is): ids rewritten by another thread during the call
        // are never read again after their check.
        // SAFETY: the caller's promise, forwarded.
        unsafe { gather_common(t, ids, dtype, out, out_bytes, stats_or_null) }
    })
}

/// `pleio_gather` with `int32_t` row ids (llama.cpp's): negative ids are
/// `PLEIO_ERR_ROW_OUT_OF_RANGE`.
///
/// # Safety
/// As `pleio_gather`, with `n` readable `int32_t` at `ids`.
#[no_mangle]
pub unsafe extern "C" fn pleio_gather_i32(
    t: *mut pleio_table,
    ids: *const i32,
    n: usize,
    dtype: DtypeArg,
    out: *mut c_void,
    out_bytes: usize,
    stats_or_null: *mut pleio_stats,
) -> c_int {
    guard(|| {
        // SAFETY: the caller promises `n` readable int32_t at `ids`.
        let ids = unsafe { slice(ids, n, "ids") }?;
        // SAFETY: the caller's promise, forwarded.
        unsafe { gather_common(t, ids, dtype, out, out_bytes, stats_or_null) }
    })
}

/// Decodes `src_bytes` bytes of stored elements of the ggml type numbered
/// `ggml_type` (whole blocks: 18 bytes for 32 elements of IQ4_NL, ...)
/// into `out` as `dtype`, exactly as a gather decodes a GGUF table's rows
/// (the rows a `PLEIO_DTYPE_RAW` gather returned, for instance). `dtype` is
/// `PLEIO_DTYPE_F32`, `_BF16` or `_F16`. A type pleio does not decode, or
/// `PLEIO_DTYPE_RAW`, is `PLEIO_ERR_UNSUPPORTED`; a `src_bytes` that is not
/// whole blocks, or an `out_bytes` too small for every element, is
/// `PLEIO_ERR_OUTPUT_SIZE` (nothing written). `elems_or_null`, when not
/// NULL, receives the number of elements written. With `src_bytes == 0`
/// nothing is written (`src` and `out` may then be NULL). Needs no table;
/// thread-safe.
///
/// # Safety
/// `src` must point at `src_bytes` readable bytes and `out` at `out_bytes`
/// writable bytes not overlapping them; `elems_or_null` must be NULL or
/// point at a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn pleio_decode(
    ggml_type: u32,
    src: *const c_void,
    src_bytes: usize,
    dtype: DtypeArg,
    out: *mut c_void,
    out_bytes: usize,
    elems_or_null: *mut usize,
) -> c_int {
    guard(|| {
        let dtype = dtype.get()?;
        disjoint(
            (src, src_bytes),
            (out.cast_const(), out_bytes),
            "src and out",
        )?;
        // SAFETY: the caller promises `src_bytes` readable bytes at `src`.
        let src = unsafe { slice(src.cast::<u8>(), src_bytes, "src") }?;
        let elems = if dtype == Dtype::F32 && out.cast::<f32>().is_aligned() {
            // SAFETY: the caller promises `out_bytes` writable bytes at `out`,
            // touched by no one else during the call; any bit pattern is a
            // valid f32, and the floats taken lie within `out_bytes`.
            let floats = unsafe { slice_mut(out.cast::<f32>(), out_bytes / 4, "out") }?;
            pleio::decode_blocks_f32(ggml_type, src, floats)?
        } else {
            // SAFETY: as above, as bytes (no alignment needed).
            let bytes = unsafe { slice_mut(out.cast::<u8>(), out_bytes, "out") }?;
            pleio::decode_blocks(ggml_type, src, dtype, bytes)?
        };
        // SAFETY: the caller promises a NULL or writable `elems_or_null`.
        unsafe { put_opt(elems_or_null, elems, "elems") }
    })
}

/// The prefetch behind `pleio_prefetch` and `pleio_prefetch_i32`.
///
/// # Safety
/// As `pleio_prefetch`, with `ids` of `I`.
unsafe fn prefetch_common<I: pleio::RowId>(
    t: *mut pleio_table,
    ids: *const I,
    n: usize,
    out: *mut *mut pleio_batch,
) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::argument("out (pleio_batch **) is NULL"));
    }
    // SAFETY: the caller promises `n` readable ids.
    let ids = unsafe { slice(ids, n, "ids") }?;
    let token = api::with_table(t.addr(), |state| state.prefetch(ids))?;
    // SAFETY: non-NULL (checked above); the caller promises a writable
    // pointer.
    unsafe { publish(out, token, "out (pleio_batch **)", api::cancel) }
}

/// Starts fetching the rows `ids[0..n]` as f32 in the background (one
/// worker thread per table, batches in the order prefetched) and stores a
/// handle in `*out`; returns at once. Ids are checked now: a bad id fails
/// here with `PLEIO_ERR_ROW_OUT_OF_RANGE`. The ids are copied: the array
/// may be reused on return. The handle belongs to the caller until
/// `pleio_wait` or `pleio_prefetch_cancel`, which must be called exactly
/// once.
///
/// # Safety
/// `ids` must point at `n` readable `int64_t`; `out` at writable memory for
/// one pointer.
#[no_mangle]
pub unsafe extern "C" fn pleio_prefetch(
    t: *mut pleio_table,
    ids: *const i64,
    n: usize,
    out: *mut *mut pleio_batch,
) -> c_int {
    // SAFETY: the caller's promise, forwarded.
    guard(|| unsafe { prefetch_common(t, ids, n, out) })
}

/// `pleio_prefetch` with `int32_t` row ids.
///
/// # Safety
/// As `pleio_prefetch`, with `n` readable `int32_t` at `ids`.
#[no_mangle]
pub unsafe extern "C" fn pleio_prefetch_i32(
    t: *mut pleio_table,
    ids: *const i32,
    n: usize,
    out: *mut *mut pleio_batch,
) -> c_int {
    // SAFETY: the caller's promise, forwarded.
    guard(|| unsafe { prefetch_common(t, ids, n, out) })
}

/// Waits for a prefetched batch and copies its rows, as f32 in the order
/// prefetched, into `out` (at least `n * row_elems * 4` bytes, 4-byte
/// aligned). Ends the handle whatever the outcome: it must not be used
/// again. On failure (`out` too small or misaligned, the read failed)
/// nothing is written to `out` or `stats_or_null`.
///
/// # Safety
/// `out` must point at `out_bytes` writable bytes, `stats_or_null` be NULL
/// or point at a writable `pleio_stats`, neither accessed by another thread
/// during the call.
#[no_mangle]
pub unsafe extern "C" fn pleio_wait(
    p: *mut pleio_batch,
    out: *mut c_void,
    out_bytes: usize,
    stats_or_null: *mut pleio_stats,
) -> c_int {
    guard(|| {
        let state = api::take_prefetch(p.addr())?;
        let need = state.need(out_bytes)?;
        disjoint(
            (stats_or_null.cast_const().cast(), size_of::<pleio_stats>()),
            (out.cast_const(), need),
            "stats and out",
        )?;
        // SAFETY: the caller promises `out_bytes >= need` writable bytes at
        // `out`, touched by no one else; slice_mut checks NULL and 4-byte
        // alignment; any bit pattern is a valid f32.
        let floats = unsafe { slice_mut(out.cast::<f32>(), need / 4, "out") }?;
        let stats = state.wait_into(floats)?;
        // SAFETY: the caller promises a NULL or writable `stats`.
        unsafe { put_opt(stats_or_null, stats.into(), "stats") }
    })
}

/// Drops a prefetched batch without waiting (a batch not yet started is
/// skipped) and ends the handle. NULL is ignored.
#[no_mangle]
pub extern "C" fn pleio_prefetch_cancel(p: *mut pleio_batch) {
    if p.is_null() {
        return;
    }
    guard(|| api::cancel(p.addr()));
}

/// Starts a token stream of the table's row-id mapping (qwen4exp: the
/// n-gram hash with its constants from the file, history carried across
/// calls, reset by EOS; gemma4: the token id is the row id) and stores its
/// handle in `*out`. Fails with `PLEIO_ERR_ROW_IDS` when the file has no
/// usable mapping. The handle belongs to the caller until
/// `pleio_sequence_free`; it is independent of the table handle.
///
/// # Safety
/// `out` must point at writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn pleio_sequence_new(
    t: *mut pleio_table,
    out: *mut *mut pleio_sequence,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(Failure::argument("out (pleio_sequence **) is NULL"));
        }
        let token = api::with_table(t.addr(), |state| state.sequence())?;
        // SAFETY: non-NULL (checked above); the caller promises a writable
        // pointer.
        unsafe { publish(out, token, "out (pleio_sequence **)", api::free_sequence) }
    })
}

/// Maps the next `n` tokens of the stream to row ids: `n * rows_per_token`
/// ids, token-major, into `rows` (capacity `rows_cap` ids), ready for
/// `pleio_gather`. The stream advances only on success; on failure nothing
/// is written. A negative token is `PLEIO_ERR_ARGUMENT`, a gemma4 token
/// outside the table `PLEIO_ERR_ROW_IDS`, a short `rows_cap`
/// `PLEIO_ERR_OUTPUT_SIZE`. `rows_written_or_null`, when not NULL, receives
/// the number of ids written. A sequence may be used from one thread at a
/// time (calls on one handle are serialized).
///
/// # Safety
/// `tokens` must point at `n` readable `int32_t`, `rows` at `rows_cap`
/// writable `int64_t`, and `rows_written_or_null` be NULL or writable; none
/// overlapping (an overlap within the bytes the call would write is
/// refused with `PLEIO_ERR_ARGUMENT` before anything is written).
#[no_mangle]
pub unsafe extern "C" fn pleio_sequence_map(
    s: *mut pleio_sequence,
    tokens: *const i32,
    n: usize,
    rows: *mut i64,
    rows_cap: usize,
    rows_written_or_null: *mut usize,
) -> c_int {
    guard(|| {
        api::with_sequence(s.addr(), |seq| {
            let need = n
                .checked_mul(seq.rows_per_token())
                .ok_or_else(|| Failure::argument(format!("{n} tokens is too many")))?;
            if rows_cap < need {
                return Err(Failure::new(
                    Status::PLEIO_ERR_OUTPUT_SIZE,
                    format!("rows_cap is {rows_cap} but {n} tokens need {need} row ids"),
                ));
            }
            disjoint(
                (tokens.cast(), n.saturating_mul(4)),
                (rows.cast_const().cast(), need.saturating_mul(8)),
                "tokens and rows",
            )?;
            // Refused before anything is written: the count would land
            // inside the ids (or the tokens) it counts.
            let written = (
                rows_written_or_null.cast_const().cast::<c_void>(),
                if rows_written_or_null.is_null() {
                    0
                } else {
                    size_of::<usize>()
                },
            );
            disjoint(
                written,
                (rows.cast_const().cast(), need.saturating_mul(8)),
                "rows_written and rows",
            )?;
            disjoint(
                written,
                (tokens.cast(), n.saturating_mul(4)),
                "rows_written and tokens",
            )?;
            // SAFETY: the caller promises `n` readable tokens.
            let tokens = unsafe { slice(tokens, n, "tokens") }?;
            // SAFETY: the caller promises `rows_cap >= need` writable int64_t
            // at `rows`, not touched by anyone else; u64 has the layout of
            // int64_t and ids are below 2^63.
            let out = unsafe { slice_mut(rows.cast::<u64>(), need, "rows") }?;
            seq.map(tokens, out)?;
            // SAFETY: the caller promises a NULL or writable size_t.
            unsafe { put_opt(rows_written_or_null, need, "rows_written") }
        })
    })
}

/// Forgets the stream's history: the next token starts a new sequence.
#[no_mangle]
pub extern "C" fn pleio_sequence_reset(s: *mut pleio_sequence) -> c_int {
    guard(|| {
        api::with_sequence(s.addr(), |seq| {
            seq.reset();
            Ok(())
        })
    })
}

/// Frees a sequence handle. NULL is ignored; a handle already freed is
/// ignored too, with `pleio_last_error` set.
#[no_mangle]
pub extern "C" fn pleio_sequence_free(s: *mut pleio_sequence) {
    if s.is_null() {
        return;
    }
    guard(|| api::free_sequence(s.addr()));
}
