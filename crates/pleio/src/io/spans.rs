//! Read plans: file byte spans and where each lands in a staging buffer,
//! as the backends read them. Pure code, no I/O. Spans are planned by the
//! coalescer ([`crate::coalesce`], gap mode); this is its one-file form.

use crate::coalesce::{CoalesceError, Mode, Plan, Run};

/// One contiguous read: `len` bytes of the file at `file_offset`, stored at
/// `staging[dst_offset..dst_offset + len]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Absolute byte offset in the file.
    pub file_offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Offset in the staging buffer.
    pub dst_offset: usize,
}

impl Span {
    /// One past the last file byte of the span.
    pub fn file_end(&self) -> u64 {
        self.file_offset + self.len as u64
    }
}

/// Why a list of spans or rows is not a valid plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// Spans must be sorted by file offset.
    #[error("span {index} starts at file offset {offset}, before the previous span")]
    Unsorted {
        /// Index of the offending span.
        index: usize,
        /// Its file offset.
        offset: u64,
    },
    /// Spans must land in ascending, non-overlapping staging ranges.
    #[error("span {index} lands at staging offset {dst_offset}, overlapping or before the previous span")]
    StagingOverlap {
        /// Index of the offending span.
        index: usize,
        /// Its staging offset.
        dst_offset: usize,
    },
    /// A span's end does not fit in a `u64` file offset or `usize` staging offset.
    #[error("span {index} overflows the offset range")]
    Overflow {
        /// Index of the offending span.
        index: usize,
    },
    /// Row ids must be strictly ascending (sorted and deduplicated).
    #[error("row ids must be strictly ascending: row {row} at index {index}")]
    RowsUnsorted {
        /// Index of the offending id.
        index: usize,
        /// The id.
        row: u64,
    },
    /// Rows must have a non-zero size.
    #[error("row size is zero")]
    ZeroRowBytes,
}

/// A validated list of spans: sorted by file offset, landing in ascending,
/// non-overlapping staging ranges. Backends rely on both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadPlan {
    spans: Vec<Span>,
    staging_len: usize,
}

impl ReadPlan {
    /// Validate `spans` (sorted by file offset, staging ranges ascending and
    /// disjoint, no overflow). Zero-length spans are allowed and read nothing.
    pub fn new(spans: Vec<Span>) -> Result<ReadPlan, PlanError> {
        let mut prev_file = 0u64;
        let mut prev_dst_end = 0usize;
        for (index, s) in spans.iter().enumerate() {
            if s.file_offset.checked_add(s.len as u64).is_none() {
                return Err(PlanError::Overflow { index });
            }
            let Some(dst_end) = s.dst_offset.checked_add(s.len) else {
                return Err(PlanError::Overflow { index });
            };
            if s.file_offset < prev_file {
                return Err(PlanError::Unsorted {
                    index,
                    offset: s.file_offset,
                });
            }
            if s.dst_offset < prev_dst_end {
                return Err(PlanError::StagingOverlap {
                    index,
                    dst_offset: s.dst_offset,
                });
            }
            prev_file = s.file_offset;
            prev_dst_end = dst_end;
        }
        Ok(ReadPlan {
            spans,
            staging_len: prev_dst_end,
        })
    }

    /// Spans placed back to back in staging, in the given (file) order.
    pub fn packed(extents: impl IntoIterator<Item = (u64, usize)>) -> Result<ReadPlan, PlanError> {
        let mut dst = 0usize;
        let mut spans = Vec::new();
        for (index, (file_offset, len)) in extents.into_iter().enumerate() {
            spans.push(Span {
                file_offset,
                len,
                dst_offset: dst,
            });
            dst = dst.checked_add(len).ok_or(PlanError::Overflow { index })?;
        }
        ReadPlan::new(spans)
    }

    /// Plan the reads of table rows `rows` (strictly ascending ids; row `r`
    /// is `row_bytes` bytes at `base + r * row_bytes`). Rows whose gap (bytes
    /// between one row's end and the next row's start) is at most `max_gap`
    /// are read as one span; the gap bytes are read and ignored. Spans are
    /// packed back to back in staging, each an exact image of its file range,
    /// so row `rows[i]` is at `staging[staging_offsets[i]..][..row_bytes]`.
    pub fn for_rows(
        base: u64,
        row_bytes: usize,
        rows: &[u64],
        max_gap: usize,
    ) -> Result<RowReads, PlanError> {
        let mut out = RowReads::default();
        ReadPlan::for_rows_into(base, row_bytes, rows, max_gap, &mut out)?;
        Ok(out)
    }

    /// [`ReadPlan::for_rows`] into `out`, reusing its storage (a gather
    /// that plans every batch allocates nothing once warmed up). On error
    /// `out` holds an unspecified partial plan.
    pub fn for_rows_into(
        base: u64,
        row_bytes: usize,
        rows: &[u64],
        max_gap: usize,
        out: &mut RowReads,
    ) -> Result<(), PlanError> {
        if row_bytes == 0 {
            return Err(PlanError::ZeroRowBytes);
        }
        let rb = row_bytes as u64;
        for (index, &row) in rows.iter().enumerate() {
            if index > 0 && row <= rows[index - 1] {
                return Err(PlanError::RowsUnsorted { index, row });
            }
        }
        let mut bad = None;
        let extents = rows.iter().enumerate().map(|(index, &row)| {
            let off = row
                .checked_mul(rb)
                .and_then(|o| o.checked_add(base))
                .filter(|o| o.checked_add(rb).is_some());
            if off.is_none() && bad.is_none() {
                bad = Some(index);
            }
            (off.unwrap_or(u64::MAX - rb), row_bytes)
        });
        let planned = ReadPlan::for_extents_into(extents, max_gap, out);
        match bad {
            Some(index) => Err(PlanError::Overflow { index }),
            None => planned,
        }
    }

    /// Plan the reads of `extents` (`(file offset, len)`, sorted by offset,
    /// overlapping allowed): extents whose gap (bytes between the end of
    /// what is planned so far and the next start) is at most `max_gap` are
    /// read as one span, the gap read and ignored. Spans are packed back to
    /// back in staging, each an exact image of its file range, so extent
    /// `i` is at `staging[staging_offsets[i]..][..len]`. Reuses `out`'s
    /// storage; on error `out` holds an unspecified partial plan.
    pub fn for_extents_into(
        extents: impl IntoIterator<Item = (u64, usize)>,
        max_gap: usize,
        out: &mut RowReads,
    ) -> Result<(), PlanError> {
        let RowReads {
            plan,
            staging_offsets,
            coalesce,
        } = out;
        plan.spans.clear();
        plan.staging_len = 0;
        staging_offsets.clear();
        coalesce
            .sorted(
                Mode::Gap {
                    max_gap: max_gap as u64,
                },
                extents
                    .into_iter()
                    .map(|(off, len)| (0, off, len as u64)),
            )
            .map_err(|e| match e {
                CoalesceError::Unsorted { index, offset } => PlanError::Unsorted { index, offset },
                CoalesceError::Overflow { index } => PlanError::Overflow { index },
            })?;
        plan.fill(coalesce.runs())
            .map_err(|index| PlanError::Overflow { index })?;
        staging_offsets.extend_from_slice(coalesce.at());
        Ok(())
    }

    /// Replaces the spans with `runs` (of one file, from the coalescer,
    /// back to back in staging from their first `dst`), staged from 0,
    /// reusing the storage. `Err(index)`: a run longer than `usize`.
    pub fn fill(&mut self, runs: &[Run]) -> Result<(), usize> {
        let base = runs.first().map_or(0, |r| r.dst);
        self.spans.clear();
        for (index, r) in runs.iter().enumerate() {
            self.spans.push(Span {
                file_offset: r.start,
                len: usize::try_from(r.len()).map_err(|_| index)?,
                dst_offset: r.dst - base,
            });
        }
        self.staging_len = runs.last().map_or(0, |r| r.dst - base + r.len() as usize);
        Ok(())
    }

    /// The spans, sorted by file offset.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Staging bytes the plan needs (end of the last span's destination).
    pub fn staging_len(&self) -> usize {
        self.staging_len
    }

    /// Total bytes the spans read.
    pub fn bytes(&self) -> u64 {
        self.spans.iter().map(|s| s.len as u64).sum()
    }

    /// True if there is nothing to read.
    pub fn is_empty(&self) -> bool {
        self.spans.iter().all(|s| s.len == 0)
    }
}

/// The plan for a set of rows, with where each row lands in staging.
#[derive(Debug, Clone, Default)]
pub struct RowReads {
    /// The reads.
    pub plan: ReadPlan,
    /// `staging_offsets[i]`: where row `rows[i]` starts in the staging buffer.
    pub staging_offsets: Vec<usize>,
    /// The coalescer's reused storage.
    coalesce: Plan,
}

impl PartialEq for RowReads {
    fn eq(&self, other: &RowReads) -> bool {
        self.plan == other.plan && self.staging_offsets == other.staging_offsets
    }
}

impl Eq for RowReads {}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(file_offset: u64, len: usize, dst_offset: usize) -> Span {
        Span {
            file_offset,
            len,
            dst_offset,
        }
    }

    #[test]
    fn new_validates_order_and_overlap() {
        let ok = ReadPlan::new(vec![span(0, 10, 0), span(5, 10, 10), span(100, 1, 40)]).unwrap();
        assert_eq!(ok.staging_len(), 41);
        assert_eq!(ok.bytes(), 21);
        assert_eq!(
            ReadPlan::new(vec![span(10, 1, 0), span(9, 1, 1)]),
            Err(PlanError::Unsorted {
                index: 1,
                offset: 9
            })
        );
        assert_eq!(
            ReadPlan::new(vec![span(0, 10, 0), span(20, 1, 9)]),
            Err(PlanError::StagingOverlap {
                index: 1,
                dst_offset: 9
            })
        );
        assert_eq!(
            ReadPlan::new(vec![span(u64::MAX, 2, 0)]),
            Err(PlanError::Overflow { index: 0 })
        );
        assert_eq!(
            ReadPlan::new(vec![span(0, 2, usize::MAX)]),
            Err(PlanError::Overflow { index: 0 })
        );
        let empty = ReadPlan::new(vec![]).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.staging_len(), 0);
    }

    #[test]
    fn packed_places_back_to_back() {
        let p = ReadPlan::packed([(100, 5), (200, 7), (300, 0), (400, 1)]).unwrap();
        let dsts: Vec<_> = p.spans().iter().map(|s| s.dst_offset).collect();
        assert_eq!(dsts, [0, 5, 12, 12]);
        assert_eq!(p.staging_len(), 13);
    }

    #[test]
    fn rows_coalesce_by_gap() {
        // base 1000, 10-byte rows. Rows 0,1 adjacent (gap 0); row 3 gap 10;
        // row 6 gap 20.
        let rows = [0u64, 1, 3, 6];
        let r0 = ReadPlan::for_rows(1000, 10, &rows, 0).unwrap();
        assert_eq!(
            r0.plan.spans(),
            &[span(1000, 20, 0), span(1030, 10, 20), span(1060, 10, 30)]
        );
        assert_eq!(r0.staging_offsets, [0, 10, 20, 30]);

        let r10 = ReadPlan::for_rows(1000, 10, &rows, 10).unwrap();
        assert_eq!(r10.plan.spans(), &[span(1000, 40, 0), span(1060, 10, 40)]);
        assert_eq!(r10.staging_offsets, [0, 10, 30, 40]);

        let r20 = ReadPlan::for_rows(1000, 10, &rows, 20).unwrap();
        assert_eq!(r20.plan.spans(), &[span(1000, 70, 0)]);
        assert_eq!(r20.staging_offsets, [0, 10, 30, 60]);
        assert_eq!(r20.plan.staging_len(), 70);
    }

    #[test]
    fn rows_image_matches_file_layout() {
        // Every row's staging offset must point at the bytes of that row in an
        // image of the file built from the plan.
        let file: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let (base, rb) = (13u64, 17usize);
        let rows = [0u64, 2, 3, 40, 41, 200, 250, 251, 252, 290];
        for gap in [0, 16, 17, 34, 1000] {
            let r = ReadPlan::for_rows(base, rb, &rows, gap).unwrap();
            let mut staging = vec![0u8; r.plan.staging_len()];
            for s in r.plan.spans() {
                let f = s.file_offset as usize;
                staging[s.dst_offset..s.dst_offset + s.len].copy_from_slice(&file[f..f + s.len]);
            }
            for (i, &row) in rows.iter().enumerate() {
                let f = base as usize + row as usize * rb;
                assert_eq!(
                    &staging[r.staging_offsets[i]..][..rb],
                    &file[f..f + rb],
                    "gap {gap} row {row}"
                );
            }
        }
    }

    #[test]
    fn rows_into_reuses_storage_and_matches() {
        let mut reused = RowReads::default();
        for rows in [
            &[5u64, 6, 90, 91, 400][..],
            &[1],
            &[],
            &[3, 4, 5, 6, 7, 1000],
        ] {
            ReadPlan::for_rows_into(7, 9, rows, 20, &mut reused).unwrap();
            assert_eq!(reused, ReadPlan::for_rows(7, 9, rows, 20).unwrap());
        }
    }

    #[test]
    fn extents_coalesce_and_overlap() {
        // Parts of different sizes, one inside another's span, one far.
        let mut r = RowReads::default();
        ReadPlan::for_extents_into([(100, 10), (105, 2), (112, 4), (5000, 3)], 2, &mut r).unwrap();
        assert_eq!(r.plan.spans(), &[span(100, 16, 0), span(5000, 3, 16)]);
        assert_eq!(r.staging_offsets, [0, 5, 12, 16]);
        assert_eq!(
            ReadPlan::for_extents_into([(10, 1), (9, 1)], 0, &mut r),
            Err(PlanError::Unsorted {
                index: 1,
                offset: 9
            })
        );
        assert_eq!(
            ReadPlan::for_extents_into([(u64::MAX, 2)], 0, &mut r),
            Err(PlanError::Overflow { index: 0 })
        );
    }

    #[test]
    fn rows_reject_bad_input() {
        assert_eq!(
            ReadPlan::for_rows(0, 10, &[1, 1], 0),
            Err(PlanError::RowsUnsorted { index: 1, row: 1 })
        );
        assert_eq!(
            ReadPlan::for_rows(0, 10, &[2, 1], 0),
            Err(PlanError::RowsUnsorted { index: 1, row: 1 })
        );
        assert_eq!(
            ReadPlan::for_rows(0, 0, &[1], 0),
            Err(PlanError::ZeroRowBytes)
        );
        assert_eq!(
            ReadPlan::for_rows(0, 10, &[u64::MAX / 5], 0),
            Err(PlanError::Overflow { index: 0 })
        );
        let empty = ReadPlan::for_rows(0, 10, &[], 4).unwrap();
        assert!(empty.plan.is_empty() && empty.staging_offsets.is_empty());
    }
}
