//! How the strategies behave beyond their bytes (which the one tester,
//! `tester.rs`, checks): which backend served a direct gather, and how
//! `auto` learns, shares and forgets what is resident.

mod fetch_fixture;

use fetch_fixture::{bits, Fixture};
use pleio::sys;
use pleio::Strategy;
use pleio_testkit::skip;

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
        // Each strategy starts cold: where `shared` has no shared memory
        // (the no-op OS layer) it is served by the handle's private cache,
        // which `cached` just filled.
        reader.clear_cache();
        let st = reader.gather_with(s, &rows, &mut out).unwrap();
        assert_eq!(st.cold_rows, 4, "{s}");
        assert!(st.read_requests >= 3, "{s}: {st:?}");
        let backend = st.backend.unwrap_or_else(|| panic!("{s}: no backend"));
        // `cached` fills its cache through O_DIRECT io_uring. Only a
        // fallback may name another backend.
        let expect = match s {
            Strategy::Cached | Strategy::Shared => "uring-direct",
            s => s.name(),
        };
        assert!(backend == expect || st.fallback, "{s}: {st:?}");
    }
}

#[test]
fn auto_reads_cold_rows_then_maps_warm_ones() {
    let fx = Fixture::qwen(20_000, 8);
    let reader = fx.reader();
    let rows: Vec<u64> = (0..40).map(|k| k * 499 + 3).collect();
    let want = bits(&fx.reference(&rows));
    let mut out = vec![0f32; rows.len() * reader.row_elems()];
    let first = reader.gather_with(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!(bits(&out), want);
    // The file was just written, so its pages may still be cached: rows the
    // bitmap does not know are either read or found resident by mincore.
    assert_eq!(first.cold_rows + first.found_resident, 40, "{first:?}");
    assert!(reader.believed_resident_pages() >= 40);
    let second = reader.gather_with(Strategy::Auto, &rows, &mut out).unwrap();
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
    let third = reader.gather_with(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!(
        (third.cold_rows + third.found_resident, bits(&out)),
        (40, want)
    );
}

#[test]
fn auto_notices_external_eviction() {
    if sys::NOOP {
        skip!("the no-op OS layer cannot evict");
    }
    let fx = Fixture::qwen_on_disk(200_000, 9);
    let reader = fx.reader();
    let t = &fx.table;
    // 64 rows, each on its own page.
    let rows: Vec<u64> = (0..64).map(|k| k * (t.rows() / 64) + 3).collect();
    let want = bits(&fx.reference(&rows));
    let mut out = vec![0f32; rows.len() * reader.row_elems()];
    for _ in 0..2 {
        reader.gather_with(Strategy::Auto, &rows, &mut out).unwrap();
    }
    let warm = reader.gather_with(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!((warm.cold_rows, warm.rearmed), (0, false), "{warm:?}");
    // Someone else evicts the table: our page-table entries go, then the
    // page cache's pages. `auto` is not told.
    let m = reader.mapping().unwrap();
    let range = t.offset()..t.offset() + t.bytes();
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
        skip!("{left} pages stayed resident (the file system cannot evict)");
    }
    let after = reader.gather_with(Strategy::Auto, &rows, &mut out).unwrap();
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
    let again = reader.gather_with(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!(bits(&out), want);
    assert_eq!((again.cold_rows, again.rearmed), (0, false), "{again:?}");
}
