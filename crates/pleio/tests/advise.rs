//! Validation of the `advise` strategy, mirroring the reference design's:
//! a recording OS layer checks that every advised range is page-aligned,
//! inside the PLE tensor and inside a retained fragment, whatever the rows.

mod fetch_fixture;

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

use fetch_fixture::{bits, Fixture, Rng};
use pleio::coalesce::page::CHUNK_ROWS;
use pleio::fetch::GatherError;
use pleio::map::Mapping;
use pleio::model::Model;
use pleio::sys::{self, Advisor, RecordingAdvisor};
use pleio::{ErrorKind, GatherStats, Strategy, Table};

/// A reader whose advice goes to a fresh recorder (which then forwards to
/// the real OS layer, or not at all).
fn recorded(fx: &Fixture, forward: bool) -> (Table, Arc<RecordingAdvisor>) {
    let inner = forward.then(sys::os_advisor);
    let rec = Arc::new(RecordingAdvisor::new(inner));
    let reader = fx
        .reader()
        .with_advisor(rec.clone())
        .with_detailed_stats(true);
    (reader, rec)
}

/// Advised ranges as file byte ranges.
fn advised(rec: &RecordingAdvisor, m: &Mapping) -> Vec<Range<u64>> {
    let base = m.base_addr();
    rec.will_need_runs()
        .iter()
        .map(|r| {
            let s = (r.addr - base) as u64;
            s..s + r.len as u64
        })
        .collect()
}

/// The checks `strace -e madvise,process_madvise` would make by eye.
fn assert_well_formed(rec: &RecordingAdvisor, fx: &Fixture, m: &Mapping) -> Vec<Range<u64>> {
    let page = m.page_size();
    let t = &fx.table;
    let tensor = t.offset()..t.offset() + t.bytes();
    let runs = advised(rec, m);
    for r in &runs {
        assert!(r.start < r.end, "{r:?} empty");
        assert_eq!(r.start % page, 0, "{r:?} not page-aligned");
        assert!(
            r.end % page == 0 || r.end == tensor.end,
            "{r:?} ends neither on a page nor at the tensor end"
        );
        assert!(
            r.start >= tensor.start / page * page && r.end <= tensor.end,
            "{r:?} outside the PLE tensor {tensor:?}"
        );
        assert!(
            m.retained()
                .iter()
                .any(|f| f.start <= r.start && r.end <= f.end),
            "{r:?} outside the retained fragments {:?}",
            m.retained()
        );
    }
    runs
}

fn gather(reader: &Table, rows: &[u64]) -> (Vec<f32>, GatherStats) {
    let mut out = vec![0f32; rows.len() * reader.row_elems()];
    let st = reader
        .gather_with(Strategy::Advise, rows, &mut out)
        .unwrap();
    (out, st)
}

fn covers(runs: &[Range<u64>], bytes: Range<u64>) -> bool {
    runs.iter()
        .any(|r| r.start <= bytes.start && bytes.end <= r.end)
}

#[test]
fn out_of_bounds_and_negative_equivalent_ids_fail_before_any_advice() {
    let fx = Fixture::qwen(2000, 1);
    let (reader, rec) = recorded(&fx, false);
    let n = fx.table.rows();
    for bad in [n, n + 1, u64::MAX, (-1i64) as u64, i64::MIN as u64] {
        let mut out = vec![0f32; 2 * reader.row_elems()];
        let e = reader
            .gather_with(Strategy::Advise, &[5, bad], &mut out)
            .unwrap_err();
        assert_eq!((e.kind(), e.row()), (ErrorKind::RowOutOfRange, Some(bad)));
    }
    assert_eq!(rec.will_need_calls(), 0, "a bad batch advised something");
}

#[test]
fn last_row_ending_mid_page_at_eof() {
    // 5008 rows of 90 bytes are a whole number of 32-byte alignment units,
    // so the writer adds no padding after the table.
    let fx = Fixture::qwen(5008, 2);
    let page = sys::page_size();
    let t = &fx.table;
    let end = t.offset() + t.bytes();
    assert_eq!(end, fx.file_len(), "fixture: the table must end the file");
    assert_ne!(end % page, 0, "fixture: the file must end mid-page");
    let (reader, rec) = recorded(&fx, true);
    let rows = [t.rows() - 1];
    let (out, st) = gather(&reader, &rows);
    assert_eq!(bits(&out), bits(&fx.reference(&rows)));
    let runs = assert_well_formed(&rec, &fx, reader.mapping().unwrap());
    assert_eq!(runs, vec![(end - t.row_bytes()) / page * page..end]);
    assert_eq!(st.advice_failures, 0);
}

#[test]
fn straddling_rows_get_both_pages() {
    let fx = Fixture::qwen(3000, 3);
    let page = sys::page_size();
    let t = &fx.table;
    let (reader, rec) = recorded(&fx, true);
    for row in fx.straddlers(page, 5) {
        rec.clear();
        let (out, st) = gather(&reader, &[row]);
        assert_eq!(bits(&out), bits(&fx.reference(&[row])));
        let runs = assert_well_formed(&rec, &fx, reader.mapping().unwrap());
        let s = t.offset() + row * t.row_bytes();
        assert_eq!(
            runs,
            vec![s / page * page..(s / page + 2) * page],
            "row {row}"
        );
        assert_eq!(st.pages, Some(2));
    }
}

#[test]
fn duplicates_and_overlapping_rows_merge_into_sorted_disjoint_runs() {
    let fx = Fixture::qwen(3000, 4);
    let (reader, rec) = recorded(&fx, false);
    let rows = [10, 10, 11, 12, 10, 2900, 11, 45, 46, 47, 2900];
    let (out, st) = gather(&reader, &rows);
    assert_eq!(bits(&out), bits(&fx.reference(&rows)));
    let runs = assert_well_formed(&rec, &fx, reader.mapping().unwrap());
    assert!(runs.windows(2).all(|w| w[0].end < w[1].start), "{runs:?}");
    assert_eq!(st.runs_advised, runs.len() as u64);
    let t = &fx.table;
    for &r in &rows {
        let s = t.offset() + r * t.row_bytes();
        assert!(covers(&runs, s..s + t.row_bytes()), "row {r}");
    }
}

#[test]
fn one_advice_call_per_chunk_of_256_rows() {
    let fx = Fixture::qwen(50_000, 5);
    let (reader, rec) = recorded(&fx, false);
    let mut rng = Rng::new(9);
    let rows: Vec<u64> = (0..600).map(|_| rng.below(fx.table.rows())).collect();
    let (out, st) = gather(&reader, &rows);
    assert_eq!(bits(&out), bits(&fx.reference(&rows)));
    assert_eq!(
        rec.will_need_calls(),
        rows.len().div_ceil(CHUNK_ROWS) as u64
    );
    assert_well_formed(&rec, &fx, reader.mapping().unwrap());
    assert_eq!(st.runs_advised, rec.will_need_runs().len() as u64);
    assert!(st.pages.unwrap() >= 1);
}

#[test]
fn unmapped_fragment_is_never_advised_nor_read() {
    let fx = Fixture::qwen(20_000, 6);
    let page = sys::page_size();
    let t = fx.table.clone();
    let mut model = Model::open(fx.file.path()).unwrap();
    // Unmap whole pages in the middle of the table.
    let mid = t.offset() + t.bytes() / 2;
    let hole = model
        .unmap_fragment(t.shard(), mid, mid + 5 * page)
        .unwrap()
        .unwrap()
        .unwrap();
    let rec = Arc::new(RecordingAdvisor::new(Some(sys::os_advisor())));
    let reader = Table::from_model(Arc::new(model))
        .unwrap()
        .with_advisor(rec.clone());
    let m = reader.mapping().unwrap();
    let row_of = |off: u64| (off - t.offset()) / t.row_bytes();
    let inside = |r: u64| {
        let s = t.offset() + r * t.row_bytes();
        s < hole.end && hole.start < s + t.row_bytes()
    };
    // Rows next to the hole (one straddles its start), but none in it.
    let first_in = row_of(hole.start);
    let ok_rows: Vec<u64> = (first_in.saturating_sub(60)..first_in)
        .chain(row_of(hole.end) + 1..row_of(hole.end) + 60)
        .filter(|&r| !inside(r))
        .collect();
    let (out, _) = gather(&reader, &ok_rows);
    assert_eq!(bits(&out), bits(&fx.reference(&ok_rows)));
    // Rows in the hole: an error, not a fault on unmapped memory.
    let rows = [first_in.saturating_sub(1), first_in + 1];
    let mut out = vec![0f32; rows.len() * reader.row_elems()];
    let e = reader
        .gather_with(Strategy::Advise, &rows, &mut out)
        .unwrap_err();
    let unmapped = |e: &pleio::Error| {
        matches!(
            e.inner().downcast_ref::<GatherError>(),
            Some(GatherError::Unmapped { .. })
        )
    };
    assert!(unmapped(&e), "{e}");
    let e = reader
        .gather_with(Strategy::Fault, &rows, &mut out)
        .unwrap_err();
    assert!(unmapped(&e), "{e}");
    // Nothing advised ever touched the hole.
    let runs = advised(&rec, m);
    assert!(!runs.is_empty());
    for r in &runs {
        assert!(
            r.end <= hole.start || hole.end <= r.start,
            "{r:?} in hole {hole:?}"
        );
        assert!(m
            .retained()
            .iter()
            .any(|f| f.start <= r.start && r.end <= f.end));
        assert_eq!(r.start % page, 0);
    }
}

#[test]
fn injected_advice_failure_is_counted_and_the_gather_stays_exact() {
    let fx = Fixture::qwen(10_000, 7);
    let rec = Arc::new(RecordingAdvisor::failing());
    let reader = fx.reader().with_advisor(rec.clone());
    let mut rng = Rng::new(3);
    let rows: Vec<u64> = (0..300).map(|_| rng.below(fx.table.rows())).collect();
    let (out, st) = gather(&reader, &rows);
    assert_eq!(bits(&out), bits(&fx.reference(&rows)));
    assert!(st.runs_advised > 0);
    assert_eq!(st.advice_failures, st.runs_advised);
}

#[test]
fn os_layer_advice_matches_the_build() {
    let fx = Fixture::qwen(10_000, 8);
    let reader = fx.reader().with_detailed_stats(true);
    let rows: Vec<u64> = (0..100).map(|i| i * 97).collect();
    let (out, st) = gather(&reader, &rows);
    assert_eq!(bits(&out), bits(&fx.reference(&rows)));
    if sys::NOOP {
        // The forced no-op build (`--features noop-os`): nothing advised,
        // nothing counted, the gather still exact.
        assert_eq!(st.advice_syscalls, 0);
        assert_eq!(st.advice_failures, 0);
        assert_eq!(st.major_faults, None);
        let m = reader.mapping().unwrap();
        assert!(!m.drop_resident(0..m.len() as u64));
        assert!(sys::evict(&File::open(fx.file.path()).unwrap(), 0..1).is_err());
    } else {
        assert!(st.advice_syscalls >= 1);
        assert_eq!(st.advice_failures, 0, "the kernel refused aligned advice");
        assert!(st.major_faults.is_some());
    }
    assert_eq!(sys::OsAdvisor::default().will_need(&[]).failures, 0);
}
