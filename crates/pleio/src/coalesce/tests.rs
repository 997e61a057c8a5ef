//! The coalescer against brute force: for every mode, the runs of a plan
//! are what marking every byte (page, block) of every extent on a bitmap
//! and cutting it where the mode's rule says gives, and every extent's
//! bytes land where [`Plan::at`] says.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// A byte of file `file` at `off`.
fn byte(file: usize, off: u64) -> u8 {
    ((off * 7 + off / 251 + file as u64 * 13) % 253) as u8
}

/// The staging image of `plan` (each run's bytes at its `dst`), checked
/// to be laid out back to back, file by file, by offset (the runs of one
/// file disjoint when the plan had one stream per file).
fn staged(plan: &Plan, disjoint: bool) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut prev: Option<(usize, u64, u64)> = None;
    for (k, r) in plan.runs().iter().enumerate() {
        assert_eq!(r.dst, buf.len(), "run {k} not back to back");
        assert!(r.start <= r.want && r.want <= r.end, "run {k}: {r:?}");
        if let Some((f, start, end)) = prev {
            let after = if disjoint { end } else { start };
            assert!(f < r.file || (f == r.file && after <= r.start), "run {k} order");
        }
        prev = Some((r.file, r.start, r.end));
        buf.extend((r.start..r.end).map(|o| byte(r.file, o)));
    }
    assert_eq!(buf.len(), plan.staging_len());
    let mut k = 0;
    for &(file, ref span) in plan.files() {
        assert_eq!(span.start, k);
        assert!(plan.runs()[span.clone()].iter().all(|r| r.file == file));
        k = span.end;
    }
    assert_eq!(k, plan.runs().len());
    buf
}

/// The runs brute force gives: every unit (`unit` bytes) any extent
/// touches marked per file, consecutive marked units cut where `split`
/// says, as `(file, start, end)` bytes.
fn brute(
    extents: &[(usize, u64, u64)],
    unit: u64,
    split: impl Fn(u64, u64) -> bool,
) -> Vec<(usize, u64, u64)> {
    let mut marked: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for &(f, off, len) in extents {
        let units = marked.entry(f).or_default();
        units.extend(off / unit..(off + len).div_ceil(unit));
    }
    let mut out = Vec::new();
    for (f, mut units) in marked {
        units.sort_unstable();
        units.dedup();
        let mut run: Option<(u64, u64)> = None;
        for u in units {
            run = match run {
                Some((a, last)) if !split(last, u) => Some((a, u)),
                Some((a, last)) => {
                    out.push((f, a * unit, (last + 1) * unit));
                    Some((u, u))
                }
                None => Some((u, u)),
            };
        }
        if let Some((a, last)) = run {
            out.push((f, a * unit, (last + 1) * unit));
        }
    }
    out
}

fn runs_of(plan: &Plan) -> Vec<(usize, u64, u64)> {
    plan.runs().iter().map(|r| (r.file, r.start, r.end)).collect()
}

/// Checks every extent's bytes at `at` in the image of `plan`.
fn check_landing(
    plan: &Plan,
    extents: &[(usize, u64, u64)],
    disjoint: bool,
) -> Result<(), TestCaseError> {
    let buf = staged(plan, disjoint);
    prop_assert_eq!(plan.at().len(), extents.len());
    for (i, (&(f, off, len), &at)) in extents.iter().zip(plan.at()).enumerate() {
        let want: Vec<u8> = (off..off + len).map(|o| byte(f, o)).collect();
        prop_assert_eq!(&buf[at..at + len as usize], &want[..], "extent {}", i);
    }
    Ok(())
}

/// Sorted extents of up to three files (overlaps and duplicates allowed).
fn extents() -> impl Strategy<Value = Vec<(usize, u64, u64)>> {
    prop::collection::vec((0usize..3, 0u64..40_000, 1u64..9_000), 0..60).prop_map(|mut v| {
        v.sort_unstable();
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn gap_mode_is_brute_force(ext in extents(), max_gap in prop_oneof![Just(0u64), 0u64..5_000]) {
        let mut p = Plan::new();
        p.sorted(Mode::Gap { max_gap }, ext.iter().copied()).unwrap();
        // Consecutive covered bytes stay in one run when at most
        // `max_gap` bytes lie between them.
        prop_assert_eq!(runs_of(&p), brute(&ext, 1, |a, b| b - a - 1 > max_gap));
        check_landing(&p, &ext, true)?;
    }

    #[test]
    fn page_mode_is_brute_force(ext in extents(), page in prop_oneof![Just(512u64), Just(4096)]) {
        let mut p = Plan::new();
        p.sorted(Mode::Page { page }, ext.iter().copied()).unwrap();
        // Touching pages are one run.
        prop_assert_eq!(runs_of(&p), brute(&ext, page, |a, b| b > a + 1));
        check_landing(&p, &ext, true)?;
        // merge_sorted gives the same runs from unsorted page ranges.
        for f in 0..3 {
            let mut ranges: Vec<_> = ext
                .iter()
                .rev()
                .filter(|e| e.0 == f)
                .map(|&(_, o, l)| Mode::Page { page }.widen(o, l).unwrap())
                .collect();
            merge_sorted(&mut ranges, Mode::Page { page });
            let want: Vec<_> = runs_of(&p)
                .into_iter()
                .filter(|r| r.0 == f)
                .map(|r| r.1..r.2)
                .collect();
            prop_assert_eq!(ranges, want);
        }
    }

    #[test]
    fn block_mode_is_brute_force(
        ext in extents(),
        block in prop_oneof![Just(512u64), Just(4096)],
        pages in 1u64..4,
    ) {
        let page = block * pages;
        let mut p = Plan::new();
        p.sorted(Mode::Block { block, page }, ext.iter().copied()).unwrap();
        // A block joins the run before it when its page is that run's last
        // page or the next.
        let per = page / block;
        prop_assert_eq!(runs_of(&p), brute(&ext, block, |a, b| b / per > a / per + 1));
        check_landing(&p, &ext, true)?;
        // `want` ends at the last byte an extent wants.
        for r in p.runs() {
            let want = ext
                .iter()
                .filter(|e| e.0 == r.file && r.start <= e.1 && e.1 < r.end)
                .map(|e| e.1 + e.2)
                .max()
                .unwrap();
            prop_assert_eq!(r.want, want);
        }
    }

    /// Streams interleaved (rows of a checkpoint, one region per part):
    /// each stream coalesces on its own, `grow` predicts what `push` adds,
    /// and the plan is the sorted plan of each stream's extents.
    #[test]
    fn streams_plan_each_stream_and_grow_is_exact(
        rows in prop::collection::btree_set(0u64..3_000, 0..80),
        block in prop_oneof![Just(1u64), Just(512), Just(4096)],
    ) {
        // Three regions: two in file 0 (one right after the other), one
        // in file 1; rows of 90, 8 and 36 bytes.
        let regions = [(0usize, 1000u64, 90u64), (0, 1000 + 3000 * 90, 8), (1, 77, 36)];
        let mode = Mode::Block { block, page: block };
        let mut p = Plan::new();
        p.start(mode);
        let mut pushed = Vec::new();
        let mut used = 0u64;
        for &r in &rows {
            for (k, &(f, base, len)) in regions.iter().enumerate() {
                let off = base + r * len;
                let grow = p.grow(k, f, off, len).unwrap();
                let before: u64 = p.runs().iter().map(Run::len).sum();
                p.push(k, f, off, len).unwrap();
                let after: u64 = p.runs().iter().map(Run::len).sum();
                prop_assert_eq!(after - before, grow);
                used += grow;
                pushed.push((f, off, len, k));
            }
        }
        p.finish().unwrap();
        prop_assert_eq!(p.staging_len() as u64, used);
        let ext: Vec<_> = pushed.iter().map(|&(f, o, l, _)| (f, o, l)).collect();
        // Two regions may share a block: their runs may overlap.
        check_landing(&p, &ext, false)?;
        // Each stream alone, sorted: the same runs.
        let mut want = Vec::new();
        for k in 0..regions.len() {
            let mut one = Plan::new();
            one.sorted(mode, pushed.iter().filter(|e| e.3 == k).map(|&(f, o, l, _)| (f, o, l)))
                .unwrap();
            want.extend(runs_of(&one));
        }
        want.sort_unstable();
        let mut got = runs_of(&p);
        got.sort_unstable();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn plans_reuse_storage_and_refuse_bad_input() {
    let ext: Vec<(usize, u64, u64)> = (0..1792u64).map(|i| (0, i * 7919 % 90_000, 90)).collect();
    let mut sorted = ext.clone();
    sorted.sort_unstable();
    let modes = [
        Mode::Gap { max_gap: 0 },
        Mode::Page { page: 4096 },
        Mode::Block {
            block: 512,
            page: 4096,
        },
    ];
    let mut p = Plan::new();
    for mode in modes {
        p.sorted(mode, sorted.iter().copied()).unwrap();
    }
    let caps = |p: &Plan| {
        (
            p.runs.capacity(),
            p.landed.capacity(),
            p.at.capacity(),
            p.order.capacity(),
            p.files.capacity(),
        )
    };
    let before = caps(&p);
    for mode in modes {
        p.sorted(mode, sorted.iter().copied()).unwrap();
        assert_eq!(caps(&p), before, "{mode:?}");
    }
    assert_eq!(
        p.sorted(Mode::Gap { max_gap: 0 }, [(0, 10, 1), (0, 9, 1)]),
        Err(CoalesceError::Unsorted {
            index: 1,
            offset: 9
        })
    );
    assert_eq!(
        p.sorted(Mode::Gap { max_gap: 0 }, [(1, 10, 1), (0, 90, 1)]),
        Err(CoalesceError::Unsorted {
            index: 1,
            offset: 90
        })
    );
    assert_eq!(
        p.sorted(Mode::Gap { max_gap: 0 }, [(0, u64::MAX, 2)]),
        Err(CoalesceError::Overflow { index: 0 })
    );
    assert_eq!(
        p.sorted(
            Mode::Block {
                block: 4096,
                page: 4096
            },
            [(0, u64::MAX - 10, 2)]
        ),
        Err(CoalesceError::Overflow { index: 0 })
    );
}

#[test]
fn runs_never_span_files() {
    // File 0 ends where file 1 starts, at the same offsets: two runs.
    let mut p = Plan::new();
    p.sorted(Mode::Gap { max_gap: 1 << 20 }, [(0, 0, 10), (1, 10, 10)])
        .unwrap();
    assert_eq!(runs_of(&p), [(0, 0, 10), (1, 10, 20)]);
    assert_eq!(p.at(), [0, 10]);
    assert_eq!(p.files(), [(0, 0..1), (1, 1..2)]);
}
