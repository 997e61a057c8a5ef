//! The read pipeline's one coalescer: a batch's extents (`(file, offset,
//! len)`, from [`crate::layout::batch_extents`]) to the reads that fetch
//! them. Pure (no I/O), a leaf (it imports no other module of the engine),
//! and allocation-free once its reused storage has grown to the batch.
//!
//! Three modes ([`Mode`]), one merge rule each:
//! - **page** (advice): whole pages; runs that touch or overlap merge.
//!   [`page::Planner`] cuts a batch into chunks of [`page::CHUNK_ROWS`]
//!   rows for `madvise`, clipped to the lazy range, the file and the
//!   mapping's retained fragments.
//! - **gap** (buffered reads: `pread`, the thread pool, buffered io_uring):
//!   bytes as they are; an extent whose gap from the run before it is at
//!   most `max_gap` bytes joins that run, the gap read and ignored.
//! - **block** (`O_DIRECT`: `uring-direct`'s cache fills and the device
//!   floor): whole `block`s; a block joins the run before it when its page
//!   is that run's last page or the next one (with `page == block`: when
//!   the blocks touch).
//!
//! A [`Plan`] is multi-file: every extent carries its file index, and a run
//! never spans two files. Its runs are laid out back to back in a staging
//! buffer, file by file and by offset within a file, and it records where
//! each extent's bytes landed.

pub mod page;

use std::ops::Range;

/// How extents become reads (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Whole pages of `page` bytes; touching or overlapping runs merge.
    Page {
        /// Page size (a power of two, from the OS).
        page: u64,
    },
    /// Bytes as they are; an extent at most `max_gap` bytes past the run
    /// before it joins it.
    Gap {
        /// Largest gap read through.
        max_gap: u64,
    },
    /// Whole `block`s; a block joins the run before it when its page (of
    /// `page` bytes) is that run's last page or the next.
    Block {
        /// The `O_DIRECT` alignment (at least 1).
        block: u64,
        /// Pages whose blocks merge (a multiple of `block`; `block` itself
        /// merges only touching blocks).
        page: u64,
    },
}

impl Default for Mode {
    fn default() -> Mode {
        Mode::Gap { max_gap: 0 }
    }
}

impl Mode {
    /// The unit extents are widened to (1 for gap mode).
    #[inline]
    fn unit(self) -> u64 {
        match self {
            Mode::Page { page } => page.max(1),
            Mode::Gap { .. } => 1,
            Mode::Block { block, .. } => block.max(1),
        }
    }

    /// The bytes read for `len` bytes at `offset`: rounded out to whole
    /// units (pages, blocks), or `None` when the end does not fit in 64
    /// bits.
    #[inline]
    pub fn widen(self, offset: u64, len: u64) -> Option<Range<u64>> {
        let end = offset.checked_add(len)?;
        let unit = self.unit();
        if unit == 1 {
            return Some(offset..end);
        }
        if unit.is_power_of_two() {
            // Pages and O_DIRECT blocks: masks, not divisions.
            let mask = unit - 1;
            return Some(offset & !mask..end.checked_add(mask)? & !mask);
        }
        Some(offset - offset % unit..end.checked_next_multiple_of(unit)?)
    }

    /// Whether a run ending at `end` takes in a (widened) extent starting at
    /// `start`, which is at or past the run's start.
    #[inline]
    pub fn joins(self, end: u64, start: u64) -> bool {
        match self {
            Mode::Page { .. } => start <= end,
            Mode::Gap { max_gap } => start.saturating_sub(end) <= max_gap,
            Mode::Block { page, .. } => {
                let page = page.max(1);
                start <= end || start / page <= end.saturating_sub(1) / page + 1
            }
        }
    }
}

/// Sorts `runs` by start and merges, in place, every run that `mode` joins
/// to the run before it (page mode: overlapping and touching runs).
#[inline]
pub fn merge_sorted(runs: &mut Vec<Range<u64>>, mode: Mode) {
    runs.sort_unstable_by_key(|r| r.start);
    let mut w = 0;
    for i in 0..runs.len() {
        let r = runs[i].clone();
        if w > 0 && mode.joins(runs[w - 1].end, r.start) {
            runs[w - 1].end = runs[w - 1].end.max(r.end);
        } else {
            runs[w] = r;
            w += 1;
        }
    }
    runs.truncate(w);
}

/// One read of a [`Plan`]: bytes `start..end` of file `file`, landing at
/// `staging[dst..dst + (end - start)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Run {
    /// Index of the file.
    pub file: usize,
    /// First byte read.
    pub start: u64,
    /// One past the last byte read.
    pub end: u64,
    /// One past the last byte an extent of the run wants (at most `end`:
    /// the rest is alignment slack, which may lie past the end of the file).
    pub want: u64,
    /// Offset in staging (set by [`Plan::finish`]).
    pub dst: usize,
}

impl Run {
    /// Bytes the run reads.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// True if the run reads nothing.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Why extents cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CoalesceError {
    /// Extents of one stream must come in ascending offset order.
    #[error("extent {index} starts at file offset {offset}, before the extent before it")]
    Unsorted {
        /// Index of the extent (in push order).
        index: usize,
        /// Its file offset.
        offset: u64,
    },
    /// An extent's end, or the staging it needs, does not fit in 64 bits
    /// (or in `usize`).
    #[error("extent {index} overflows the offset range")]
    Overflow {
        /// Index of the extent (in push order).
        index: usize,
    },
}

/// No run open for a stream.
const NONE: usize = usize::MAX;

/// A multi-file read plan, built extent by extent and reused from batch to
/// batch (its storage only grows).
///
/// Extents are pushed in *streams* (a stream's extents ascend by offset
/// and lie in one file; a run only grows within its stream): for extents
/// sorted by file and offset the stream is the file ([`Plan::sorted`]); a
/// table's rows taken in ascending order are ascending within each region,
/// so a cache fill that plans rows one at a time uses the region.
/// [`Plan::finish`] then orders the runs by file and offset, places them
/// back to back in staging and records where each extent landed.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    mode: Mode,
    /// The runs: in creation order until [`Plan::finish`], then by file and
    /// offset.
    runs: Vec<Run>,
    /// The open run of each stream.
    open: Vec<usize>,
    /// The offset of the last extent pushed to each stream.
    last: Vec<u64>,
    /// Per extent pushed: its run (creation index) and offset in it.
    landed: Vec<(usize, u64)>,
    /// Per extent pushed: where it landed in staging (after `finish`).
    at: Vec<usize>,
    /// Each file's runs, ascending by file index (after `finish`).
    files: Vec<(usize, Range<usize>)>,
    /// Working storage of `finish`.
    order: Vec<usize>,
    scratch_runs: Vec<Run>,
    staging_len: usize,
}

impl Plan {
    /// An empty plan (its storage grows on first use).
    pub fn new() -> Plan {
        Plan::default()
    }

    /// An empty plan with room for `streams` streams (more grow on use).
    pub fn with_streams(streams: usize) -> Plan {
        Plan {
            open: vec![NONE; streams],
            last: vec![0; streams],
            ..Plan::default()
        }
    }

    /// Forgets the last plan (keeping the storage) and starts one in `mode`.
    pub fn start(&mut self, mode: Mode) {
        self.mode = mode;
        self.runs.clear();
        self.open.iter_mut().for_each(|o| *o = NONE);
        self.landed.clear();
        self.at.clear();
        self.files.clear();
        self.staging_len = 0;
    }

    /// The open run of `stream` that an extent widened to `w` would join.
    fn joined(&self, stream: usize, file: usize, w: &Range<u64>) -> Option<usize> {
        let i = *self.open.get(stream)?;
        let r = self.runs.get(i)?;
        (r.file == file && w.start >= r.start && self.mode.joins(r.end, w.start)).then_some(i)
    }

    /// Staging bytes pushing `len` bytes at `offset` of `stream` would add
    /// (for a caller that fills a bounded staging buffer).
    pub fn grow(
        &self,
        stream: usize,
        file: usize,
        offset: u64,
        len: u64,
    ) -> Result<u64, CoalesceError> {
        let index = self.landed.len();
        let w = self
            .mode
            .widen(offset, len)
            .ok_or(CoalesceError::Overflow { index })?;
        Ok(match self.joined(stream, file, &w) {
            Some(i) => w.end.saturating_sub(self.runs[i].end),
            None => w.end - w.start,
        })
    }

    /// Adds `len` bytes at `offset` of `file` to `stream`: they join the
    /// stream's open run when the mode joins them, or open a new one.
    pub fn push(
        &mut self,
        stream: usize,
        file: usize,
        offset: u64,
        len: u64,
    ) -> Result<(), CoalesceError> {
        let index = self.landed.len();
        if stream >= self.open.len() {
            self.open.resize(stream + 1, NONE);
            self.last.resize(stream + 1, 0);
        }
        if self.open[stream] != NONE && offset < self.last[stream] {
            return Err(CoalesceError::Unsorted { index, offset });
        }
        self.last[stream] = offset;
        let w = self
            .mode
            .widen(offset, len)
            .ok_or(CoalesceError::Overflow { index })?;
        let want = offset + len;
        match self.joined(stream, file, &w) {
            Some(i) => {
                let r = &mut self.runs[i];
                r.end = r.end.max(w.end);
                r.want = r.want.max(want);
                self.landed.push((i, offset - r.start));
            }
            None => {
                self.open[stream] = self.runs.len();
                self.landed.push((self.runs.len(), offset - w.start));
                self.runs.push(Run {
                    file,
                    start: w.start,
                    end: w.end,
                    want,
                    dst: 0,
                });
            }
        }
        Ok(())
    }

    /// Orders the runs by file and offset, places them back to back in
    /// staging and records where every extent landed ([`Plan::at`]).
    pub fn finish(&mut self) -> Result<(), CoalesceError> {
        self.open.iter_mut().for_each(|o| *o = NONE);
        let overflow = |index| CoalesceError::Overflow { index };
        // Already in order when the extents came sorted by file and offset.
        let in_order = self
            .runs
            .windows(2)
            .all(|w| (w[0].file, w[0].start) <= (w[1].file, w[1].start));
        self.order.clear();
        if !in_order {
            let runs = &self.runs;
            self.order.extend(0..runs.len());
            self.order
                .sort_unstable_by_key(|&i| (runs[i].file, runs[i].start));
        }
        self.files.clear();
        let mut dst = 0usize;
        for k in 0..self.runs.len() {
            let i = if in_order { k } else { self.order[k] };
            let r = &mut self.runs[i];
            r.dst = dst;
            match self.files.last_mut() {
                Some((f, span)) if *f == r.file => span.end += 1,
                _ => self.files.push((r.file, k..k + 1)),
            }
            let len = usize::try_from(r.len()).map_err(|_| overflow(k))?;
            dst = dst.checked_add(len).ok_or_else(|| overflow(k))?;
        }
        self.staging_len = dst;
        self.at.clear();
        let runs = &self.runs;
        for (index, &(i, delta)) in self.landed.iter().enumerate() {
            // Below `staging_len` (checked above), so it fits.
            let at = usize::try_from(delta).map_err(|_| overflow(index))?;
            self.at.push(runs[i].dst + at);
        }
        if !in_order {
            // The runs themselves in staging order.
            self.scratch_runs.clear();
            self.scratch_runs.extend(self.order.iter().map(|&i| self.runs[i]));
            std::mem::swap(&mut self.runs, &mut self.scratch_runs);
        }
        Ok(())
    }

    /// Plans `extents` (`(file, offset, len)`, sorted by file then offset,
    /// overlaps allowed) in `mode`, replacing the last plan: one stream per
    /// file.
    pub fn sorted(
        &mut self,
        mode: Mode,
        extents: impl IntoIterator<Item = (usize, u64, u64)>,
    ) -> Result<(), CoalesceError> {
        self.start(mode);
        let mut prev = (0usize, 0u64);
        for (index, (file, offset, len)) in extents.into_iter().enumerate() {
            if (file, offset) < prev {
                return Err(CoalesceError::Unsorted { index, offset });
            }
            prev = (file, offset);
            self.push(file, file, offset, len)?;
        }
        self.finish()
    }

    /// The mode of the last plan.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The runs, by file and offset, back to back in staging (after
    /// [`Plan::finish`]).
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// Each file's runs: `(file, range of runs())`, ascending by file.
    pub fn files(&self) -> &[(usize, Range<usize>)] {
        &self.files
    }

    /// Where each extent landed in staging, in push order.
    pub fn at(&self) -> &[usize] {
        &self.at
    }

    /// Staging bytes the plan needs.
    pub fn staging_len(&self) -> usize {
        self.staging_len
    }

    /// Extents pushed since [`Plan::start`].
    pub fn extents(&self) -> usize {
        self.landed.len()
    }
}

#[cfg(test)]
mod tests;
