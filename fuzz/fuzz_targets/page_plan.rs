//! The page planner on arbitrary tables, row ids and bounds: never panics,
//! every run is non-empty, page-aligned, inside one retained fragment and
//! short of the tensor's, lazy range's and file's end, runs are sorted and
//! disjoint within a chunk, chunks hold at most `CHUNK_ROWS` rows, and
//! every byte of every planned row that may be read is covered.
#![no_main]

use std::ops::Range;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use pleio::coalesce::page::{Bounds, Planner, RowSpan, CHUNK_ROWS};

#[derive(Arbitrary, Debug)]
struct Input {
    offset: u64,
    row_bytes: u64,
    n_rows: u64,
    page_shift: u8,
    lazy: (u64, u64),
    file_len: u64,
    retained: Vec<(u64, u64)>,
    ids: Vec<u64>,
    small: bool,
}

/// Sorted, merged copy of `runs`.
fn merged(mut runs: Vec<Range<u64>>) -> Vec<Range<u64>> {
    runs.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::new();
    for r in runs {
        match out.last_mut() {
            Some(l) if r.start <= l.end => l.end = l.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

fuzz_target!(|inp: Input| {
    // A power of two, as the OS gives.
    let page = 1u64 << (9 + inp.page_shift % 8);
    let mut span = RowSpan {
        offset: inp.offset,
        row_bytes: inp.row_bytes,
        n_rows: inp.n_rows,
    };
    let mut ids = inp.ids;
    if inp.small {
        // Keep some inputs in a range where rows land on shared pages.
        span.offset %= 1 << 20;
        span.row_bytes %= 1 << 12;
        span.n_rows %= 1 << 16;
        for id in &mut ids {
            *id %= 1 << 17;
        }
    }
    // The mapping's invariant: sorted, disjoint, page-aligned starts.
    let retained = merged(
        inp.retained
            .iter()
            .map(|&(a, b)| a - a % page..b)
            .filter(|r| r.start < r.end)
            .collect(),
    );
    let lazy = inp.lazy.0.min(inp.lazy.1)..inp.lazy.0.max(inp.lazy.1);
    let bounds = Bounds {
        page,
        lazy: lazy.clone(),
        file_len: inp.file_len,
        retained: &retained,
    };
    let mut p = Planner::new();
    let sum = p.plan(span, &ids, &bounds);
    assert_eq!(sum.rows + sum.skipped, ids.len() as u64);
    assert_eq!(sum.chunks, sum.rows.div_ceil(CHUNK_ROWS as u64));
    assert_eq!(sum.runs, p.runs().len() as u64);
    let limit = span.end().min(lazy.end).min(inp.file_len);
    for chunk in p.chunks() {
        for w in chunk.windows(2) {
            assert!(w[0].end <= w[1].start, "chunk not sorted/disjoint: {w:?}");
        }
        for r in chunk {
            assert!(r.start < r.end, "empty run {r:?}");
            assert_eq!(r.start % page, 0, "run {r:?} off page");
            assert!(r.end <= limit, "run {r:?} past {limit}");
            assert!(
                retained
                    .iter()
                    .any(|f| f.start <= r.start && r.end <= f.end),
                "run {r:?} outside the retained fragments"
            );
        }
    }
    // Coverage: each planned row's readable bytes lie in the runs.
    let all = merged(p.runs().to_vec());
    for &id in &ids {
        let Some(row) = span.row(id) else { continue };
        for f in &retained {
            let s = row.start.max(lazy.start).max(f.start);
            let e = row.end.min(limit).min(f.end);
            if s < e {
                let i = all.partition_point(|r| r.end <= s);
                assert!(
                    all.get(i).is_some_and(|r| r.start <= s && e <= r.end),
                    "row {id} bytes {s}..{e} not covered"
                );
            }
        }
    }
    // Distinct pages: enough for the bytes covered, no more than the runs'.
    let pages = p.distinct_pages();
    let bytes: u64 = all.iter().map(|r| r.end - r.start).sum();
    assert!(u128::from(pages) * u128::from(page) >= u128::from(bytes));
    let per_run: u64 = p
        .runs()
        .iter()
        .map(|r| r.end.div_ceil(page) - r.start / page)
        .sum();
    assert!(pages <= per_run, "{pages} > {per_run}");
});
