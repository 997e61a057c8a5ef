//! How the strategies behave beyond their bytes (which the one tester,
//! `tester.rs`, checks): which backend served a direct gather, and how
//! `auto` learns, shares and forgets what is resident.

mod fetch_fixture;

use fetch_fixture::{bits, CkptFixture, Fixture};
use pleio::sys;
use pleio::Strategy;
use pleio_lab::synth_ckpt::CkptEncoding;
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
    let fx = Fixture::qwen_on_disk(200_000, 9);
    let t = &fx.table;
    // 64 rows, each on its own page.
    let rows: Vec<u64> = (0..64).map(|k| k * (t.rows() / 64) + 3).collect();
    notices_eviction(&fx.reader(), &rows, &bits(&fx.reference(&rows)));
}

#[test]
fn auto_notices_external_eviction_on_a_checkpoint_of_several_parts_and_files() {
    // MLX 4-bit: three parts a row, 8 shards over 4 files. `auto` finds a
    // checkpoint batch's extents once and tests residency from them.
    let fx = CkptFixture::new(CkptEncoding::Mlx4, 200_000, 8, 4, 21);
    let rows: Vec<u64> = (0..64).map(|k| k * (fx.rows / 64) + 5).collect();
    let want = bits(&fx.reference(&rows));
    notices_eviction(&fx.reader(), &rows, &want);
    // Half the rows known to a fresh view of the table: windows mix rows
    // believed resident with rows probed and learned.
    let fresh = fx.reader();
    let mut out = vec![0f32; rows.len() * fresh.row_elems()];
    let half: Vec<u64> = rows.iter().step_by(2).copied().collect();
    fresh
        .gather_with(Strategy::Auto, &half, &mut out[..half.len() * 160])
        .unwrap();
    let mixed = fresh.gather_with(Strategy::Auto, &rows, &mut out).unwrap();
    assert_eq!(bits(&out), want, "{mixed:?}");
}

/// Warms `rows` (whose reference bits are `want`) through `reader` with
/// `auto`, has someone else evict the table, and checks that the next
/// batch notices (the first window faulted, the rest was read as cold),
/// that every batch is exact, and that what was re-read is trusted again.
fn notices_eviction(reader: &pleio::Table, rows: &[u64], want: &[u32]) {
    if sys::NOOP {
        skip!("the no-op OS layer cannot evict");
    }
    let mut out = vec![0f32; rows.len() * reader.row_elems()];
    for _ in 0..2 {
        reader.gather_with(Strategy::Auto, rows, &mut out).unwrap();
        assert_eq!(bits(&out), want);
    }
    let warm = reader.gather_with(Strategy::Auto, rows, &mut out).unwrap();
    // Believed resident, every one: nothing read, nothing probed.
    assert_eq!(
        (warm.cold_rows, warm.found_resident, warm.rearmed),
        (0, 0, false),
        "{warm:?}"
    );
    // Our page-table entries go, then the page cache's pages. `auto` is
    // not told.
    let left = evict_every_file(reader);
    if left > 2 {
        skip!("{left} pages stayed resident (the file system cannot evict)");
    }
    let after = reader.gather_with(Strategy::Auto, rows, &mut out).unwrap();
    assert_eq!(bits(&out), want);
    assert!(after.rearmed, "{after:?}");
    assert!(after.cold_rows >= 48, "{after:?}");
    assert_eq!(
        after.backend.is_some(),
        after.read_requests > 0,
        "{after:?}"
    );
    let again = reader.gather_with(Strategy::Auto, rows, &mut out).unwrap();
    assert_eq!(bits(&out), want);
    assert_eq!(
        (again.cold_rows, again.found_resident, again.rearmed),
        (0, 0, false),
        "{again:?}"
    );
}

/// Drops this process's page-table entries of every file of `reader`'s
/// table, whole (the page cache may keep a large folio that a region's
/// range only cuts into), then evicts the files' pages, retrying while
/// more than 2 stay; returns the pages left resident.
fn evict_every_file(reader: &pleio::Table) -> u64 {
    let mut files: Vec<usize> = reader.layout().regions().map(|r| r.file).collect();
    files.sort_unstable();
    files.dedup();
    let mut left = u64::MAX;
    for _ in 0..100 {
        left = 0;
        for &f in &files {
            let m = reader.mapping_of(f).unwrap();
            let file = std::fs::File::open(reader.file_path(f)).unwrap();
            // Just written: dirty pages cannot be evicted until written back.
            file.sync_all().unwrap();
            let all = 0..m.len() as u64;
            assert!(m.drop_resident(all.clone()));
            sys::evict(&file, all.clone()).unwrap();
            left += m.resident_pages(all).unwrap();
        }
        if left <= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    left
}
