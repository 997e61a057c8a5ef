//! Lookahead (background prefetch) and the replay driver built on it:
//! prefetched bits equal direct gathers for every strategy, the completion
//! never reads the file again, dropped handles are safe, errors surface at
//! wait; replay plans continue the n-gram history into the decode steps and
//! every strategy, with or without lookahead, gathers the same floats.

mod fetch_fixture;

use std::time::Duration;

use fetch_fixture::{bits, Fixture, Rng};
use pleio::lookahead::Lookahead;
use pleio::ngram::RowMapper;
use pleio::sys;
use pleio::{ErrorKind, Strategy};
use pleio_lab::replay::{checksum, ProcSample, ReplayConfig, Replayer, CHECKSUM_INIT};
use pleio_testkit::skip;

fn random_rows(fx: &Fixture, n: usize, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(fx.table.rows())).collect()
}

/// Bytes the calling thread caused to be read from storage.
fn thread_read_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/io").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn prefetched_rows_equal_direct_gathers_and_are_read_once() {
    let fx = Fixture::qwen(6000, 5);
    let reader = fx.reader();
    let batches: Vec<Vec<u64>> = (0..4).map(|s| random_rows(&fx, 700, s)).collect();
    for &s in Strategy::ALL {
        let la = Lookahead::new(reader.clone(), s).unwrap();
        // Several batches in flight at once, completed in order.
        let handles: Vec<_> = batches.iter().map(|rows| la.prefetch(rows)).collect();
        for (i, (h, rows)) in handles.into_iter().zip(&batches).enumerate() {
            let want = bits(&fx.reference(rows));
            if i % 2 == 0 {
                let p = h.wait().unwrap_or_else(|e| panic!("{s}: {e}"));
                assert_eq!(&p.rows, rows, "{s}");
                assert_eq!(bits(&p.data), want, "{s}: batch {i}");
                assert_eq!(p.stats.rows, rows.len() as u64);
                la.recycle(p.data);
            } else {
                let mut out = vec![f32::NAN; rows.len() * reader.row_elems()];
                h.wait_into(&mut out).unwrap_or_else(|e| panic!("{s}: {e}"));
                assert_eq!(bits(&out), want, "{s}: batch {i}");
            }
        }
        // Every batch was gathered exactly once, by the worker.
        let c = la.counters();
        assert_eq!(c.prefetches, 4, "{s}");
        assert_eq!(c.worker_gathers, 4, "{s}");
        assert_eq!(c.worker_rows, 4 * 700, "{s}");
        assert_eq!((c.cancelled, c.direct_gathers), (0, 0), "{s}");
    }
}

#[test]
fn completion_reads_nothing_from_a_cold_file() {
    if sys::NOOP || thread_read_bytes().is_none() {
        skip!("no eviction or no per-thread I/O counters here");
    }
    // On the build's disk: eviction does nothing on a tmpfs TMPDIR.
    let fx = Fixture::qwen_on_disk(40_000, 9);
    fx.file.as_file().sync_all().unwrap();
    let replayer = Replayer::new(fx.model.clone(), fx.table.clone()).unwrap();
    let rows = random_rows(&fx, 2000, 3);
    let want = bits(&fx.reference(&rows));
    for &s in Strategy::ALL {
        let la = Lookahead::new(replayer.reader().clone(), s).unwrap();
        let ev = replayer.evict().unwrap();
        assert!(ev.resident_after.is_some_and(|r| r <= 2), "{s}: {ev:?}");
        let process = ProcSample::now();
        let mine = thread_read_bytes().unwrap();
        let mut h = la.prefetch(&rows);
        while !h.is_ready() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut out = vec![0f32; rows.len() * replayer.reader().row_elems()];
        h.wait_into(&mut out).unwrap();
        let mine = thread_read_bytes().unwrap() - mine;
        let process = ProcSample::now().since(&process);
        assert_eq!(bits(&out), want, "{s}");
        // A completion that read the table would read most of 2000 rows'
        // pages; a page or two is this thread faulting in a page of its own
        // code or libc that memory pressure evicted (seen once, 4096 B,
        // under a loaded machine's parallel builds).
        assert!(mine <= 16 << 10, "{s}: the completing thread read {mine} B");
        assert!(
            process.read_bytes.unwrap() > 0,
            "{s}: nothing was read from the evicted file"
        );
        assert_eq!(la.counters().worker_gathers, 1, "{s}");
    }
}

#[test]
fn dropped_handles_are_safe() {
    let fx = Fixture::qwen(6000, 2);
    let reader = fx.reader();
    let big = random_rows(&fx, 5000, 1);
    let rows = random_rows(&fx, 300, 2);
    let la = Lookahead::new(reader.clone(), Strategy::Fault).unwrap();
    let busy = la.prefetch(&big);
    drop(la.prefetch(&rows)); // dropped, most likely before the worker starts it
    let last = la.prefetch(&rows);
    drop(busy); // dropped before, while or after running
    let p = last.wait().unwrap();
    assert_eq!(bits(&p.data), bits(&fx.reference(&rows)));
    let c = la.counters();
    // Every batch up to `last` was run or skipped (FIFO), nothing else.
    assert_eq!(c.worker_gathers + c.cancelled, 3, "{c:?}");
    assert!(c.worker_gathers >= 1, "{c:?}");

    // A handle outliving its lookahead still completes.
    let orphan = la.prefetch(&rows);
    drop(la);
    assert_eq!(
        bits(&orphan.wait().unwrap().data),
        bits(&fx.reference(&rows))
    );
}

#[test]
fn errors_surface_at_wait_and_the_worker_goes_on() {
    let fx = Fixture::qwen(1000, 4);
    let n = fx.table.rows();
    for &s in Strategy::ALL {
        let la = Lookahead::new(fx.reader(), s).unwrap();
        let bad = la.prefetch(&[0, n, 1]);
        let good = la.prefetch(&[n - 1, 0]);
        let mut out = vec![7.0f32; 3 * fx.table.row_elems() as usize];
        match bad.wait_into(&mut out) {
            Err(e) => assert_eq!(
                (e.kind(), e.row()),
                (ErrorKind::RowOutOfRange, Some(n)),
                "{s}"
            ),
            other => panic!("{s}: {other:?}"),
        }
        assert!(out.iter().all(|&x| x == 7.0), "{s}: output written");
        let p = good.wait().unwrap();
        assert_eq!(bits(&p.data), bits(&fx.reference(&[n - 1, 0])), "{s}");
        // A batch of the wrong size for the caller's buffer.
        let h = la.prefetch(&[1]);
        assert!(matches!(
            h.wait_into(&mut out),
            Err(e) if e.kind() == ErrorKind::OutputSize
        ));
    }
}

/// A token stream with repeats and resets, valid for any qwen4exp table.
fn stream(n: usize) -> Vec<u32> {
    let mut rng = Rng::new(77);
    (0..n)
        .map(|i| match i % 97 {
            50 => 248_044,
            _ => rng.below(3000) as u32,
        })
        .collect()
}

#[test]
fn replay_plans_continue_the_history_into_decode() {
    let fx = Fixture::qwen(50_000, 1);
    let r = Replayer::new(fx.model.clone(), fx.table.clone()).unwrap();
    let tokens = stream(1000);
    let one = |toks: &[u32]| {
        let mut rows = Vec::new();
        r.mapper().sequence().map_tokens(toks, &mut rows).unwrap();
        rows
    };
    // Decode continues the stream: prefill is all but the last 37 tokens.
    let cfg = ReplayConfig {
        ubatch: 100,
        decode: 37,
        ..ReplayConfig::default()
    };
    let plan = r.plan(&tokens, &cfg).unwrap();
    assert_eq!((plan.prefill, plan.drawn), (963, 0));
    assert_eq!(plan.tokens, tokens);
    assert_eq!(plan.rows, one(&tokens));
    assert_eq!(plan.ubatches().count(), 10);
    assert_eq!(plan.decode_steps().count(), 37);
    let per = plan.rows_per_token;
    assert_eq!(per, 16);
    let flat: Vec<u64> = plan
        .ubatches()
        .chain(plan.decode_steps())
        .flatten()
        .copied()
        .collect();
    assert_eq!(flat, plan.rows);

    // The stream runs out: the rest are drawn from it, seeded, and the
    // history still runs through.
    let cfg = ReplayConfig {
        ubatch: 256,
        prefill: Some(990),
        decode: 50,
        seed: 5,
        ..ReplayConfig::default()
    };
    let plan = r.plan(&tokens, &cfg).unwrap();
    assert_eq!((plan.prefill, plan.drawn), (990, 40));
    assert_eq!(&plan.tokens[..1000], &tokens[..]);
    assert!(plan.tokens[1000..].iter().all(|t| tokens.contains(t)));
    assert_eq!(plan.rows, one(&plan.tokens));
    assert_eq!(r.plan(&tokens, &cfg).unwrap(), plan, "seeded");
    let other = ReplayConfig {
        seed: 6,
        ..cfg.clone()
    };
    assert_ne!(r.plan(&tokens, &other).unwrap().tokens, plan.tokens);

    assert!(r.plan(&[], &cfg).is_err());
    let zero = ReplayConfig {
        ubatch: 0,
        ..cfg.clone()
    };
    assert!(r.plan(&tokens, &zero).is_err());
    let long = ReplayConfig {
        prefill: Some(1001),
        ..cfg
    };
    assert!(r.plan(&tokens, &long).is_err());
}

#[test]
fn replays_gather_the_same_floats_with_every_strategy_and_lookahead() {
    let fx = Fixture::qwen(50_000, 8);
    let r = Replayer::new(fx.model.clone(), fx.table.clone()).unwrap();
    let tokens = stream(700);
    let base = ReplayConfig {
        ubatch: 128,
        decode: 20,
        ..ReplayConfig::default()
    };
    let plan = r.plan(&tokens, &base).unwrap();
    let want = checksum(CHECKSUM_INIT, &fx.reference(&plan.rows));
    for &s in Strategy::ALL {
        for lookahead in [false, true] {
            let cfg = ReplayConfig {
                strategy: s,
                lookahead,
                compute: Duration::from_millis(if lookahead { 2 } else { 0 }),
                ..base.clone()
            };
            let rep = r.run(&plan, &cfg).unwrap();
            assert_eq!(rep.checksum, want, "{s} lookahead {lookahead}");
            assert_eq!(rep.prefill.tokens, 680);
            assert_eq!(rep.prefill.steps, 6);
            assert_eq!(rep.ubatches.len(), 6);
            assert_eq!(rep.ubatches[5].tokens, 680 - 5 * 128);
            assert_eq!(rep.decode.steps, 20);
            assert_eq!(rep.decode.rows, 20 * 16);
            assert_eq!(
                rep.ubatches.iter().map(|u| u.rows).sum::<usize>(),
                rep.prefill.rows
            );
            assert!(rep.prefill.tokens_per_s().is_some());
            assert_eq!(rep.ubatches[0].reused_rows, 0);
            if lookahead {
                let c = rep.lookahead_counters.unwrap();
                assert_eq!((c.prefetches, c.worker_gathers), (6, 6));
            }
        }
    }
}

#[test]
fn cold_replays_evict_before_prefill_and_decode() {
    if sys::NOOP {
        skip!("the no-op OS layer cannot evict");
    }
    let fx = Fixture::qwen_on_disk(50_000, 3);
    fx.file.as_file().sync_all().unwrap();
    let r = Replayer::new(fx.model.clone(), fx.table.clone()).unwrap();
    let cfg = ReplayConfig {
        ubatch: 64,
        decode: 8,
        cold: true,
        ..ReplayConfig::default()
    };
    let plan = r.plan(&stream(300), &cfg).unwrap();
    let rep = r.run(&plan, &cfg).unwrap();
    assert_eq!(rep.evictions.len(), 2);
    for e in &rep.evictions {
        assert!(e.resident_after.is_some_and(|p| p <= 2), "{e:?}");
    }
    assert_eq!(
        rep.checksum,
        checksum(CHECKSUM_INIT, &fx.reference(&plan.rows))
    );
    if let Some(b) = rep.prefill.read_bytes {
        assert!(b > 0, "a cold prefill read nothing");
    }
}

/// `Table::prefetch`, the engines' entry: ids checked at the call, one
/// worker for a table and its clones, each batch gathered with the handle it
/// was prefetched on, and a batch outliving every handle still completes.
#[test]
fn table_prefetch_checks_ids_now_and_follows_its_handle() {
    let fx = Fixture::qwen(3000, 6);
    let table = fx.reader();
    let n = table.rows();
    let rows = random_rows(&fx, 300, 11);
    let want = bits(&fx.reference(&rows));

    // A bad id is an error at the call, naming it; nothing is queued.
    let e = table.prefetch(&[0, n], pleio::Dtype::F32).unwrap_err();
    assert_eq!((e.kind(), e.row()), (ErrorKind::RowOutOfRange, Some(n)));

    // Clones with other strategies share the worker; each batch uses its own
    // handle's strategy (the stats name the backend that served it).
    let pread = table.clone().with_strategy(Strategy::Pread);
    let fault = table.clone().with_strategy(Strategy::Fault);
    let a = pread.prefetch(&rows, pleio::Dtype::F32).unwrap();
    let b = fault.prefetch(&rows, pleio::Dtype::F32).unwrap();
    let (a, b) = (a.wait().unwrap(), b.wait().unwrap());
    assert_eq!((bits(&a.data), bits(&b.data)), (want.clone(), want.clone()));
    assert_eq!(a.stats.backend, Some("pread"));
    assert_eq!(b.stats.backend, None);

    // Another dtype: the bytes a direct gather_as writes.
    let mut direct = vec![0u8; table.out_bytes(pleio::Dtype::Bf16, rows.len()).unwrap()];
    table
        .gather_as(pleio::Dtype::Bf16, &rows, &mut direct)
        .unwrap();
    let p = table
        .prefetch(&rows, pleio::Dtype::Bf16)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!((p.bytes, p.data.len()), (direct.clone(), 0));
    // A wrong-sized output is an OutputSize error.
    let e = table
        .prefetch(&rows, pleio::Dtype::Bf16)
        .unwrap()
        .wait_into_bytes(&mut [0u8; 3])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutputSize);

    // Every handle dropped with a batch in flight: the batch completes, and
    // the worker stops (the drop does not hang).
    let pending = pread.prefetch(&rows, pleio::Dtype::F32).unwrap();
    drop((table, pread, fault));
    assert_eq!(bits(&pending.wait().unwrap().data), want);
}
