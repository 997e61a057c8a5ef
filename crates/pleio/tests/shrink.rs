//! A table file that shrinks under a running process (truncated, or
//! rewritten in place as `cp` does: truncated to zero, then written again):
//! every strategy returns an error naming the file and the offset, never
//! dies by `SIGBUS`, and leaves the output untouched; once the file is
//! whole again the same reader serves it again.

mod fetch_fixture;

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fetch_fixture::{bits, CkptFixture, Fixture, Rng};
use pleio::fetch::GatherError;
use pleio::fetch::SigbusGuard;
use pleio::{sys, Error, ErrorKind, Strategy, Table};
use pleio_lab::synth_ckpt::CkptEncoding;
use pleio_testkit::{skip, skip_case};

/// Output filler: a gather that fails must leave every float like this.
const UNTOUCHED: f32 = -7.25;

/// The file's bytes, to put back after a shrink.
fn contents(fx: &Fixture) -> Vec<u8> {
    std::fs::read(fx.file.path()).unwrap()
}

/// Shrinks the file to `len` bytes in place (`ftruncate`).
fn shrink(fx: &Fixture, len: u64) {
    fx.file.as_file().set_len(len).unwrap();
}

/// Puts the file back as it was, the way `cp` over it would: truncated to
/// zero, then written again.
fn restore(fx: &Fixture, bytes: &[u8]) {
    let f = fx.file.as_file();
    f.set_len(0).unwrap();
    f.write_all_at(bytes, 0).unwrap();
}

/// True if `s` cannot be served with the file shrunk on this target: the
/// mapped paths need the SIGBUS guard.
fn unguarded(s: Strategy) -> bool {
    !sys::SIGBUS_PROTECTED && (s.is_mapped() || s == Strategy::Auto)
}

/// Checks that `e` is a read failure naming the file and an offset; with
/// `settled` (the file did not change since), that a mapped fault says the
/// file shrank.
fn check_error(fx: &Fixture, s: Strategy, e: &Error, settled: bool) {
    assert_eq!(e.kind(), ErrorKind::Io, "{s}: {e:?}");
    let inner = e.inner().downcast_ref::<GatherError>();
    assert!(
        matches!(
            inner,
            Some(GatherError::MappedRead { .. } | GatherError::Read { .. })
        ),
        "{s}: {e:?}"
    );
    let text = e.to_string();
    let path = fx.file.path().display().to_string();
    assert!(text.contains(&path), "{s}: {text}");
    assert!(text.contains("offset"), "{s}: {text}");
    assert_eq!(e.path(), Some(fx.file.path()), "{s}: {e:?}");
    let offset = e
        .offset()
        .unwrap_or_else(|| panic!("{s}: no offset: {e:?}"));
    if let Some(GatherError::MappedRead { row, file_len, .. }) = inner {
        assert_eq!(e.row(), Some(*row), "{s}: {e:?}");
        if settled {
            // The byte that faulted lies past the file's new end.
            assert!(file_len.is_some_and(|len| len <= offset), "{s}: {e:?}");
            assert!(text.contains("shrank"), "{s}: {text}");
        }
    }
}

#[test]
fn every_strategy_reports_a_shrunk_file_as_an_error() {
    let fx = Fixture::qwen(3000, 4);
    let t = fx.table.clone();
    let n = t.rows();
    let whole = contents(&fx);
    // Cut inside row 1500: rows past it are gone, rows on pages before the
    // cut's page are intact.
    let cut = t.offset() + 1500 * t.row_bytes() + 7;
    let page = sys::page_size();
    let safe_rows: Vec<u64> = (0..n)
        .filter(|r| (t.offset() + (r + 1) * t.row_bytes()) <= cut / page * page)
        .step_by(97)
        .collect();
    assert!(safe_rows.len() > 3);
    let want_safe = bits(&fx.reference(&safe_rows));
    let rows = [0u64, n - 1, 10, 1500, 2000];
    let want = bits(&fx.reference(&rows));
    for &s in Strategy::ALL {
        if unguarded(s) {
            skip_case!("{s}: no SIGBUS guard on this target");
            continue;
        }
        // A fresh reader (nothing known resident) and one that has read
        // every row before (auto maps them all).
        for warm in [false, true] {
            let reader: Table = fx.reader();
            let mut out = vec![0f32; rows.len() * reader.row_elems()];
            if warm {
                reader.gather_with(s, &rows, &mut out).unwrap();
                assert_eq!(bits(&out), want, "{s}");
            }
            shrink(&fx, cut);
            out.fill(UNTOUCHED);
            let e = reader.gather_with(s, &rows, &mut out).unwrap_err();
            check_error(&fx, s, &e, true);
            assert!(
                out.iter().all(|&x| x == UNTOUCHED),
                "{s} warm={warm}: output written on error"
            );
            // Rows before the cut are still served.
            let mut part = vec![0f32; safe_rows.len() * reader.row_elems()];
            reader.gather_with(s, &safe_rows, &mut part).unwrap();
            assert_eq!(
                bits(&part),
                want_safe,
                "{s} warm={warm}: rows before the cut"
            );
            // The file is put back: the same reader reads it again.
            restore(&fx, &whole);
            reader.gather_with(s, &rows, &mut out).unwrap();
            assert_eq!(bits(&out), want, "{s} warm={warm}: after the restore");
        }
    }
}

/// A checkpoint's rows are copied out of several files' mappings, all
/// parts of a batch in one guarded copy (one a part number for MLX 4-bit's
/// three parts): one file cut in half under warm readers is an error naming
/// that file and a row of the batch, the output untouched; rows of the
/// other files are still served, and all of them once the file is back.
#[test]
fn a_shrunk_checkpoint_file_is_an_error_naming_it() {
    for enc in [CkptEncoding::Fp8, CkptEncoding::Mlx4] {
        let fx = CkptFixture::new(enc, 4000, 8, 3, 11);
        let mut files: Vec<_> = std::fs::read_dir(&fx.path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        let victim = files.last().unwrap().clone();
        let whole = std::fs::read(&victim).unwrap();
        let rows: Vec<u64> = (0..fx.rows).step_by(13).collect();
        let want = bits(&fx.reference(&rows));
        for s in [Strategy::Fault, Strategy::Auto] {
            if unguarded(s) {
                skip_case!("{s}: no SIGBUS guard on this target");
                continue;
            }
            let reader = fx.reader();
            let e160 = reader.row_elems();
            let mut out = vec![0f32; rows.len() * e160];
            reader.gather_with(s, &rows, &mut out).unwrap();
            assert_eq!(bits(&out), want, "{enc:?} {s}: warm-up");
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&victim)
                .unwrap();
            // At a page boundary: the rest of a page cut in its middle
            // reads as zeros through a mapping, not as a fault
            // (docs/reliability.md).
            let page = sys::page_size();
            f.set_len(whole.len() as u64 / 2 / page * page).unwrap();
            out.fill(UNTOUCHED);
            let e = reader.gather_with(s, &rows, &mut out).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Io, "{enc:?} {s}: {e:?}");
            assert_eq!(e.path(), Some(victim.as_path()), "{enc:?} {s}: {e:?}");
            assert!(e.offset().is_some(), "{enc:?} {s}: {e:?}");
            if let Some(row) = e.row() {
                assert!(rows.contains(&row), "{enc:?} {s}: {e:?}");
            }
            assert!(
                out.iter().all(|&x| x == UNTOUCHED),
                "{enc:?} {s}: output written on error"
            );
            // Row by row: the other files' rows are served and right, the
            // cut file's later rows fail.
            let (mut served, mut failed) = (0, 0);
            for (i, &r) in rows.iter().enumerate() {
                let mut one = vec![0f32; e160];
                match reader.gather_with(s, &[r], &mut one) {
                    Ok(_) => {
                        served += 1;
                        assert_eq!(
                            bits(&one),
                            &want[i * e160..(i + 1) * e160],
                            "{enc:?} {s}: row {r}"
                        );
                    }
                    Err(e) => {
                        failed += 1;
                        assert_eq!(e.path(), Some(victim.as_path()), "{enc:?} {s}: {e:?}");
                    }
                }
            }
            assert!(served > 0 && failed > 0, "{enc:?} {s}: {served} {failed}");
            f.set_len(0).unwrap();
            f.write_all_at(&whole, 0).unwrap();
            reader.gather_with(s, &rows, &mut out).unwrap();
            assert_eq!(bits(&out), want, "{enc:?} {s}: after the restore");
        }
    }
}

#[test]
fn shrinking_during_gathers_never_kills_and_never_tears_the_output() {
    let fx = Fixture::qwen(60_000, 6);
    let t = fx.table.clone();
    let n = t.rows();
    let whole = contents(&fx);
    let strategies: Vec<Strategy> = Strategy::ALL
        .iter()
        .copied()
        .filter(|&s| !unguarded(s))
        .collect();
    // Per worker: batches of random rows that always include the last row
    // (past every cut below), so a gather on a shrunk file must fail.
    let lists: Vec<(Vec<u64>, Vec<u32>)> = (0..8u64)
        .map(|k| {
            let mut rng = Rng::new(40 + k);
            let mut rows: Vec<u64> = (0..400).map(|_| rng.below(n)).collect();
            rows.push(n - 1);
            let want = bits(&fx.reference(&rows));
            (rows, want)
        })
        .collect();
    // Phase, bumped by the main thread: odd = shrunk, even = whole.
    let phase = AtomicU64::new(0);
    let stop = AtomicU64::new(0);
    // Per worker: the last phase in which it saw the outcome the phase
    // forces (an error when shrunk, success when whole).
    let seen: Vec<AtomicU64> = strategies
        .iter()
        .map(|_| AtomicU64::new(u64::MAX))
        .collect();
    let gathers = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for (w, &s) in strategies.iter().enumerate() {
            let (rows, want) = &lists[w % lists.len()];
            let (phase, stop, seen, gathers, fx) = (&phase, &stop, &seen, &gathers, &fx);
            sc.spawn(move || {
                let reader = fx.reader();
                let mut out = vec![0f32; rows.len() * reader.row_elems()];
                while stop.load(Ordering::Acquire) == 0 {
                    let before = phase.load(Ordering::Acquire);
                    out.fill(UNTOUCHED);
                    let r = reader.gather_with(s, rows, &mut out);
                    let after = phase.load(Ordering::Acquire);
                    gathers.fetch_add(1, Ordering::Relaxed);
                    match r {
                        // Whatever the file did meanwhile, a success has
                        // every row right.
                        Ok(_) => {
                            assert_eq!(&bits(&out), want, "{s}: torn output");
                            if before == after && before % 2 == 0 {
                                seen[w].store(before, Ordering::Release);
                            }
                        }
                        Err(e) => {
                            check_error(fx, s, &e, false);
                            assert!(
                                out.iter().all(|&x| x == UNTOUCHED),
                                "{s}: output written on error"
                            );
                            if before == after && before % 2 == 1 {
                                seen[w].store(before, Ordering::Release);
                            }
                        }
                    }
                }
            });
        }
        let mut rng = Rng::new(99);
        let wait_all = |p: u64| {
            let t0 = Instant::now();
            while seen.iter().any(|a| a.load(Ordering::Acquire) != p) {
                if t0.elapsed() > Duration::from_secs(60) {
                    // Stop the workers, or the scope would wait for them
                    // forever instead of failing.
                    stop.store(1, Ordering::Release);
                    let late: Vec<String> = strategies
                        .iter()
                        .zip(&seen)
                        .filter(|(_, a)| a.load(Ordering::Acquire) != p)
                        .map(|(s, _)| s.to_string())
                        .collect();
                    panic!("phase {p}: {late:?} never saw the outcome it forces");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        for round in 0..6u64 {
            // Shrink to somewhere in the table (the header stays).
            let cut = t.offset() + rng.below(t.bytes() - t.row_bytes());
            shrink(&fx, cut);
            phase.store(2 * round + 1, Ordering::Release);
            wait_all(2 * round + 1);
            restore(&fx, &whole);
            phase.store(2 * round + 2, Ordering::Release);
            wait_all(2 * round + 2);
        }
        stop.store(1, Ordering::Release);
    });
    assert!(gathers.load(Ordering::Relaxed) >= 12 * strategies.len());
}

/// Set in the child process of [`a_sigbus_outside_pleio_still_kills`].
const CHILD: &str = "PLEIO_TEST_SIGBUS_CHILD";

/// The guard catches only its own copy: a `SIGBUS` anywhere else (here a
/// read through an unguarded slice of the mapping) still kills the process,
/// as it did before pleio installed its handler.
#[test]
fn a_sigbus_outside_pleio_still_kills() {
    if !sys::SIGBUS_PROTECTED {
        skip!("no SIGBUS guard on this target");
    }
    if std::env::var_os(CHILD).is_some() {
        // No core file from the expected crash.
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: setrlimit only reads the struct.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
        let fx = Fixture::qwen(3000, 4);
        let reader = fx.reader();
        let t = &fx.table;
        let n = t.rows();
        shrink(&fx, t.offset());
        // The guard is installed and catches its own fault...
        let mut out = vec![0f32; reader.row_elems()];
        let e = reader
            .gather_with(Strategy::Fault, &[n - 1], &mut out)
            .unwrap_err();
        assert!(
            matches!(
                e.inner().downcast_ref::<GatherError>(),
                Some(GatherError::MappedRead { .. })
            ),
            "{e:?}"
        );
        // ...but not this read.
        let bytes = reader
            .mapping()
            .unwrap()
            .bytes(t.offset() + (n - 1) * t.row_bytes(), t.row_bytes())
            .unwrap();
        let sum: u64 = bytes.iter().map(|&b| u64::from(b)).sum();
        println!("survived a read past the end: {sum}");
        std::process::exit(0);
    }
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_sigbus_outside_pleio_still_kills",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Runs the test `name` again in a child process (with [`CHILD`] set),
/// where `child` runs and the child then exits 0; in the parent, asserts
/// the child exited 0, not by a signal. For tests that change the
/// process's signal handling, or that kill the process when they fail.
fn in_child(name: &str, child: impl FnOnce()) {
    if std::env::var_os(CHILD).is_some() {
        child();
        std::process::exit(0);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: the child process ended with {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// [`in_child`] where the guard exists; skipped elsewhere.
fn in_guarded_child(name: &str, child: impl FnOnce()) {
    if !sys::SIGBUS_PROTECTED {
        pleio_testkit::skip!("{name}: no SIGBUS guard on this target");
    }
    in_child(name, child);
}

/// The strategies that read through the mapping.
const MAPPED: [Strategy; 3] = [Strategy::Fault, Strategy::Advise, Strategy::Auto];

/// Asserts that gathering `rows` with every mapped strategy fails with the
/// error of a shrunk file and leaves `out` untouched.
fn mapped_gathers_fail(fx: &Fixture, reader: &Table, rows: &[u64], out: &mut [f32]) {
    for s in MAPPED {
        out.fill(UNTOUCHED);
        let e = reader.gather_with(s, rows, out).unwrap_err();
        check_error(fx, s, &e, true);
        assert!(out.iter().all(|&x| x == UNTOUCHED), "{s}");
    }
}

/// Installs `handler` (`SA_SIGINFO`) for `SIGBUS`, as a host does.
fn host_handler(handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)) {
    // SAFETY: installs a handler that only touches atomics and calls
    // async-signal-safe functions; the struct is plain data we own.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler as usize;
        act.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()), 0);
    }
}

/// Sets `SIGBUS`'s disposition to `SIG_DFL` (what CPython's
/// `faulthandler.disable()` does when it was enabled first).
fn host_default() {
    // SAFETY: as above, with the default disposition.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()), 0);
    }
}

/// Sends `SIGBUS` to a thread of this process as `kill` would (`tgkill`,
/// `si_code` `SI_TKILL`, no fault address).
fn send_sigbus(thread: libc::pthread_t) {
    // SAFETY: the thread is alive (its join handle is held).
    assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGBUS) }, 0);
}

/// `SIGBUS`es a host handler received.
static HOST_SIGNALS: AtomicU64 = AtomicU64::new(0);

extern "C" fn counting_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    HOST_SIGNALS.fetch_add(1, Ordering::SeqCst);
}

extern "C" fn dying_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let msg = b"the host's SIGBUS handler ran\n";
    // SAFETY: write and _exit are async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(42);
    }
}

/// A `SIGBUS` sent with `kill` while a thread copies rows out of the
/// mapping is not a fault of the copy: the gather succeeds with the right
/// rows and the signal reaches the host's handler, every time.
#[test]
fn a_sigbus_sent_with_kill_is_not_a_fault() {
    in_guarded_child("a_sigbus_sent_with_kill_is_not_a_fault", || {
        host_handler(counting_handler);
        let fx = Fixture::qwen(20_000, 8);
        let reader = fx.reader();
        let rows: Vec<u64> = (0..fx.table.rows()).collect();
        let want = bits(&fx.reference(&rows));
        let stop = AtomicU64::new(0);
        let gathers = AtomicU64::new(0);
        let thread = AtomicU64::new(0);
        let sent = std::thread::scope(|sc| {
            let worker = sc.spawn(|| {
                // SAFETY: pthread_self has no preconditions.
                thread.store(unsafe { libc::pthread_self() } as u64, Ordering::Release);
                let mut out = vec![0f32; rows.len() * reader.row_elems()];
                while stop.load(Ordering::Acquire) == 0 {
                    reader
                        .gather_with(Strategy::Fault, &rows, &mut out)
                        .expect("a signal sent with kill failed the gather");
                    assert_eq!(bits(&out), want);
                    gathers.fetch_add(1, Ordering::Release);
                }
            });
            while gathers.load(Ordering::Acquire) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut rng = Rng::new(12);
            // One at a time (a signal sent while the same one is pending
            // is merged with it), each once the previous one arrived.
            let mut sent = 0;
            while sent < 400 && !worker.is_finished() {
                send_sigbus(thread.load(Ordering::Acquire) as libc::pthread_t);
                sent += 1;
                let t0 = Instant::now();
                while HOST_SIGNALS.load(Ordering::SeqCst) < sent && !worker.is_finished() {
                    assert!(
                        t0.elapsed() < Duration::from_secs(20),
                        "signal {sent} never reached the host's handler"
                    );
                    std::thread::sleep(Duration::from_micros(50));
                }
                std::thread::sleep(Duration::from_micros(rng.below(400)));
            }
            stop.store(1, Ordering::Release);
            worker.join().map_err(std::panic::resume_unwind).unwrap();
            sent
        });
        // Every signal reached the host.
        assert_eq!(HOST_SIGNALS.load(Ordering::SeqCst), sent);
        // The host's handler, installed first, never sees pleio's own fault.
        shrink(&fx, fx.table.offset());
        let mut out = vec![0f32; reader.row_elems()];
        let last = [fx.table.rows() - 1];
        let e = reader
            .gather_with(Strategy::Fault, &last, &mut out)
            .unwrap_err();
        check_error(&fx, Strategy::Fault, &e, true);
        assert_eq!(HOST_SIGNALS.load(Ordering::SeqCst), sent);
        assert_eq!(reader.sigbus_guard(), SigbusGuard::Active);
        println!(
            "{sent} signals, {} gathers",
            gathers.load(Ordering::Relaxed)
        );
    });
}

/// A host that puts the default disposition back after pleio installed its
/// handler (CPython's `faulthandler.disable()` when faulthandler was
/// enabled first): a shrunk file is still an error, not a dead process.
#[test]
fn a_default_disposition_restored_by_the_host_is_guarded_again() {
    in_guarded_child(
        "a_default_disposition_restored_by_the_host_is_guarded_again",
        || {
            let fx = Fixture::qwen(3000, 9);
            let reader = fx.reader();
            let n = fx.table.rows();
            let mut out = vec![0f32; reader.row_elems()];
            reader
                .gather_with(Strategy::Fault, &[n - 1], &mut out)
                .unwrap();
            host_default();
            // The next gather finds the default and installs the handler
            // again (chaining to the default now), reading the mapping.
            let st = reader
                .gather_with(Strategy::Fault, &[n - 1], &mut out)
                .unwrap();
            assert_eq!(
                (st.guard_displaced, st.guard_reinstalled, st.guard_fallbacks),
                (1, 1, 0)
            );
            assert_eq!(reader.sigbus_guard(), SigbusGuard::Active);
            let st = reader
                .gather_with(Strategy::Fault, &[n - 1], &mut out)
                .unwrap();
            assert_eq!(st.guard_displaced, 0);
            // The same through the host's other door: the status query.
            host_default();
            assert_eq!(reader.sigbus_guard(), SigbusGuard::Active);
            shrink(&fx, fx.table.offset());
            mapped_gathers_fail(&fx, &reader, &[n - 1], &mut out);
        },
    );
}

/// A handler the host installs after pleio's (`faulthandler.enable()`
/// after import, a C host's own) is not overridden and never sees pleio's
/// faults: a shrunk file is still an error.
#[test]
fn a_handler_installed_later_never_sees_a_fault_of_pleio() {
    in_guarded_child(
        "a_handler_installed_later_never_sees_a_fault_of_pleio",
        || {
            let fx = Fixture::qwen(3000, 10);
            let reader = fx.reader();
            let n = fx.table.rows();
            let rows = [0, n - 1, 17];
            let want = bits(&fx.reference(&rows));
            let mut out = vec![0f32; rows.len() * reader.row_elems()];
            reader
                .gather_with(Strategy::Fault, &rows, &mut out)
                .unwrap();
            host_handler(dying_handler);
            assert_eq!(reader.sigbus_guard(), SigbusGuard::Displaced);
            assert!(reader.sigbus_guard().is_protected());
            for s in MAPPED {
                out.fill(UNTOUCHED);
                let st = reader.gather_with(s, &rows, &mut out).unwrap();
                assert_eq!(bits(&out), want, "{s}");
                assert_eq!(
                    (st.guard_displaced, st.guard_reinstalled, st.guard_fallbacks),
                    (1, 0, 1),
                    "{s}"
                );
            }
            let totals = reader.stats();
            assert_eq!((totals.guard_displaced, totals.guard_fallbacks), (3, 3));
            // The direct strategies never read the mapping: nothing to check.
            let st = reader
                .gather_with(Strategy::Pread, &rows, &mut out)
                .unwrap();
            assert_eq!((st.guard_displaced, st.guard_fallbacks), (0, 0));
            shrink(&fx, fx.table.offset());
            mapped_gathers_fail(&fx, &reader, &rows, &mut out);
        },
    );
}

/// A gathering thread that blocks `SIGBUS` keeps the guard (a blocked
/// `SIGBUS` from a fault would kill the process), and gets its mask back.
#[test]
fn a_thread_blocking_sigbus_keeps_the_guard() {
    in_guarded_child("a_thread_blocking_sigbus_keeps_the_guard", || {
        // The host's handler, there before pleio's.
        host_handler(counting_handler);
        let fx = Fixture::qwen(3000, 11);
        let whole = contents(&fx);
        let reader = fx.reader();
        let n = fx.table.rows();
        // SAFETY: plain signal-set calls on a set we own.
        let blocked = || unsafe {
            let mut now: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut now);
            libc::sigismember(&now, libc::SIGBUS) == 1
        };
        // SAFETY: as above.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGBUS);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        assert!(blocked());
        let mut out = vec![0f32; reader.row_elems()];
        reader
            .gather_with(Strategy::Fault, &[n - 1], &mut out)
            .unwrap();
        shrink(&fx, fx.table.offset());
        for s in MAPPED {
            let e = reader.gather_with(s, &[n - 1], &mut out).unwrap_err();
            check_error(&fx, s, &e, true);
            assert!(blocked(), "{s}: SIGBUS no longer blocked");
        }
        // With a SIGBUS pending (blocked, the host's to take), unblocking
        // would deliver it: the gather reads the file instead and leaves it
        // pending.
        restore(&fx, &whole);
        // SAFETY: pthread_self has no preconditions.
        send_sigbus(unsafe { libc::pthread_self() });
        // SAFETY: a pending-set query into a set we own.
        let pending = || unsafe {
            let mut p: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut p);
            libc::sigismember(&p, libc::SIGBUS) == 1
        };
        assert!(pending());
        let st = reader
            .gather_with(Strategy::Fault, &[n - 1], &mut out)
            .unwrap();
        assert_eq!(bits(&out), bits(&fx.reference(&[n - 1])));
        assert_eq!((st.guard_displaced, st.guard_fallbacks), (0, 1));
        shrink(&fx, fx.table.offset());
        let e = reader
            .gather_with(Strategy::Fault, &[n - 1], &mut out)
            .unwrap_err();
        check_error(&fx, Strategy::Fault, &e, true);
        assert!(pending() && blocked());
        assert_eq!(HOST_SIGNALS.load(Ordering::SeqCst), 0);
    });
}

/// A GGUF file whose header is cut while it is being parsed (as a device
/// error in a header page would fail it): opening is an error or succeeds,
/// it never dies by `SIGBUS` (the header is read, not mapped).
#[test]
fn a_gguf_header_cut_while_it_is_parsed_is_an_error_not_a_signal() {
    in_child(
        "a_gguf_header_cut_while_it_is_parsed_is_an_error_not_a_signal",
        || {
            let file = tempfile::NamedTempFile::new().unwrap();
            // A 16 MiB header (as a large vocabulary makes): parsing it
            // takes long enough for the cuts below to land inside.
            let mut w = pleio::gguf::GgufWriter::create(file.path()).unwrap();
            w.add_metadata("big.bytes", vec![7u8; 16 << 20]).unwrap();
            w.add_tensor("t", pleio::quant::GgmlType::F32, &[16])
                .unwrap();
            w.begin_data().unwrap();
            w.write_tensor_data(&[0u8; 64]).unwrap();
            w.finish().unwrap();
            let whole = std::fs::read(file.path()).unwrap();
            let stop = AtomicU64::new(0);
            let (mut ok, mut failed) = (0, 0);
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    let f = file.as_file();
                    let mut rng = Rng::new(5);
                    while stop.load(Ordering::Acquire) == 0 {
                        f.set_len(4096).unwrap();
                        std::thread::sleep(Duration::from_micros(rng.below(2000)));
                        f.write_all_at(&whole, 0).unwrap();
                        std::thread::sleep(Duration::from_micros(rng.below(4000)));
                    }
                });
                for _ in 0..60 {
                    match pleio::model::Model::open(file.path()) {
                        Ok(m) => {
                            assert_eq!(m.tensors().len(), 1);
                            ok += 1;
                        }
                        Err(e) => {
                            let text = e.to_string();
                            assert!(text.contains(&file.path().display().to_string()), "{text}");
                            failed += 1;
                        }
                    }
                }
                stop.store(1, Ordering::Release);
            });
            println!("{ok} opens succeeded, {failed} failed");
            // Whole again (the cutter stops after a restore): it opens.
            let m = pleio::model::Model::open(file.path()).unwrap();
            assert_eq!(m.metadata().get("big.bytes").map(|_| ()), Some(()));
        },
    );
}
