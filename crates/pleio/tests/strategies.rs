//! One harness for every fetch strategy: each `Strategy::ALL` member gathers
//! the same row lists and must produce the same bits as an independent
//! reference (plain reads, scalar decoder). New strategies are picked up
//! from `Strategy::ALL` without touching this file.

mod fetch_fixture;

use std::sync::Arc;

use fetch_fixture::{bits, Fixture, Lcg};
use pleio::fetch::{GatherError, Strategy, TableReader};
use pleio::sys;
use pleio::table::TableError;

/// The row lists every strategy must agree on.
fn row_lists(fx: &Fixture) -> Vec<(&'static str, Vec<u64>)> {
    let n = fx.table.n_rows;
    let page = sys::page_size();
    let mut rng = Lcg(7);
    let random: Vec<u64> = (0..1000).map(|_| rng.below(n)).collect();
    let mut dense: Vec<u64> = (0..700).collect();
    dense.reverse();
    vec![
        ("empty batch", vec![]),
        ("first row", vec![0]),
        ("last row, ending at EOF", vec![n - 1]),
        ("duplicates", vec![3, 3, 9, 3, n - 1, 9, n - 1, 0, 0]),
        ("page straddlers", fx.straddlers(page, 40)),
        ("random, more than one advice chunk", random),
        ("dense, reversed (overlapping runs)", dense),
        ("both ends", vec![n - 1, 0, n - 2, 1]),
    ]
}

fn gather(reader: &TableReader, s: Strategy, rows: &[u64]) -> Vec<f32> {
    let mut out = vec![f32::NAN; rows.len() * reader.row_elems()];
    let stats = reader
        .gather(s, rows, &mut out)
        .unwrap_or_else(|e| panic!("{s}: {e}"));
    assert_eq!(stats.rows, rows.len() as u64, "{s}");
    out
}

#[test]
fn every_strategy_gives_identical_bits() {
    let fx = Fixture::qwen(6000, 11);
    let reader = fx.reader();
    for (what, rows) in row_lists(&fx) {
        let want = bits(&fx.reference(&rows));
        for &s in Strategy::ALL {
            assert_eq!(bits(&gather(&reader, s, &rows)), want, "{s}: {what}");
            // Once more, warm, with detailed stats on.
            let detailed = reader.clone().with_detailed_stats(true);
            assert_eq!(bits(&gather(&detailed, s, &rows)), want, "{s} warm: {what}");
        }
    }
}

#[test]
fn every_strategy_rejects_bad_ids_before_writing() {
    let fx = Fixture::qwen(1000, 3);
    let reader = fx.reader();
    let n = fx.table.n_rows;
    for &s in Strategy::ALL {
        for bad in [n, u64::MAX, i64::MIN as u64] {
            let rows = [0, bad, 1];
            let mut out = vec![7.0f32; rows.len() * reader.row_elems()];
            let e = reader.gather(s, &rows, &mut out).unwrap_err();
            assert!(
                matches!(e, GatherError::Table(TableError::RowOutOfRange { row, .. }) if row == bad),
                "{s}: {e}"
            );
            assert!(out.iter().all(|&x| x == 7.0), "{s}: output written");
        }
        let mut short = vec![0f32; 3];
        assert!(matches!(
            reader.gather(s, &[1], &mut short),
            Err(GatherError::OutputLength { .. })
        ));
    }
}

#[test]
fn eight_threads_gather_concurrently() {
    let fx = Fixture::qwen(20_000, 5);
    let reader = Arc::new(fx.reader().with_detailed_stats(true));
    let n = fx.table.n_rows;
    let lists: Vec<Vec<u64>> = (0..8u64)
        .map(|t| {
            let mut rng = Lcg(100 + t);
            (0..300).map(|_| rng.below(n)).collect()
        })
        .collect();
    let wants: Vec<Vec<u32>> = lists.iter().map(|l| bits(&fx.reference(l))).collect();
    std::thread::scope(|sc| {
        for (rows, want) in lists.iter().zip(&wants) {
            let reader = reader.clone();
            sc.spawn(move || {
                for round in 0..10 {
                    for &s in Strategy::ALL {
                        assert_eq!(&bits(&gather(&reader, s, rows)), want, "{s} round {round}");
                    }
                }
            });
        }
    });
}

#[test]
fn direct_strategies_report_a_truncated_file_as_an_error() {
    let fx = Fixture::qwen(3000, 4);
    let n = fx.table.n_rows;
    // Cut the file in the middle of the last row, after the model mapped it.
    let len = fx.file_len();
    fx.file
        .as_file()
        .set_len(len - fx.table.row_bytes / 2)
        .unwrap();
    // `auto` serves rows in the page cache from the mapping (it finds them
    // with mincore even in a fresh reader), so under truncation it behaves
    // like `fault`; only the strategies that never map are checked here.
    for &s in Strategy::ALL
        .iter()
        .filter(|s| !s.is_mapped() && **s != Strategy::Auto)
    {
        let reader = fx.reader();
        let mut out = vec![0f32; 2 * reader.row_elems()];
        let e = reader.gather(s, &[0, n - 1], &mut out).unwrap_err();
        assert!(matches!(e, GatherError::Read { .. }), "{s}: {e}");
        assert!(e.to_string().contains("offset"), "{s}: {e}");
    }
}

#[test]
fn direct_strategies_say_which_backend_read() {
    let fx = Fixture::qwen(3000, 4);
    let reader = fx.reader();
    let rows = [5u64, 1000, 5, 2999];
    let mut out = vec![0f32; rows.len() * reader.row_elems()];
    for &s in Strategy::ALL
        .iter()
        .filter(|s| !s.is_mapped() && **s != Strategy::Auto)
    {
        let st = reader.gather(s, &rows, &mut out).unwrap();
        assert_eq!(st.cold_rows, 4, "{s}");
        assert!(st.read_requests >= 3, "{s}: {st:?}");
        let backend = st.backend.unwrap_or_else(|| panic!("{s}: no backend"));
        // Only a fallback may name another backend than the strategy.
        assert!(backend == s.name() || st.fallback, "{s}: {st:?}");
    }
}

#[test]
fn auto_reads_cold_rows_then_maps_warm_ones() {
    let fx = Fixture::qwen(20_000, 8);
    let reader = fx.reader();
    let rows: Vec<u64> = (0..40).map(|k| k * 499 + 3).collect();
    let want = bits(&fx.reference(&rows));
    let mut out = vec![0f32; rows.len() * reader.row_elems()];
    let first = reader.gather(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!(bits(&out), want);
    // The file was just written, so its pages may still be cached: rows the
    // bitmap does not know are either read or found resident by mincore.
    assert_eq!(first.cold_rows + first.found_resident, 40, "{first:?}");
    assert!(reader.believed_resident_pages() >= 40);
    let second = reader.gather(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!(bits(&out), want);
    assert_eq!(
        (second.cold_rows, second.read_requests),
        (0, 0),
        "{second:?}"
    );
    // A clone shares what the reader learned; forgetting makes rows
    // unknown again, to be read or found in the page cache.
    let clone = reader.clone();
    clone.forget_residency();
    let third = reader.gather(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!(
        (third.cold_rows + third.found_resident, bits(&out)),
        (40, want)
    );
}

#[test]
fn auto_notices_external_eviction() {
    if sys::NOOP {
        eprintln!("skipped: the no-op OS layer cannot evict");
        return;
    }
    let fx = Fixture::qwen_on_disk(200_000, 9);
    let reader = fx.reader();
    let t = &fx.table;
    // 64 rows, each on its own page.
    let rows: Vec<u64> = (0..64).map(|k| k * (t.n_rows / 64) + 3).collect();
    let want = bits(&fx.reference(&rows));
    let mut out = vec![0f32; rows.len() * reader.row_elems()];
    for _ in 0..2 {
        reader.gather(Strategy::Auto, &rows, &mut out).unwrap();
    }
    let warm = reader.gather(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!((warm.cold_rows, warm.rearmed), (0, false), "{warm:?}");
    // Someone else evicts the table: our page-table entries go, then the
    // page cache's pages. `auto` is not told.
    let m = reader.mapping().unwrap();
    let range = t.offset..t.offset + t.bytes();
    let file = std::fs::File::open(fx.file.path()).unwrap();
    let mut left = u64::MAX;
    for _ in 0..100 {
        assert!(m.drop_resident(range.clone()));
        sys::evict(&file, range.clone()).unwrap();
        left = m.resident_pages(range.clone()).unwrap();
        if left <= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if left > 2 {
        eprintln!("skipped: {left} pages stayed resident (file system cannot evict)");
        return;
    }
    let after = reader.gather(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!(bits(&out), want);
    // The first window faulted; the rest of the batch was read as cold.
    assert!(after.rearmed, "{after:?}");
    assert!(after.cold_rows >= 48, "{after:?}");
    assert_eq!(
        after.backend.is_some(),
        after.read_requests > 0,
        "{after:?}"
    );
    // What was re-read is trusted again.
    let again = reader.gather(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!(bits(&out), want);
    assert_eq!((again.cold_rows, again.rearmed), (0, false), "{again:?}");
}
