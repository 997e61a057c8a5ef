//! The read-span planner on arbitrary row lists and spans: never panics;
//! a plan for strictly ascending rows puts each row inside one span at its
//! staging offset, merges only rows within the allowed gap, keeps spans
//! sorted with disjoint ascending staging ranges, and validates as a plan
//! again; unsorted rows and overflow are errors, never wrong plans.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use pleio::io::{PlanError, ReadPlan, Span};

#[derive(Arbitrary, Debug)]
struct Input {
    base: u64,
    row_bytes: u32,
    rows: Vec<u64>,
    max_gap: u32,
    sort: bool,
    small: bool,
    spans: Vec<(u64, u32, u32)>,
}

fuzz_target!(|inp: Input| {
    let mut rows = inp.rows;
    let mut base = inp.base;
    let mut rb = inp.row_bytes as usize;
    if inp.small {
        base %= 1 << 20;
        rb %= 4096;
        for r in &mut rows {
            *r %= 1 << 16;
        }
    }
    if inp.sort {
        rows.sort_unstable();
        rows.dedup();
    }
    let gap = inp.max_gap as usize % (1 << 16);
    match ReadPlan::for_rows(base, rb, &rows, gap) {
        Err(PlanError::ZeroRowBytes) => assert_eq!(rb, 0),
        Err(PlanError::RowsUnsorted { index, .. }) => {
            assert!(index > 0 && rows[index] <= rows[index - 1]);
        }
        Err(PlanError::Overflow { .. }) => {}
        Err(e) => panic!("unexpected {e:?}"),
        Ok(reads) => {
            assert!(rb > 0);
            assert!(rows.windows(2).all(|w| w[0] < w[1]));
            let plan = &reads.plan;
            let spans = plan.spans();
            assert_eq!(reads.staging_offsets.len(), rows.len());
            for w in spans.windows(2) {
                assert!(w[0].file_end() <= w[1].file_offset, "{w:?}");
                // Spans apart by more than the gap: otherwise one span.
                assert!(w[1].file_offset - w[0].file_end() > gap as u64, "{w:?}");
                assert_eq!(w[0].dst_offset + w[0].len, w[1].dst_offset, "not packed");
            }
            let staging = plan.staging_len();
            assert_eq!(staging as u64, plan.bytes());
            for (&row, &at) in rows.iter().zip(&reads.staging_offsets) {
                let off = base + row * rb as u64;
                let s = spans
                    .iter()
                    .find(|s| s.file_offset <= off && off + rb as u64 <= s.file_end())
                    .unwrap_or_else(|| panic!("row {row} in no span"));
                assert_eq!(at, s.dst_offset + (off - s.file_offset) as usize);
                assert!(at + rb <= staging);
            }
            assert_eq!(ReadPlan::new(spans.to_vec()).as_ref(), Ok(plan));
        }
    }
    // Hand-made spans: validated, never trusted.
    let spans: Vec<Span> = inp
        .spans
        .iter()
        .map(|&(file_offset, len, dst)| Span {
            file_offset,
            len: len as usize,
            dst_offset: dst as usize,
        })
        .collect();
    if let Ok(plan) = ReadPlan::new(spans.clone()) {
        let end = spans
            .iter()
            .map(|s| s.dst_offset + s.len)
            .max()
            .unwrap_or(0);
        assert_eq!(
            plan.staging_len(),
            spans.last().map_or(0, |s| s.dst_offset + s.len)
        );
        assert!(plan.staging_len() <= end);
    }
    let _ = ReadPlan::packed(inp.spans.iter().map(|&(o, l, _)| (o, l as usize)));
});
