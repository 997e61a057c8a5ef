//! Page mode of the coalescer: row ids to page runs, which pages a batch
//! will touch (for `madvise`).
//!
//! Pure (no I/O) and allocation-free per call once its reused scratch has
//! grown to the batch size ([`Planner::with_capacity`] reserves up front).
//! The page size is a parameter (read from the OS by callers, never a
//! literal).
//!
//! For each chunk of at most [`CHUNK_ROWS`] in-range row ids, as the
//! reference design did: each row's byte span is clipped to the lazy range
//! and the file, rounded out to whole pages (a row straddling a page
//! boundary gives both pages), its end clamped to the tensor, lazy range and
//! file end; the chunk's runs are sorted, overlapping and adjacent runs
//! merged, and the result cut to the retained fragments of the mapping.
//! Every emitted run starts on a page boundary; its end is a page boundary
//! or the clamp.

use std::ops::Range;

use super::{merge_sorted, Mode};

/// Most row ids one chunk of runs covers (and so one advice batch).
pub const CHUNK_ROWS: usize = 256;

/// Where a tensor's rows lie in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSpan {
    /// Absolute offset of row 0.
    pub offset: u64,
    /// Bytes per row.
    pub row_bytes: u64,
    /// Number of rows.
    pub n_rows: u64,
}

impl RowSpan {
    /// Byte span of `row`, or `None` if the id is outside the tensor.
    pub fn row(&self, row: u64) -> Option<Range<u64>> {
        if row >= self.n_rows || self.row_bytes == 0 {
            return None;
        }
        let start = self.offset.checked_add(row.checked_mul(self.row_bytes)?)?;
        Some(start..start.checked_add(self.row_bytes)?)
    }

    /// End of the tensor's bytes (saturating).
    pub fn end(&self) -> u64 {
        self.offset
            .saturating_add(self.n_rows.saturating_mul(self.row_bytes))
    }
}

/// What a plan may cover.
#[derive(Debug, Clone)]
pub struct Bounds<'a> {
    /// Page size in bytes (a power of two, from the OS).
    pub page: u64,
    /// The lazy range holding the tensor.
    pub lazy: Range<u64>,
    /// File length.
    pub file_len: u64,
    /// Fragments of the file still mapped: sorted, disjoint, starts
    /// page-aligned.
    pub retained: &'a [Range<u64>],
}

/// Counts from one [`Planner::plan`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanSummary {
    /// Row ids planned (inside the tensor; duplicates counted).
    pub rows: u64,
    /// Row ids skipped (outside the tensor).
    pub skipped: u64,
    /// Runs emitted over all chunks.
    pub runs: u64,
    /// Chunks emitted.
    pub chunks: u64,
}

/// Reused scratch for planning; one per thread of gathers.
#[derive(Debug, Default, Clone)]
pub struct Planner {
    /// Every chunk's runs, back to back.
    runs: Vec<Range<u64>>,
    /// End index in `runs` of each chunk.
    chunk_ends: Vec<usize>,
    /// One chunk's unmerged runs.
    tmp: Vec<Range<u64>>,
    /// All runs merged across chunks (for `distinct_pages`).
    merged: Vec<Range<u64>>,
    page: u64,
}

fn floor_to(x: u64, page: u64) -> u64 {
    x - x % page
}

fn ceil_to(x: u64, page: u64) -> u64 {
    x.div_ceil(page).saturating_mul(page)
}

impl Planner {
    /// An empty planner (its scratch grows on first use).
    pub fn new() -> Planner {
        Planner::default()
    }

    /// A planner whose scratch already holds batches of `rows` row ids, so
    /// no call with at most that many ids allocates.
    pub fn with_capacity(rows: usize) -> Planner {
        let chunk = rows.min(CHUNK_ROWS);
        Planner {
            runs: Vec::with_capacity(rows),
            chunk_ends: Vec::with_capacity(rows.div_ceil(CHUNK_ROWS)),
            tmp: Vec::with_capacity(chunk),
            merged: Vec::with_capacity(rows),
            page: 0,
        }
    }

    /// Plans the pages of `ids` of `span` within `bounds`, replacing the
    /// previous plan. Ids outside the tensor are skipped (and counted).
    pub fn plan(&mut self, span: RowSpan, ids: &[u64], bounds: &Bounds<'_>) -> PlanSummary {
        self.runs.clear();
        self.chunk_ends.clear();
        self.tmp.clear();
        self.page = bounds.page.max(1);
        let page = self.page;
        // Nothing is emitted past this byte.
        let limit = span.end().min(bounds.lazy.end).min(bounds.file_len);
        let mut summary = PlanSummary::default();
        let mut in_chunk = 0;
        for &id in ids {
            let Some(row) = span.row(id) else {
                summary.skipped += 1;
                continue;
            };
            summary.rows += 1;
            in_chunk += 1;
            let s = row.start.max(bounds.lazy.start);
            let e = row.end.min(limit);
            if s < e {
                self.tmp
                    .push(floor_to(s, page)..ceil_to(e, page).min(limit));
            }
            if in_chunk == CHUNK_ROWS {
                self.finish_chunk(bounds.retained);
                in_chunk = 0;
            }
        }
        if in_chunk > 0 {
            self.finish_chunk(bounds.retained);
        }
        summary.runs = self.runs.len() as u64;
        summary.chunks = self.chunk_ends.len() as u64;
        summary
    }

    /// Sorts and merges the chunk's runs, cuts them to the retained
    /// fragments and appends them as one chunk.
    fn finish_chunk(&mut self, retained: &[Range<u64>]) {
        merge_sorted(&mut self.tmp, Mode::Page { page: self.page });
        let mut fi = 0;
        for r in self.tmp.drain(..) {
            // Runs are sorted, so the fragment cursor only moves forward.
            while fi < retained.len() && retained[fi].end <= r.start {
                fi += 1;
            }
            for f in &retained[fi..] {
                if f.start >= r.end {
                    break;
                }
                let s = r.start.max(f.start);
                let e = r.end.min(f.end);
                if s < e {
                    self.runs.push(s..e);
                }
            }
        }
        self.chunk_ends.push(self.runs.len());
    }

    /// The runs of the last plan, chunk by chunk: each chunk sorted,
    /// disjoint, page-aligned, covering at most [`CHUNK_ROWS`] ids. A chunk
    /// may be empty (its rows were all unmapped or outside the lazy range).
    pub fn chunks(&self) -> impl Iterator<Item = &[Range<u64>]> + '_ {
        let mut start = 0;
        self.chunk_ends.iter().map(move |&end| {
            let c = &self.runs[start..end];
            start = end;
            c
        })
    }

    /// All runs of the last plan (chunks back to back).
    pub fn runs(&self) -> &[Range<u64>] {
        &self.runs
    }

    /// Distinct pages the last plan covers (across chunks).
    pub fn distinct_pages(&mut self) -> u64 {
        self.merged.clear();
        self.merged.extend_from_slice(&self.runs);
        merge_sorted(&mut self.merged, Mode::Page { page: self.page });
        let page = self.page.max(1);
        self.merged
            .iter()
            .map(|r| r.end.div_ceil(page) - r.start / page)
            .sum()
    }
}

#[cfg(test)]
// Single ranges are what these tests are about.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: u64 = 4096;

    fn plan(span: RowSpan, ids: &[u64], b: &Bounds<'_>) -> (Planner, PlanSummary) {
        let mut p = Planner::new();
        let s = p.plan(span, ids, b);
        (p, s)
    }

    fn whole(file_len: u64) -> Vec<Range<u64>> {
        vec![0..file_len]
    }

    #[test]
    fn straddling_row_gives_both_pages() {
        // Row 45 of 90-byte rows at offset 0 spans 4050..4140.
        let span = RowSpan {
            offset: 0,
            row_bytes: 90,
            n_rows: 1000,
        };
        let r = whole(90_000);
        let b = Bounds {
            page: P,
            lazy: 0..90_000,
            file_len: 90_000,
            retained: &r,
        };
        let (mut p, s) = plan(span, &[45], &b);
        assert_eq!(s.rows, 1);
        assert_eq!(p.runs(), &[0..2 * P]);
        assert_eq!(p.distinct_pages(), 2);
    }

    /// Found by the `page_plan` fuzz target: a run ending in the last,
    /// partial page of the address space was counted one page short
    /// (rounding its end up to a page saturated).
    #[test]
    fn counts_the_last_partial_page_of_the_address_space() {
        const BIG: u64 = 1 << 16;
        let span = RowSpan {
            offset: 16_777_215,
            row_bytes: u64::MAX - 16_777_215,
            n_rows: u64::MAX,
        };
        let start = 18_446_743_579_788_312_575 / BIG * BIG;
        let r = vec![start..u64::MAX];
        let b = Bounds {
            page: BIG,
            lazy: 255..18_446_744_073_709_551_360,
            file_len: u64::MAX,
            retained: &r,
        };
        let (mut p, s) = plan(span, &[0], &b);
        assert_eq!(s.rows, 1);
        let end = 18_446_744_073_709_551_360;
        assert_eq!(p.runs(), &[start..end]);
        assert_eq!(p.distinct_pages(), end.div_ceil(BIG) - start / BIG);
    }

    #[test]
    fn skips_out_of_range_ids_and_merges() {
        let span = RowSpan {
            offset: 100,
            row_bytes: 90,
            n_rows: 100,
        };
        let end = span.end();
        let r = whole(end + 7);
        let b = Bounds {
            page: P,
            lazy: 100..end,
            file_len: end + 7,
            retained: &r,
        };
        let (mut p, s) = plan(span, &[3, 100, u64::MAX, 2, 3, 99, 99], &b);
        assert_eq!(s.skipped, 2);
        assert_eq!(s.rows, 5);
        assert_eq!(s.chunks, 1);
        // Rows 2, 3 share page 0; row 99 ends at 9100 (page 2, clamped).
        assert_eq!(p.runs(), &[0..P, 2 * P..end]);
        assert_eq!(p.distinct_pages(), 2);
    }

    #[test]
    fn last_row_ending_mid_page_at_eof_is_clamped() {
        let span = RowSpan {
            offset: 64,
            row_bytes: 90,
            n_rows: 50,
        };
        let end = span.end(); // 4564: mid page 1, also the file end
        let r = whole(end);
        let b = Bounds {
            page: P,
            lazy: 64..end,
            file_len: end,
            retained: &r,
        };
        let (p, _) = plan(span, &[49], &b);
        assert_eq!(p.runs(), &[P..end]);
    }

    #[test]
    fn unmapped_fragments_are_cut_out() {
        let span = RowSpan {
            offset: 0,
            row_bytes: 4096 * 3,
            n_rows: 4,
        };
        let r = [0..P, 2 * P..12 * P];
        let b = Bounds {
            page: P,
            lazy: 0..12 * P,
            file_len: 12 * P,
            retained: &r,
        };
        let (p, _) = plan(span, &[0], &b);
        assert_eq!(p.runs(), &[0..P, 2 * P..3 * P]);
    }

    #[test]
    fn chunks_cover_at_most_256_ids() {
        let span = RowSpan {
            offset: 0,
            row_bytes: 90,
            n_rows: 1 << 20,
        };
        let r = whole(span.end());
        let b = Bounds {
            page: P,
            lazy: 0..span.end(),
            file_len: span.end(),
            retained: &r,
        };
        let ids: Vec<u64> = (0..600).map(|i| i * 1000).collect();
        let (p, s) = plan(span, &ids, &b);
        assert_eq!(s.chunks, 3);
        let sizes: Vec<_> = p.chunks().map(|c| c.len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), p.runs().len());
        assert!(sizes[0] <= 256 && sizes[2] <= 600 - 512);
    }

    #[test]
    fn a_tensor_outside_the_lazy_range_plans_nothing() {
        let span = RowSpan {
            offset: 10 * P,
            row_bytes: 90,
            n_rows: 10,
        };
        let r = whole(20 * P);
        let b = Bounds {
            page: P,
            lazy: 0..P,
            file_len: 20 * P,
            retained: &r,
        };
        let (p, s) = plan(span, &[1, 2], &b);
        assert_eq!(s.rows, 2);
        assert!(p.runs().is_empty());
    }

    #[derive(Debug, Clone)]
    struct Case {
        page: u64,
        offset: u64,
        row_bytes: u64,
        n_rows: u64,
        lazy: Range<u64>,
        file_len: u64,
        retained: Vec<Range<u64>>,
        ids: Vec<u64>,
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            prop_oneof![Just(512u64), Just(4096), Just(16384)],
            0u64..20_000,
            1u64..9_000,
            1u64..400,
            0u64..3,
            0u64..3,
            prop::collection::vec(any::<u64>(), 0..8),
            prop::collection::vec(0u64..450, 0..700),
        )
            .prop_map(|(page, offset, row_bytes, n_rows, lz, fl, holes, ids)| {
                let end = offset + row_bytes * n_rows;
                // The lazy range usually holds the tensor, sometimes only part.
                let lazy = match lz {
                    0 => offset..end,
                    1 => offset.saturating_sub(77)..end + 300,
                    _ => offset + row_bytes / 2..end - row_bytes / 3,
                };
                // The file sometimes ends inside the tensor (a truncated file).
                let file_len = match fl {
                    0 => end,
                    1 => end + 5000,
                    _ => end - row_bytes * n_rows / 3,
                };
                // Unmap whole pages at random spots.
                let npages = file_len.div_ceil(page);
                let mut retained = vec![0..file_len];
                for h in holes {
                    let s = (h % npages.max(1)) * page;
                    let e = (s + page * (1 + (h >> 32) % 4)).min(file_len);
                    retained = retained
                        .into_iter()
                        .flat_map(|f| {
                            let mut v = Vec::new();
                            if f.start < s.min(f.end) {
                                v.push(f.start..s.min(f.end));
                            }
                            if e.max(f.start) < f.end {
                                v.push(e.max(f.start)..f.end);
                            }
                            v
                        })
                        .collect();
                }
                Case {
                    page,
                    offset,
                    row_bytes,
                    n_rows,
                    lazy,
                    file_len,
                    retained,
                    ids,
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn plan_invariants(c in case()) {
            let span = RowSpan { offset: c.offset, row_bytes: c.row_bytes, n_rows: c.n_rows };
            let b = Bounds { page: c.page, lazy: c.lazy.clone(), file_len: c.file_len, retained: &c.retained };
            let mut p = Planner::new();
            let s = p.plan(span, &c.ids, &b);
            let valid: Vec<u64> = c.ids.iter().copied().filter(|&i| i < c.n_rows).collect();
            prop_assert_eq!(s.rows as usize, valid.len());
            prop_assert_eq!(s.skipped as usize, c.ids.len() - valid.len());
            prop_assert_eq!(s.chunks as usize, valid.len().div_ceil(CHUNK_ROWS));
            let limit = span.end().min(c.lazy.end).min(c.file_len);
            let low = floor_to(c.offset.max(c.lazy.start), c.page);
            for (ci, chunk) in p.chunks().enumerate() {
                for (i, r) in chunk.iter().enumerate() {
                    prop_assert!(r.start < r.end);
                    prop_assert_eq!(r.start % c.page, 0, "start aligned");
                    prop_assert!(r.end % c.page == 0 || r.end == limit, "end aligned or clamped");
                    prop_assert!(low <= r.start && r.end <= limit, "inside tensor, lazy range, file");
                    prop_assert!(c.retained.iter().any(|f| f.start <= r.start && r.end <= f.end), "retained");
                    if i > 0 {
                        prop_assert!(chunk[i - 1].end <= r.start, "sorted, disjoint");
                    }
                }
                // Every byte of this chunk's rows that may be advised is covered.
                for &id in valid.iter().skip(ci * CHUNK_ROWS).take(CHUNK_ROWS) {
                    let row = span.row(id).unwrap();
                    let s = row.start.max(c.lazy.start);
                    let e = row.end.min(limit);
                    for f in &c.retained {
                        let (a, z) = (s.max(f.start), e.min(f.end));
                        if a < z {
                            // a..z lies in one fragment, so in one merged run.
                            prop_assert!(
                                chunk.iter().any(|r| r.start <= a && z <= r.end),
                                "row {} bytes {}..{} uncovered in chunk {}", id, a, z, ci
                            );
                        }
                    }
                }
            }
            // Distinct pages equals a brute-force count.
            let mut pages = std::collections::BTreeSet::new();
            for r in p.runs() {
                for pg in r.start / c.page..r.end.div_ceil(c.page) {
                    pages.insert(pg);
                }
            }
            prop_assert_eq!(p.distinct_pages(), pages.len() as u64);
        }
    }

    #[test]
    fn warm_calls_do_not_grow_scratch() {
        let span = RowSpan {
            offset: 0,
            row_bytes: 90,
            n_rows: 1 << 20,
        };
        let r = whole(span.end());
        let b = Bounds {
            page: P,
            lazy: 0..span.end(),
            file_len: span.end(),
            retained: &r,
        };
        let ids: Vec<u64> = (0..1792).map(|i| (i * 7919) % (1 << 20)).collect();
        let mut p = Planner::with_capacity(1792);
        let caps = |p: &Planner| {
            (
                p.runs.capacity(),
                p.tmp.capacity(),
                p.chunk_ends.capacity(),
                p.merged.capacity(),
            )
        };
        let before = caps(&p);
        p.plan(span, &ids, &b);
        p.distinct_pages();
        assert_eq!(caps(&p), before);
    }
}
