//! A table used before `fork()` keeps working in the parent and in the
//! children: io_uring (its queues are memory shared across the fork),
//! the reader-thread pool and the lookahead worker (threads do not survive
//! a fork) are made again in each child on first use. A batch prefetched
//! before the fork fails at once in the child instead of blocking.
//!
//! Every child and the parent's own gathers run under a watchdog: a
//! regression fails the test (exit status, or the watchdog's abort) rather
//! than hanging it.
#![cfg(unix)]

mod fetch_fixture;

use std::time::{Duration, Instant};

use fetch_fixture::Fixture;
use pleio::fetch::Strategy;
use pleio::lookahead::LookaheadError;

/// Longest a child or the parent may take: far above a normal run (well
/// under a second), so only a hang reaches it.
const LIMIT: Duration = Duration::from_secs(60);

/// Aborts the process (failing the test) if not disarmed within [`LIMIT`].
fn watchdog(what: &'static str) -> std::sync::mpsc::Sender<()> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(LIMIT) {
            eprintln!("fork test: {what} did not finish within {LIMIT:?}: a hang");
            std::process::abort();
        }
    });
    tx
}

/// Waits for `pid`, killing it after [`LIMIT`]; its exit code, or `None`
/// when it was killed or died by a signal.
fn wait_child(pid: libc::pid_t) -> Option<i32> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        assert!(r == 0, "waitpid failed");
        if start.elapsed() > LIMIT {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above; reaps the killed child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn every_strategy_works_in_parent_and_children_after_fork() {
    // On a real disk (O_DIRECT is refused by tmpfs), big enough that the
    // sparse ids below make many separate reads (the pool's threads and
    // the ring are used, not the inline path).
    let fx = Fixture::qwen_on_disk(60_000, 17);
    let ids: Vec<u64> = (0..600u64).map(|i| (i * 97 + 5) % 60_000).collect();
    let want = fx.reference(&ids);
    let strategies = [
        Strategy::UringDirect,
        Strategy::Uring,
        Strategy::Pool,
        Strategy::Auto,
        Strategy::Cached,
        Strategy::Fault,
    ];
    let tables: Vec<_> = strategies
        .iter()
        .map(|&s| fx.reader().with_strategy(s))
        .collect();
    let mut lookaheads = Vec::new();
    let mut out = vec![0f32; want.len()];
    for t in &tables {
        // The backends, threads and worker exist before the fork.
        t.gather(&ids, &mut out).unwrap();
        assert_eq!(out, want, "{}", t.strategy().name());
        let l = t.lookahead().unwrap();
        assert_eq!(l.prefetch(&ids).wait().unwrap().data, want);
        lookaheads.push(l);
    }
    // A batch still pending (or done) in the parent at the fork.
    let pending = lookaheads[0].prefetch(&ids);

    let mut children = Vec::new();
    for _ in 0..3 {
        // SAFETY: fork; the child only runs the code below and leaves with
        // _exit, never returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _dog = watchdog("a child");
                let mut out = vec![0f32; want.len()];
                for (t, l) in tables.iter().zip(&lookaheads) {
                    for _ in 0..5 {
                        t.gather(&ids, &mut out).unwrap();
                        assert_eq!(out, want, "{}", t.strategy().name());
                        assert_eq!(l.prefetch(&ids).wait().unwrap().data, want);
                    }
                }
                0
            }))
            .unwrap_or(1);
            // The parent's batch: an error now, never a wait forever.
            let code = match pending.wait() {
                Err(e)
                    if matches!(
                        e.inner().downcast_ref::<LookaheadError>(),
                        Some(LookaheadError::Forked { .. })
                    ) =>
                {
                    code
                }
                _ => 2,
            };
            // SAFETY: leaves the child without running the harness's exit.
            unsafe { libc::_exit(code) };
        }
        children.push(pid);
    }
    {
        // The parent meanwhile, on the same tables.
        let _dog = watchdog("the parent");
        for (t, l) in tables.iter().zip(&lookaheads) {
            for _ in 0..5 {
                t.gather(&ids, &mut out).unwrap();
                assert_eq!(out, want, "{} in the parent", t.strategy().name());
                assert_eq!(l.prefetch(&ids).wait().unwrap().data, want);
            }
        }
        assert_eq!(pending.wait().unwrap().data, want);
    }
    for pid in children {
        assert_eq!(wait_child(pid), Some(0), "child {pid}");
    }
}

#[test]
fn a_child_forked_while_the_worker_reads_for_the_row_cache_gathers() {
    // The fork lands while the parent's lookahead worker has rows of the
    // `cached` strategy's row cache claimed and its staging on loan (rows
    // no gather read before). A child that inherited that cache waited
    // forever for the worker, which it does not have; it now starts a
    // cache of its own.
    let fx = Fixture::qwen_on_disk(200_000, 19);
    for strategy in [Strategy::Cached, Strategy::Auto] {
        let t = fx.reader().with_strategy(strategy);
        let l = t.lookahead().unwrap();
        let first: Vec<u64> = (0..64).collect();
        assert_eq!(
            l.prefetch(&first).wait().unwrap().data,
            fx.reference(&first)
        );
        for r in 0..6u64 {
            let ids: Vec<u64> = (0..40_000u64)
                .map(|i| (i * (2 * r + 7919) + r) % 200_000)
                .collect();
            let want = fx.reference(&ids);
            let pending = l.prefetch(&ids);
            std::thread::sleep(Duration::from_millis(2 * r));
            // SAFETY: fork; the child only runs the code below and leaves
            // with _exit, never returning into the test harness.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let _dog = watchdog("a child forked mid-read");
                    let mut out = vec![0f32; want.len()];
                    t.gather(&ids, &mut out).unwrap();
                    i32::from(out != want)
                }))
                .unwrap_or(1);
                // SAFETY: leaves the child without running the harness's exit.
                unsafe { libc::_exit(code) };
            }
            assert_eq!(pending.wait().unwrap().data, want);
            assert_eq!(wait_child(pid), Some(0), "{} round {r}", strategy.name());
        }
    }
}

#[test]
fn a_child_forked_while_the_worker_sends_its_reply_drops_the_batch() {
    // The fork lands while the parent's lookahead worker may be in the
    // middle of sending a batch's reply (fork copies a large address space
    // over milliseconds while the worker runs on). A child that drops that
    // batch must not wait for the send: the worker is not in the child.
    // Dropping the reply channel there spun forever (1 run in 6 of the
    // Python fork test, whose big process makes the fork's snapshot of the
    // channel torn more often; this test alone did not catch that race in
    // its runs without the fix). Here each child drops a batch of its
    // parent's, forked at spread-out moments after the prefetch starts; a
    // drop that waits for the parent's worker hangs a child and fails
    // `wait_child`.
    let fx = Fixture::qwen_on_disk(20_000, 23);
    // A big dirty allocation makes each fork long, widening the window.
    let ballast = vec![1u8; 256 << 20];
    for strategy in [Strategy::Cached, Strategy::Auto] {
        let t = fx.reader().with_strategy(strategy);
        let l = t.lookahead().unwrap();
        let ids: Vec<u64> = (0..256u64).map(|i| (i * 131 + 7) % 20_000).collect();
        let want = fx.reference(&ids);
        assert_eq!(l.prefetch(&ids).wait().unwrap().data, want);
        for round in 0..40u32 {
            let pending = l.prefetch(&ids);
            let spin = Instant::now();
            while spin.elapsed() < Duration::from_micros(u64::from(round % 10) * 20) {
                std::hint::spin_loop();
            }
            // SAFETY: fork; the child only runs the code below and leaves
            // with _exit, never returning into the test harness.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let _dog = watchdog("a child dropping its parent's batch");
                    // `wait` in a child is the fork error; either way the
                    // batch (and its channel) is dropped here.
                    i32::from(pending.wait().is_ok())
                }))
                .unwrap_or(1);
                // SAFETY: leaves the child without running the harness's exit.
                unsafe { libc::_exit(code) };
            }
            assert_eq!(pending.wait().unwrap().data, want);
            assert_eq!(
                wait_child(pid),
                Some(0),
                "{} round {round}",
                strategy.name()
            );
        }
    }
    assert_eq!(ballast[ballast.len() - 1], 1);
}
