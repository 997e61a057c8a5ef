//! The `cached` strategy beyond its bytes (which the one tester checks):
//! it stays within its budget, reads a row other gathers are waiting for
//! once, serves hits from its own memory, leaves the page cache alone,
//! prewarms, refuses a budget it cannot keep, leaves the output untouched
//! when a read fails, and follows the file when it changes; the same for a
//! checkpoint whose rows are split over parts and files.

mod fetch_fixture;

use std::sync::{Arc, Barrier};

use fetch_fixture::{bits, CkptFixture, Fixture, Rng};
use pleio::{CachePolicy, Dtype, ErrorKind, Strategy, Table};
use pleio_lab::synth_ckpt::CkptEncoding;

fn cached(fx: &Fixture, budget: u64) -> Table {
    fx.reader()
        .with_strategy(Strategy::Cached)
        .with_budget(budget)
        .unwrap()
}

#[test]
fn eight_threads_stay_exact_and_within_the_budget() {
    let fx = Fixture::qwen(50_000, 21);
    for &policy in CachePolicy::ALL {
        for budget in [64u64 << 10, 1 << 20] {
            let table = cached(&fx, budget).with_cache_policy(policy);
            std::thread::scope(|sc| {
                for t in 0..8u64 {
                    let (table, fx) = (&table, &fx);
                    sc.spawn(move || {
                        let mut rng = Rng::new(t);
                        for _ in 0..20 {
                            // A hot range every thread shares and a cold tail.
                            let rows: Vec<u64> = (0..300)
                                .map(|k| {
                                    if k % 2 == 0 {
                                        rng.below(2000)
                                    } else {
                                        rng.below(50_000)
                                    }
                                })
                                .collect();
                            let mut out = vec![0f32; rows.len() * table.row_elems()];
                            let st = table.gather(&rows, &mut out).unwrap();
                            assert_eq!(bits(&out), bits(&fx.reference(&rows)), "{policy}");
                            let bytes = st.cache_bytes.unwrap();
                            assert!(bytes <= budget, "{policy}: {bytes} cached of {budget}");
                        }
                    });
                }
            });
            let k = table.cache_counters().unwrap();
            assert!(k.evictions > 0, "{policy} {budget}: nothing evicted");
            assert!(k.resident_bytes <= budget);
            let alloc = table.cache_allocated_bytes();
            assert!(
                alloc > 0 && alloc <= budget,
                "{policy}: {alloc} of {budget}"
            );
        }
    }
}

#[test]
fn a_row_wanted_by_many_gathers_at_once_is_read_once() {
    let fx = Fixture::qwen(40_000, 22);
    let table = cached(&fx, 8 << 20);
    let rows: Vec<u64> = (0..1500).map(|k| k * 26 + 1).collect();
    let start = Barrier::new(8);
    let stats: Vec<_> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (table, rows, start) = (&table, &rows, &start);
                sc.spawn(move || {
                    let mut out = vec![0f32; rows.len() * table.row_elems()];
                    start.wait();
                    table.gather(rows, &mut out).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let misses: u64 = stats.iter().map(|s| s.cache_misses).sum();
    let hits: u64 = stats.iter().map(|s| s.cache_hits).sum();
    // Every row read exactly once over all eight gathers; the rest waited
    // for those reads or found the rows cached.
    assert_eq!(misses, rows.len() as u64);
    assert_eq!(hits, 7 * rows.len() as u64);
}

#[test]
fn hits_come_from_memory_and_reads_bypass_the_page_cache() {
    let fx = Fixture::qwen_on_disk(200_000, 23);
    let table = cached(&fx, 4 << 20);
    let t = table.layout().clone();
    let m = table.mapping().unwrap();
    let range = t.offset()..t.offset() + t.bytes();
    // Evict what writing the file left in the page cache (the no-op OS
    // layer can neither evict nor tell residency: there only the cache's
    // own counters are checked).
    let before = (!pleio::sys::NOOP).then(|| {
        let f = std::fs::File::open(fx.file.path()).unwrap();
        f.sync_all().unwrap();
        pleio::sys::evict(&f, 0..fx.file_len()).unwrap();
        m.resident_pages(range.clone()).unwrap()
    });
    let rows: Vec<u64> = (0..2000).map(|k| k * 97 + 5).collect();
    let mut out = vec![0f32; rows.len() * table.row_elems()];
    let first = table.gather(&rows, &mut out).unwrap();
    if let (Some(before), false) = (before, first.fallback) {
        // O_DIRECT: the pages did not enter the page cache.
        let after = m.resident_pages(range.clone()).unwrap();
        assert!(after <= before + 2, "{before} -> {after} pages resident");
    }
    // (The reference reads through the page cache, so it comes second.)
    assert_eq!(bits(&out), bits(&fx.reference(&rows)));
    assert_eq!(first.cache_misses, rows.len() as u64);
    assert!(first.read_bytes > 0);
    let second = table.gather(&rows, &mut out).unwrap();
    assert_eq!(bits(&out), bits(&fx.reference(&rows)));
    assert_eq!(
        (second.cache_hits, second.cache_misses),
        (rows.len() as u64, 0)
    );
    assert_eq!((second.read_requests, second.read_bytes), (0, 0));
    // Cleared, the next gather reads again.
    table.clear_cache();
    let third = table.gather(&rows, &mut out).unwrap();
    assert_eq!(third.cache_misses, rows.len() as u64);
}

#[test]
fn a_tiny_budget_evicts_every_batch() {
    let fx = Fixture::qwen(30_000, 24);
    let table = cached(&fx, 64 << 10);
    let cap = table.cache_counters();
    assert!(cap.is_none(), "made before first use");
    let mut rng = Rng::new(5);
    let mut evicted = 0;
    for _ in 0..10 {
        let rows: Vec<u64> = (0..2000).map(|_| rng.below(30_000)).collect();
        let mut out = vec![0f32; rows.len() * table.row_elems()];
        let st = table.gather(&rows, &mut out).unwrap();
        assert_eq!(bits(&out), bits(&fx.reference(&rows)));
        evicted += st.cache_evictions;
    }
    let k = table.cache_counters().unwrap();
    assert!(k.rows <= k.capacity && k.capacity < 2000);
    assert!(evicted > 5000, "{evicted}");
}

#[test]
fn prewarm_fills_the_cache_with_the_hottest_rows() {
    let fx = Fixture::qwen(30_000, 25);
    let table = cached(&fx, 256 << 10);
    // A profile: rows 0..5000, row r seen (5000 - r) / 500 + 1 times.
    let mut profile = Vec::new();
    for r in 0..5000u64 {
        for _ in 0..(5000 - r) / 500 + 1 {
            profile.push(r * 5);
        }
    }
    let ranked = pleio::fetch::rank_by_frequency(&profile);
    let mut calls = 0;
    let rep = table
        .prewarm(&ranked, 0, &mut |done, total| {
            calls += 1;
            assert!(done <= total);
        })
        .unwrap();
    assert!(calls >= 2);
    assert_eq!(rep.target, "row cache");
    let cap = table.cache_counters().unwrap().capacity;
    assert_eq!(rep.rows, cap.min(5000));
    assert_eq!(rep.rows_read, rep.rows);
    // The hottest rows are in; gathering them reads nothing.
    let hot: Vec<u64> = ranked[..100].to_vec();
    let mut out = vec![0f32; hot.len() * table.row_elems()];
    let st = table.gather(&hot, &mut out).unwrap();
    assert_eq!(bits(&out), bits(&fx.reference(&hot)));
    assert_eq!(st.cache_misses, 0);
    assert!(table.cache_allocated_bytes() <= 256 << 10);
    // The page cache target: as many rows as `budget` bytes of pages hold.
    let plain = fx.reader().with_strategy(Strategy::Auto);
    let rep = plain.prewarm(&ranked, 64 << 10, &mut |_, _| {}).unwrap();
    assert_eq!(rep.target, "page cache");
    let page = pleio::sys::page_size();
    assert!(rep.pages.unwrap() <= (64 << 10) / page);
    assert!(rep.rows > 0);
    assert!(plain.believed_resident_pages() > 0);
}

#[test]
fn a_budget_too_small_is_refused_naming_the_minimum() {
    let fx = Fixture::qwen(1000, 26);
    let e = fx.reader().with_budget(1000).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Setup, "{e}");
    assert!(e.to_string().contains("at least"), "{e}");
    // Ids are checked before the cache is touched.
    let table = cached(&fx, 64 << 10);
    let mut out = vec![0f32; table.row_elems()];
    let e = table.gather(&[1000], &mut out).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::RowOutOfRange);
    let e = table.prewarm(&[5, 1000], 0, &mut |_, _| {}).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::RowOutOfRange);
}

#[test]
fn clones_share_a_cache_and_a_new_budget_makes_a_new_one() {
    let fx = Fixture::qwen(5000, 27);
    let a = cached(&fx, 1 << 20);
    let b = a.clone();
    let mut out = vec![0f32; 3 * a.row_elems()];
    a.gather(&[1, 2, 3], &mut out).unwrap();
    let st = b.gather(&[1, 2, 3], &mut out).unwrap();
    assert_eq!(st.cache_hits, 3);
    let c = Arc::new(b.clone().with_budget(2 << 20).unwrap());
    let st = c.gather(&[1, 2, 3], &mut out).unwrap();
    assert_eq!(st.cache_misses, 3);
    assert_eq!(c.cache_budget(), 2 << 20);
}

#[test]
fn a_failed_read_leaves_the_output_untouched_and_a_changed_file_empties_the_cache() {
    use std::os::unix::fs::FileExt;
    const UNTOUCHED: f32 = -7.25;
    let fx = Fixture::qwen_on_disk(6000, 28);
    let t = fx.table.clone();
    let n = t.rows();
    let whole = std::fs::read(fx.file.path()).unwrap();
    let file = fx.file.as_file();
    // Cut the file inside row 3000: rows 0..2000 are whole, row n-1 is gone.
    file.set_len(t.offset() + 3000 * t.row_bytes() + 7).unwrap();
    // The cache is made (and looks at the file) after the cut.
    let table = cached(&fx, 64 << 10);
    let hot: Vec<u64> = (0..20).map(|k| k * 37).collect();
    let mut out = vec![0f32; hot.len() * table.row_elems()];
    table.gather(&hot, &mut out).unwrap();
    assert_eq!(bits(&out), bits(&fx.reference(&hot)));
    let check_fails = |rows: &[u64], what: &str| {
        let mut out = vec![UNTOUCHED; rows.len() * table.row_elems()];
        let e = table.gather(rows, &mut out).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{what}: {e}");
        assert!(e.to_string().contains("offset"), "{what}: {e}");
        assert!(
            out.iter().all(|&x| x == UNTOUCHED),
            "{what}: output written on error"
        );
    };
    // Hits first, then a row that cannot be read.
    let mut rows = hot.clone();
    rows.push(n - 1);
    check_fails(&rows, "hits and a missing row");
    assert!(hot.iter().all(|&r| table.is_cached(r)));
    // Many misses, read in several staging-sized chunks, the last failing.
    let mut rows: Vec<u64> = (0..2000).collect();
    rows.push(n - 1);
    check_fails(&rows, "chunks of misses, the last one failing");
    // The file is put back (truncated, then written, as `cp` does): the
    // cache is emptied and every row read again.
    file.set_len(0).unwrap();
    file.write_all_at(&whole, 0).unwrap();
    later_mtime(file);
    let mut rows = hot.clone();
    rows.push(n - 1);
    let mut out = vec![0f32; rows.len() * table.row_elems()];
    let st = table.gather(&rows, &mut out).unwrap();
    assert_eq!(bits(&out), bits(&fx.reference(&rows)));
    assert_eq!(st.cache_hits, 0, "{st:?}");
    assert_eq!(st.cache_misses, rows.len() as u64, "{st:?}");
    // Rewritten in place, same length: row 37 now holds row 5's bytes,
    // and the cache serves the file as it is now (its modification time
    // moved past the last look's).
    let rb = t.row_bytes() as usize;
    let at = |r: u64| (t.offset() + r * t.row_bytes()) as usize;
    file.write_all_at(&whole[at(5)..at(5) + rb], at(37) as u64)
        .unwrap();
    later_mtime(file);
    let mut out = vec![0f32; table.row_elems()];
    table.gather(&[37], &mut out).unwrap();
    assert_eq!(bits(&out), bits(&fx.reference(&[5])));
    file.write_all_at(&whole, 0).unwrap();
}

/// Gives `file` a modification time it never had: a write within the file
/// system's timestamp granularity of the cache's last look may leave the
/// time unchanged, and waiting for the clock to tick would make the test
/// depend on the machine. Each call sets a new time in 2001, which no write
/// in this test can produce.
fn later_mtime(file: &std::fs::File) {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000 + n);
    file.set_modified(t).unwrap();
    assert_eq!(file.metadata().unwrap().modified().unwrap(), t);
}

fn cached_ckpt(fx: &CkptFixture, budget: u64) -> Table {
    fx.reader()
        .with_strategy(Strategy::Cached)
        .with_budget(budget)
        .unwrap()
}

/// `rows` as stored bytes through `strategy`, with the gather's stats.
fn raw(table: &Table, s: Strategy, rows: &[u64]) -> (Vec<u8>, pleio::GatherStats) {
    let mut out = vec![0u8; table.out_bytes(Dtype::Raw, rows.len()).unwrap()];
    let st = table.gather_as_with(s, Dtype::Raw, rows, &mut out).unwrap();
    (out, st)
}

#[test]
fn a_multi_file_mlx4_checkpoint_reads_each_missing_row_once_and_matches_pread() {
    // Three parts a row (words, scales, biases), 16 shards over 4 files.
    let fx = CkptFixture::new(CkptEncoding::Mlx4, 20_000, 16, 4, 41);
    let table = cached_ckpt(&fx, 8 << 20);
    let layout = table.layout();
    assert_eq!(layout.parts(), 3);
    let files: std::collections::HashSet<usize> = layout.regions().map(|r| r.file).collect();
    assert_eq!(files.len(), 4);
    // 1500 distinct rows over every shard, some asked for twice.
    let mut rows: Vec<u64> = (0..1500).map(|k| k * (fx.rows / 1500) + k % 7).collect();
    rows.extend_from_within(..100);
    let (pread, _) = raw(&table, Strategy::Pread, &rows);
    assert!(pread == fx.reference_raw(&rows));
    let start = Barrier::new(8);
    let stats: Vec<_> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (table, rows, start, pread) = (&table, &rows, &start, &pread);
                sc.spawn(move || {
                    let mut out = vec![7u8; pread.len()];
                    start.wait();
                    let st = table
                        .gather_as_with(Strategy::Cached, Dtype::Raw, rows, &mut out)
                        .unwrap();
                    assert!(out == *pread, "cached differs from pread");
                    st
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let misses: u64 = stats.iter().map(|s| s.cache_misses).sum();
    let hits: u64 = stats.iter().map(|s| s.cache_hits).sum();
    // Every distinct row read exactly once over all eight gathers.
    assert_eq!(misses, 1500);
    assert_eq!(hits, 7 * 1500);
    let reader = stats.iter().find(|s| s.cache_misses > 0).unwrap();
    assert!(reader.read_bytes > 0);
    if !reader.fallback {
        assert_eq!(reader.backend, Some("uring-direct"));
    }
    // Decoded, the same floats as the reference decoder.
    let mut out = vec![0f32; rows.len() * table.row_elems()];
    let st = table.gather(&rows, &mut out).unwrap();
    assert_eq!(bits(&out), bits(&fx.reference(&rows)));
    assert_eq!((st.cache_hits, st.read_requests), (1500, 0));

    // A budget of a few dozen rows: every batch evicts, and stays exact and
    // within the budget.
    let small = cached_ckpt(&fx, 64 << 10);
    let mut rng = Rng::new(9);
    let mut evicted = 0;
    for _ in 0..10 {
        let rows: Vec<u64> = (0..500).map(|_| rng.below(fx.rows)).collect();
        let (got, st) = raw(&small, Strategy::Cached, &rows);
        assert!(got == fx.reference_raw(&rows));
        evicted += st.cache_evictions;
    }
    assert!(evicted > 1000, "{evicted}");
    assert!(small.cache_allocated_bytes() <= 64 << 10);
}

#[test]
fn a_checkpoint_prewarms_and_any_changed_file_empties_the_cache() {
    use std::os::unix::fs::FileExt;
    let fx = CkptFixture::new(CkptEncoding::Nvfp4, 6000, 8, 3, 42);
    let table = cached_ckpt(&fx, 1 << 20);
    let files = table.checkpoint().unwrap().files.clone();
    assert_eq!(files.len(), 3);
    // Prewarm the row cache: the profile's rows are then hits.
    let hot: Vec<u64> = (0..300).map(|k| k * 19 + 3).collect();
    let rep = table.prewarm(&hot, 0, &mut |_, _| {}).unwrap();
    assert_eq!(
        (rep.target, rep.rows, rep.rows_read),
        ("row cache", 300, 300)
    );
    let (got, st) = raw(&table, Strategy::Cached, &hot);
    assert!(got == fx.reference_raw(&hot));
    assert_eq!((st.cache_hits, st.cache_misses), (300, 0));
    // Touch the last file (same bytes, a new modification time): the cache
    // is emptied and every row read again.
    let last = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&files[2])
        .unwrap();
    let whole = std::fs::read(&files[2]).unwrap();
    last.write_all_at(&whole, 0).unwrap();
    later_mtime(&last);
    let (got, st) = raw(&table, Strategy::Cached, &hot);
    assert!(got == fx.reference_raw(&hot));
    assert_eq!((st.cache_hits, st.cache_misses), (0, 300), "{st:?}");
    // Cut it short: the rows with a part there fail naming it, and the
    // output is untouched.
    last.set_len(whole.len() as u64 / 3).unwrap();
    let rows: Vec<u64> = (0..fx.rows).step_by(7).collect();
    let mut out = vec![7u8; table.out_bytes(Dtype::Raw, rows.len()).unwrap()];
    let e = table
        .gather_as_with(Strategy::Cached, Dtype::Raw, &rows, &mut out)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        e.to_string().contains(&files[2].display().to_string()),
        "{e}"
    );
    assert!(out.iter().all(|&b| b == 7), "output written on error");
    last.write_all_at(&whole, 0).unwrap();
    let (got, _) = raw(&table, Strategy::Cached, &rows);
    assert!(got == fx.reference_raw(&rows));
    // The page-cache target reads every part from its own file.
    let plain = fx.reader().with_strategy(Strategy::Auto);
    let rep = plain.prewarm(&hot, 64 << 10, &mut |_, _| {}).unwrap();
    assert_eq!(rep.target, "page cache");
    let page = pleio::sys::page_size();
    assert!(rep.rows > 0 && rep.pages.unwrap() <= (64 << 10) / page);
    assert!(plain.believed_resident_pages() > 0);
    let warm = &rep.set[..rep.rows as usize];
    let (got, _) = raw(&plain, Strategy::Auto, warm);
    assert!(got == fx.reference_raw(warm));
}

/// CPU time this thread has run, from `/proc/thread-self/schedstat`
/// (nanoseconds; `None` off Linux).
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Warm hits from 1, 2, 4 and 8 threads gathering 512-token ubatches (8192
/// rows) of random rows of a 200k-row table held whole in a 64 MiB cache:
/// wall-clock rows/s, and rows per CPU-second of the gathering threads (on a
/// loaded machine the second shows what lock contention costs: it would
/// fall as threads are added if they fought over shards). Prints; asserts
/// only that every row was a hit.
/// `cargo test --release -p pleio --test row_cache -- --ignored --nocapture`
#[test]
#[ignore = "measurement"]
fn measure_hit_scaling() {
    let fx = Fixture::qwen_on_disk(200_000, 28);
    let table = cached(&fx, 64 << 20);
    let all: Vec<u64> = (0..200_000).collect();
    let mut out = vec![0f32; all.len() * table.row_elems()];
    table.gather(&all, &mut out).unwrap();
    let mut rng = Rng::new(3);
    let batches: Vec<Vec<u64>> = (0..64)
        .map(|_| (0..8192).map(|_| rng.below(200_000)).collect())
        .collect();
    for threads in [1usize, 2, 4, 8] {
        let t0 = std::time::Instant::now();
        let cpu: u64 = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (table, batches) = (&table, &batches);
                    sc.spawn(move || {
                        let c0 = thread_cpu_ns().unwrap_or(0);
                        let mut out = vec![0f32; 8192 * table.row_elems()];
                        for b in batches.iter().skip(t).step_by(threads) {
                            let st = table.gather(b, &mut out).unwrap();
                            assert_eq!(st.cache_misses, 0);
                        }
                        thread_cpu_ns().unwrap_or(0) - c0
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let s = t0.elapsed().as_secs_f64();
        let rows = 64.0 * 8192.0;
        println!(
            "{threads} threads: {:.2} M rows/s wall, {:.2} M rows per CPU-second",
            rows / s / 1e6,
            rows / (cpu as f64 / 1e9) / 1e6,
        );
    }
}
