//! The C ABI's handles through its `extern "C"` functions: slots of ended
//! handles are reused (opening and closing, prefetching and waiting forever
//! keep the slot table at the most handles open at once), a stale handle
//! is still refused, a call stuck on one table delays neither calls on
//! another table nor their close (only its own handle's, which
//! `pleio_close_timeout` bounds), and a `rows_written` pointer inside the
//! ids it counts is refused before anything is written.

use std::ffi::CString;
use std::ptr::null_mut;
use std::sync::mpsc;
use std::time::Duration;

use pleio::quant::GgmlType;
use pleio_capi::api;
use pleio_capi::ffi::*;
use pleio_capi::status::Status;
use pleio_lab::synth::SynthSpec;

fn fixture() -> (tempfile::NamedTempFile, CString) {
    let file = tempfile::NamedTempFile::new().unwrap();
    SynthSpec::qwen(GgmlType::IQ4_NL, 2000, 3)
        .write(file.reopen().unwrap(), &mut |_| {})
        .unwrap();
    let path = CString::new(file.path().to_str().unwrap()).unwrap();
    (file, path)
}

fn open(path: &CString) -> *mut pleio_table {
    let mut t = null_mut();
    // SAFETY: a NUL-terminated path and a writable out pointer.
    assert_eq!(
        unsafe { pleio_open(path.as_ptr(), std::ptr::null(), &mut t) },
        0
    );
    t
}

fn gather(t: *mut pleio_table, ids: &[i64], out: &mut [f32]) -> i32 {
    // SAFETY: ids and out are live slices of the lengths passed.
    unsafe {
        pleio_gather(
            t,
            ids.as_ptr(),
            ids.len(),
            DtypeArg(0),
            out.as_mut_ptr().cast(),
            std::mem::size_of_val(out),
            null_mut(),
        )
    }
}

/// Runs `f` on another thread and fails the test if it does not finish in
/// a minute (a regression hangs there, not the test).
fn within_a_minute<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(Duration::from_secs(60))
        .expect("blocked: a call waited for another handle's")
}

/// Every test in this binary shares the process-wide registries, and one
/// counts slots: they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn ended_handles_give_their_slots_back_and_stale_ones_stay_dead() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_file, path) = fixture();
    let t = open(&path);
    let mut info = std::mem::MaybeUninit::<pleio_info>::uninit();
    // SAFETY: a writable pleio_info.
    assert_eq!(unsafe { pleio_table_info(t, info.as_mut_ptr()) }, 0);
    // SAFETY: initialized by the successful call.
    let elems = unsafe { info.assume_init() }.row_elems as usize;
    let ids: Vec<i64> = (0..16).map(|i| i * 101).collect();
    let mut want = vec![0f32; ids.len() * elems];
    assert_eq!(gather(t, &ids, &mut want), 0);
    let base = api::handle_slots();

    let mut stale_tables = Vec::new();
    for round in 0..2000 {
        let u = open(&path);
        if round % 100 == 0 {
            stale_tables.push(u.addr());
        }
        pleio_close(u);
    }
    let mut out = vec![0f32; want.len()];
    let mut stale_batches = Vec::new();
    for round in 0..2000 {
        let mut b = null_mut();
        // SAFETY: ids live, out pointer writable.
        assert_eq!(
            unsafe { pleio_prefetch(t, ids.as_ptr(), ids.len(), &mut b) },
            0
        );
        if round % 100 == 0 {
            stale_batches.push(b);
        }
        // SAFETY: out holds the batch.
        let rc = unsafe { pleio_wait(b, out.as_mut_ptr().cast(), out.len() * 4, null_mut()) };
        assert_eq!(rc, 0);
        assert_eq!(out, want);
    }
    let after = api::handle_slots();
    // One more table and one batch at a time: at most one new slot each.
    assert!(after[0] <= base[0] + 1, "table slots {base:?} -> {after:?}");
    assert!(
        after[1] <= base[1] + 1,
        "prefetch slots {base:?} -> {after:?}"
    );

    // Stale handles of reused slots: refused, never another's object.
    for s in stale_tables {
        let mut o = vec![0f32; want.len()];
        assert_eq!(
            gather(std::ptr::without_provenance_mut(s), &ids, &mut o),
            Status::PLEIO_ERR_HANDLE as i32
        );
    }
    for b in stale_batches {
        // SAFETY: out holds the batch; the handle is refused before use.
        let rc = unsafe { pleio_wait(b, out.as_mut_ptr().cast(), out.len() * 4, null_mut()) };
        assert_eq!(rc, Status::PLEIO_ERR_HANDLE as i32);
    }
    pleio_close(t);
}

#[test]
fn a_stuck_call_delays_only_its_own_handle() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_file, path) = fixture();
    let busy = open(&path).addr();
    let other = open(&path).addr();
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    // A call on `busy` that does not return until released: what a gather
    // stuck in the kernel (a dead FUSE server) looks like to the handles.
    let held = std::thread::spawn(move || {
        api::with_table(busy, |_| {
            started_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            Ok(())
        })
    });
    started.recv().unwrap();

    let ok = within_a_minute(move || {
        let other: *mut pleio_table = std::ptr::without_provenance_mut(other);
        let ids = [1i64, 2, 3];
        let mut out = vec![0f32; 3 * 4096];
        let mut need = 0usize;
        // SAFETY: a writable size_t.
        assert_eq!(
            unsafe { pleio_out_bytes(other, DtypeArg(0), 3, &mut need) },
            0
        );
        let rc = gather(other, &ids, &mut out[..need / 4]);
        // opening and closing other tables
        let path = path;
        let third = open(&path);
        pleio_close(third);
        pleio_close(other);
        rc
    });
    assert_eq!(ok, 0);
    let busy_t: *mut pleio_table = std::ptr::without_provenance_mut(busy);
    assert_eq!(
        pleio_close_timeout(busy_t, 20),
        Status::PLEIO_ERR_BUSY as i32,
        "its own close gives up after the timeout"
    );
    let mut need = 0usize;
    // SAFETY: a writable size_t.
    assert_eq!(
        unsafe { pleio_out_bytes(busy_t, DtypeArg(0), 1, &mut need) },
        0,
        "and the handle stays open"
    );
    release.send(()).unwrap();
    held.join().unwrap().unwrap();
    assert_eq!(pleio_close_timeout(busy_t, 60_000), 0);
    assert_eq!(
        pleio_close_timeout(busy_t, 0),
        Status::PLEIO_ERR_HANDLE as i32
    );
    assert_eq!(
        pleio_close_timeout(null_mut(), 0),
        Status::PLEIO_ERR_HANDLE as i32
    );
}

#[test]
fn rows_written_inside_the_rows_is_refused_before_writing() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_file, path) = fixture();
    let t = open(&path);
    let mut s = null_mut();
    // SAFETY: a writable out pointer.
    assert_eq!(unsafe { pleio_sequence_new(t, &mut s) }, 0);
    let tokens = [5i32, 6];
    let mut rows = vec![-7i64; 64];
    let base = rows.as_mut_ptr();
    // the count's 8 bytes would be the 3rd id
    let inside = base.wrapping_add(2).cast::<usize>();
    // SAFETY: every pointer is into `rows` or `tokens`, live and writable.
    let rc = unsafe { pleio_sequence_map(s, tokens.as_ptr(), 2, base, rows.len(), inside) };
    assert_eq!(rc, Status::PLEIO_ERR_ARGUMENT as i32);
    assert!(rows.iter().all(|&r| r == -7), "nothing written");
    // past the ids it writes: fine
    let past = base.wrapping_add(63).cast::<usize>();
    // SAFETY: as above.
    let rc = unsafe { pleio_sequence_map(s, tokens.as_ptr(), 2, base, 32, past) };
    assert_eq!(rc, 0);
    assert_eq!(rows[63] as usize, 32, "2 tokens of 16 row ids");
    pleio_sequence_free(s);
    pleio_close(t);
}

#[test]
fn ids_rewritten_during_a_gather_are_checked_where_they_are_read() {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::Arc;
    use std::time::Instant;
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_file, path) = fixture();
    const N: usize = 4096;
    // The caller's ids, rewritten by another thread between a valid id
    // and 2^40 while the gathers run (issue 26: the ids were checked in
    // the caller's memory, then read again from it).
    let ids: Arc<Vec<AtomicI64>> =
        Arc::new((0..N as i64).map(|i| AtomicI64::new(i % 2000)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (ids, stop) = (ids.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut bad = false;
            while !stop.load(Ordering::Relaxed) {
                bad = !bad;
                for (i, id) in ids.iter().enumerate() {
                    id.store(
                        if bad { 1 << 40 } else { i as i64 % 2000 },
                        Ordering::Relaxed,
                    );
                }
            }
        })
    };
    let mut outcomes = [0usize; 2];
    for strategy in ["fault", "advise", "auto", "pread"] {
        let strategy_c = CString::new(strategy).unwrap();
        let opts = pleio_open_options {
            size: std::mem::size_of::<pleio_open_options>(),
            tensor: std::ptr::null(),
            strategy: strategy_c.as_ptr(),
            layer: -1,
            rounding: std::ptr::null(),
            budget: 0,
        };
        let mut t = null_mut();
        // SAFETY: a NUL-terminated path, options of their own size, a
        // writable out pointer.
        assert_eq!(unsafe { pleio_open_ex(path.as_ptr(), &opts, &mut t) }, 0);
        let mut row_bytes = 0usize;
        // SAFETY: a writable out pointer.
        assert_eq!(
            unsafe { pleio_out_bytes(t, DtypeArg(0), 1, &mut row_bytes) },
            0
        );
        let mut out = vec![0f32; N * row_bytes / 4];
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(400) {
            // SAFETY: `N` readable int64_t (AtomicI64 has i64's layout;
            // the other thread's stores are what a racing C caller does)
            // and a live output of the size passed.
            let rc = unsafe {
                pleio_gather(
                    t,
                    ids.as_ptr().cast::<i64>(),
                    N,
                    DtypeArg(0),
                    out.as_mut_ptr().cast(),
                    std::mem::size_of_val(&out[..]),
                    null_mut(),
                )
            };
            if rc == 0 {
                outcomes[0] += 1;
            } else {
                assert_eq!(rc, Status::PLEIO_ERR_ROW_OUT_OF_RANGE as i32, "{strategy}");
                outcomes[1] += 1;
            }
        }
        pleio_close(t);
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    // Reaching here is the test (before the fix: SIGSEGV in `fault`);
    // both outcomes occurred, so the ids did change under the gathers.
    assert!(outcomes[1] > 0, "no gather saw a bad id: {outcomes:?}");
}
