//! The device floor: the least time this device takes to deliver a batch's
//! bytes, against which every strategy is measured (`limit` in `pleio bench`
//! and `pleio demo`, the floor of a replay's prefill and decode).
//!
//! The floor reads a batch's distinct byte *extents* (found by the engine's
//! `layout::batch_extents` and cut by its coalescer's block mode,
//! `pleio::coalesce`): the pages its rows touch, contiguous pages merged
//! (as the best strategy would read them: a Gemma 4 row of 7392 bytes
//! spans two or three pages and is one request, not three), each extent trimmed at both ends to the `O_DIRECT` blocks
//! (512 B on most disks) its first and last rows need, and read as one
//! request through io_uring, bypassing the page cache. So the floor never
//! makes more requests or reads more bytes than a page-cache strategy, nor
//! more requests than `uring-direct` (which merges rows less than 1 KiB
//! apart). The queue depth is not
//! assumed: [`Floor::fastest`] sweeps [`QUEUE_DEPTHS`] once per run on
//! fresh random batches and keeps the depth with the lowest median time.
//!
//! Floor figures are medians (mean and p99 kept beside them): one slow
//! read on a shared machine must not move the yardstick.

use std::ops::Range;
use std::time::{Duration, Instant};

use pleio::coalesce::{Mode, Plan};
use pleio::io::{Engine, IoError, ReadStats, Reader, ReaderConfig};
use pleio::layout::{batch_extents, BatchExtent, ExtentOrder, Layout, Shard};
use pleio::Table;
use rustc_hash::FxHashSet;

use crate::random::Rng;

/// Queue depths the sweep tries.
pub const QUEUE_DEPTHS: [u32; 5] = [16, 32, 64, 128, 256];

/// Rows per sweep batch (fewer if the table is smaller): enough extents that
/// every depth of [`QUEUE_DEPTHS`] is filled many times over.
pub const SWEEP_ROWS: usize = 1024;

/// Timed batches per depth in the sweep (each on fresh random rows).
pub const SWEEP_ROUNDS: usize = 8;

/// Passes over a replay phase's extents at least; the phase floor is the
/// sum of each step's median over them.
pub const PHASE_PASSES: usize = 5;

/// Short phases get more passes, until their passes have taken this long
/// (at most [`MAX_PHASE_PASSES`]): a median over more passes moves less
/// between runs.
pub const PHASE_BUDGET: Duration = Duration::from_secs(4);

/// The most passes a phase gets.
pub const MAX_PHASE_PASSES: usize = 15;

/// Passes when one pass takes longer than [`LONG_PASS`].
pub const LONG_PHASE_PASSES: usize = 3;

/// A pass over a phase longer than this gets [`LONG_PHASE_PASSES`] passes.
pub const LONG_PASS: Duration = Duration::from_secs(2);

/// Mean, median and p99 of `xs` (sorted in place).
pub(crate) fn summary(xs: &mut [f64]) -> (f64, f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    xs.sort_by(f64::total_cmp);
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let rank = ((xs.len() as f64 * 0.99).ceil() as usize).clamp(1, xs.len());
    (mean, xs[xs.len() / 2], xs[rank - 1])
}

/// Latency summary of a set of timed reads, microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// Timed reads.
    pub samples: usize,
    /// Mean.
    pub mean_us: f64,
    /// Median: the floor figure.
    pub median_us: f64,
    /// 99th percentile (nearest rank).
    pub p99_us: f64,
}

impl Timing {
    /// Summary of `us` (reordered).
    pub fn of(us: &mut [f64]) -> Timing {
        let (mean_us, median_us, p99_us) = summary(us);
        Timing {
            samples: us.len(),
            mean_us,
            median_us,
            p99_us,
        }
    }
}

/// One queue depth of the sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct DepthPoint {
    /// Reads in flight at most.
    pub queue_depth: u32,
    /// Time per batch.
    pub timing: Timing,
    /// Mean extents (requests) per batch.
    pub extents: f64,
}

/// What the queue-depth sweep measured.
#[derive(Debug, Clone, PartialEq)]
pub struct DepthSweep {
    /// Rows per batch.
    pub rows: usize,
    /// Batches per depth.
    pub rounds: usize,
    /// Every depth tried, in [`QUEUE_DEPTHS`] order.
    pub points: Vec<DepthPoint>,
    /// The depth with the lowest median: the one the floor uses.
    pub best: u32,
    /// How extents are cut.
    pub grain: Grain,
}

/// Where a table's rows lie in its files: what the floor needs of a
/// [`Layout`] (its shards, each of one to three parts in any file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rows {
    shards: Vec<Shard>,
}

impl From<&Layout> for Rows {
    fn from(l: &Layout) -> Rows {
        Rows {
            shards: l.shards().to_vec(),
        }
    }
}

impl Rows {
    /// The rows of `shards` (which tile the rows in order, as
    /// [`Layout::shards`] does).
    pub fn new(shards: Vec<Shard>) -> Rows {
        Rows { shards }
    }

    /// The parts of `rows` ([`batch_extents`], the engine's row ->
    /// extents function), sorted by file and offset; rows past the last
    /// shard (or whose bytes would end past 2^64) have none.
    fn extents(&self, rows: &[u64]) -> Vec<BatchExtent> {
        let mut out = Vec::with_capacity(rows.len() * 3);
        let mut rows = std::borrow::Cow::Borrowed(rows);
        while let Err(bad) = batch_extents(&self.shards, &rows, ExtentOrder::File, &mut out) {
            rows.to_mut().retain(|&r| r != bad);
        }
        out
    }
}

/// Bytes `range` of file `file` (a [`pleio::layout::ShardPart::file`]).
pub type FileExtent = (usize, Range<u64>);

/// How extents are cut: rows' bytes are read in whole `block`s (the
/// `O_DIRECT` alignment), and blocks whose pages (of `page` bytes) touch or
/// are contiguous are read as one extent, the bytes between included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grain {
    /// Bytes of the unit read (a power of two, at most `page`).
    pub block: u64,
    /// Bytes of a page.
    pub page: u64,
}

impl Grain {
    /// The coalescer's block mode of this grain.
    fn mode(self) -> Mode {
        Mode::Block {
            block: self.block,
            page: self.page,
        }
    }
}

/// The distinct `(file, block index)` pairs that `rows` of `t` touch,
/// sorted.
fn blocks_of(t: &Rows, g: Grain, rows: &[u64]) -> Vec<(usize, u64)> {
    let mut blocks: Vec<(usize, u64)> = Vec::with_capacity(rows.len() * 2);
    for BatchExtent { extent: e, .. } in t.extents(rows) {
        if e.len > 0 {
            let end = e.offset + e.len;
            blocks.extend((e.offset / g.block..=(end - 1) / g.block).map(|b| (e.file, b)));
        }
    }
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

/// Extents (`(file, offset, len)`, sorted) coalesced in `g`'s block mode:
/// whole blocks, a block joining the extent before it when it is in the
/// same file and its page is that extent's last page or the next one.
fn coalesce(g: Grain, extents: impl IntoIterator<Item = (usize, u64, u64)>) -> Vec<FileExtent> {
    let mut plan = Plan::new();
    // Sorted input of checked tables: only a row ending past 2^64 fails,
    // and `Rows::extents` leaves those out.
    if plan.sorted(g.mode(), extents).is_err() {
        return Vec::new();
    }
    plan.runs()
        .iter()
        .map(|r| (r.file, r.start..r.end))
        .collect()
}

/// The distinct byte extents `rows` of table `t` occupy, in (file, offset)
/// order (see [`Grain`]).
pub fn row_extents(t: &Rows, g: Grain, rows: &[u64]) -> Vec<FileExtent> {
    let parts = t.extents(rows);
    coalesce(
        g,
        parts
            .iter()
            .map(|b| (b.extent.file, b.extent.offset, b.extent.len))
            .filter(|e| e.2 > 0),
    )
}

/// The extents each step of a phase reads cold when the phase starts with
/// the table evicted: blocks on a page an earlier step touched are left out,
/// as the page cache of the strategies that fill it holds that whole page.
pub fn phase_extents(t: &Rows, g: Grain, steps: &[&[u64]]) -> Vec<Vec<FileExtent>> {
    let per_page = g.page / g.block;
    let mut seen_pages = FxHashSet::default();
    steps
        .iter()
        .map(|rows| {
            let blocks = blocks_of(t, g, rows);
            let cold: Vec<(usize, u64)> = blocks
                .iter()
                .copied()
                .filter(|&(f, b)| !seen_pages.contains(&(f, b / per_page)))
                .collect();
            seen_pages.extend(blocks.iter().map(|&(f, b)| (f, b / per_page)));
            coalesce(g, cold.iter().map(|&(f, b)| (f, b * g.block, g.block)))
        })
        .collect()
}

/// The floor of one replay phase (prefill or decode): every step's cold
/// extents read in order, [`PHASE_PASSES`] times.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseFloor {
    /// Steps (ubatches or decode steps).
    pub steps: usize,
    /// Extents (requests) per pass.
    pub extents: u64,
    /// Bytes per pass.
    pub bytes: u64,
    /// Queue depth used.
    pub queue_depth: u32,
    /// `median_us`: the floor, the sum over steps of each step's median
    /// time over the passes; `mean_us` and `p99_us`: of whole passes;
    /// `samples`: passes.
    pub timing: Timing,
}

impl PhaseFloor {
    /// The floor time (`timing.median_us`).
    pub fn time(&self) -> Duration {
        Duration::from_secs_f64(self.timing.median_us / 1e6)
    }

    /// `tokens` (the phase's) per second of floor time.
    pub fn tokens_per_s(&self, tokens: usize) -> Option<f64> {
        let s = self.time().as_secs_f64();
        (tokens > 0 && s > 0.0).then(|| tokens as f64 / s)
    }
}

/// The device floor of one table: its extents read with `O_DIRECT` at the
/// chosen queue depth, every file of the table through one ring (the
/// engine's [`Reader`], as `uring-direct` and `cached` read).
#[derive(Debug)]
pub struct Floor {
    /// Every file holding rows, through one ring.
    reader: Reader,
    /// The table's shards, their parts' files renumbered as the reader's
    /// file indices.
    table: Rows,
    grain: Grain,
}

impl Floor {
    /// The floor of table `t` at `queue_depth`, with extents of whole
    /// `O_DIRECT` blocks ([`Reader::alignment`], the largest of its
    /// files') merged across pages of `page_bytes` (see [`Grain`]).
    pub fn open(t: &Table, page_bytes: u64, queue_depth: u32) -> Result<Floor, IoError> {
        let layout = t.layout();
        let mut files: Vec<usize> = layout.regions().map(|r| r.file).collect();
        files.sort_unstable();
        files.dedup();
        if files.is_empty() {
            return Err(IoError::DirectUnsupported {
                path: t.path().to_path_buf(),
                reason: "the table has no rows in any file".into(),
            });
        }
        let cfg = ReaderConfig {
            queue_depth,
            direct: true,
            ..ReaderConfig::new(Engine::Uring)
        };
        let paths: Vec<_> = files.iter().map(|&f| t.file_path(f)).collect();
        let reader = Reader::open(&paths, cfg)?;
        let page = page_bytes.max(1);
        let align = (0..reader.files())
            .filter_map(|k| reader.alignment(k))
            .max()
            .unwrap_or(1);
        let block = (align as u64).clamp(1, page);
        if !page.is_multiple_of(block) {
            return Err(IoError::DirectUnsupported {
                path: t.path().to_path_buf(),
                reason: format!("O_DIRECT alignment {block} does not divide the page size {page}"),
            });
        }
        let mut shards = layout.shards().to_vec();
        for part in shards.iter_mut().flat_map(|s| s.parts.iter_mut()) {
            part.file = files.binary_search(&part.file).unwrap_or(0);
        }
        Ok(Floor {
            reader,
            table: Rows::new(shards),
            grain: Grain { block, page },
        })
    }

    /// Sweeps [`QUEUE_DEPTHS`] ([`SWEEP_ROUNDS`] batches of [`SWEEP_ROWS`]
    /// random rows each, fresh rows for every read, the depths' order
    /// rotated each round) and opens the floor at the depth with the lowest
    /// median batch time.
    pub fn fastest(t: &Table, page_bytes: u64, seed: u64) -> Result<(Floor, DepthSweep), IoError> {
        let floors = QUEUE_DEPTHS
            .iter()
            .map(|&qd| Floor::open(t, page_bytes, qd))
            .collect::<Result<Vec<_>, _>>()?;
        let rows = SWEEP_ROWS.min(usize::try_from(t.rows()).unwrap_or(usize::MAX).max(1));
        let mut rng = Rng::new(seed ^ 0xf100_4f1e);
        let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(SWEEP_ROUNDS); floors.len()];
        let mut extents = vec![0usize; floors.len()];
        for round in 0..SWEEP_ROUNDS {
            for k in (0..floors.len()).map(|i| (i + round) % floors.len()) {
                let list: Vec<u64> = (0..rows).map(|_| rng.below(t.rows())).collect();
                let ext = floors[k].extents(&list);
                let t0 = Instant::now();
                floors[k].read(&ext)?;
                times[k].push(t0.elapsed().as_secs_f64() * 1e6);
                extents[k] += ext.len();
            }
        }
        let points: Vec<DepthPoint> = floors
            .iter()
            .zip(times.iter_mut().zip(&extents))
            .map(|(f, (us, &n))| DepthPoint {
                queue_depth: f.queue_depth(),
                timing: Timing::of(us),
                extents: n as f64 / SWEEP_ROUNDS as f64,
            })
            .collect();
        let best = points
            .iter()
            .min_by(|a, b| a.timing.median_us.total_cmp(&b.timing.median_us))
            .map_or(QUEUE_DEPTHS[0], |p| p.queue_depth);
        let floor = floors
            .into_iter()
            .find(|f| f.queue_depth() == best)
            .expect("best is one of the depths swept");
        let sweep = DepthSweep {
            rows,
            rounds: SWEEP_ROUNDS,
            points,
            best,
            grain: floor.grain,
        };
        Ok((floor, sweep))
    }

    /// The queue depth reads use.
    pub fn queue_depth(&self) -> u32 {
        self.reader.config().queue_depth
    }

    /// How extents are cut.
    pub fn grain(&self) -> Grain {
        self.grain
    }

    /// The distinct extents of `rows` ([`row_extents`]; files numbered in
    /// the order of the table's files that hold rows).
    pub fn extents(&self, rows: &[u64]) -> Vec<FileExtent> {
        row_extents(&self.table, self.grain, rows)
    }

    /// Reads `extents` (from [`Floor::extents`]), one request each, all in
    /// flight together whatever file they are in.
    pub fn read(&self, extents: &[FileExtent]) -> Result<ReadStats, IoError> {
        self.reader.discard(extents)
    }

    /// Times `reps` reads of each batch's extents, microseconds per read.
    pub fn time_reads(&self, batches: &[Vec<u64>], reps: usize) -> Result<Vec<f64>, IoError> {
        let mut us = Vec::with_capacity(batches.len().saturating_mul(reps));
        for rows in batches {
            let extents = self.extents(rows);
            for _ in 0..reps {
                let t0 = Instant::now();
                self.read(&extents)?;
                us.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(us)
    }

    /// The floor of a replay phase that starts with the table evicted:
    /// each step's cold extents ([`phase_extents`]) read in step order,
    /// [`PHASE_PASSES`] passes, more while they have taken less than
    /// [`PHASE_BUDGET`] (at most [`MAX_PHASE_PASSES`]), or
    /// [`LONG_PHASE_PASSES`] when the first takes over [`LONG_PASS`]. The
    /// floor is the sum over steps of each step's median over the passes:
    /// one slow read moves one step's sample, not the sum.
    pub fn phase(&self, steps: &[&[u64]]) -> Result<PhaseFloor, IoError> {
        let mut samples = self.phase_samples(steps);
        let mut want = PHASE_PASSES;
        let mut spent = 0.0;
        while samples.passes() < want {
            let took = self.pass(&mut samples)?;
            if samples.passes() == 1 && took > LONG_PASS.as_secs_f64() * 1e6 {
                want = LONG_PHASE_PASSES;
            }
            spent += took;
            if samples.passes() == want
                && (PHASE_PASSES..MAX_PHASE_PASSES).contains(&want)
                && spent < PHASE_BUDGET.as_secs_f64() * 1e6
            {
                want += 1;
            }
        }
        Ok(samples.floor())
    }

    /// An empty set of passes over a replay phase's cold extents
    /// ([`phase_extents`]), to fill with [`Floor::pass`] at times of the
    /// caller's choosing: passes spread over a long run give a floor that
    /// a minute's drift of a shared disk does not move.
    pub fn phase_samples(&self, steps: &[&[u64]]) -> PhaseSamples {
        let extents = phase_extents(&self.table, self.grain, steps);
        PhaseSamples {
            step_us: vec![Vec::new(); extents.len()],
            extents,
            passes: Vec::new(),
            last: ReadStats::default(),
            queue_depth: self.queue_depth(),
        }
    }

    /// One timed pass over `samples`' steps, in order; returns its
    /// microseconds.
    pub fn pass(&self, samples: &mut PhaseSamples) -> Result<f64, IoError> {
        let mut pass = ReadStats::default();
        let mut total = 0.0;
        for (ext, us) in samples.extents.iter().zip(&mut samples.step_us) {
            let t0 = Instant::now();
            if !ext.is_empty() {
                let s = self.read(ext)?;
                pass.requests += s.requests;
                pass.bytes += s.bytes;
            }
            let took = t0.elapsed().as_secs_f64() * 1e6;
            us.push(took);
            total += took;
        }
        samples.passes.push(total);
        samples.last = pass;
        Ok(total)
    }
}

/// Timed passes over one replay phase's cold extents ([`Floor::pass`]).
#[derive(Debug, Clone)]
pub struct PhaseSamples {
    extents: Vec<Vec<FileExtent>>,
    /// Per step, its time in every pass.
    step_us: Vec<Vec<f64>>,
    /// Whole passes.
    passes: Vec<f64>,
    /// What the last pass read.
    last: ReadStats,
    queue_depth: u32,
}

impl PhaseSamples {
    /// Passes taken.
    pub fn passes(&self) -> usize {
        self.passes.len()
    }

    /// The phase floor over the passes so far: the sum over steps of each
    /// step's median ([`PhaseFloor`]).
    pub fn floor(&self) -> PhaseFloor {
        let floor_us: f64 = self
            .step_us
            .iter()
            .map(|us| summary(&mut us.clone()).1)
            .sum();
        let (mean_us, _, p99_us) = summary(&mut self.passes.clone());
        PhaseFloor {
            steps: self.extents.len(),
            extents: self.last.requests,
            bytes: self.last.bytes,
            queue_depth: self.queue_depth,
            timing: Timing {
                samples: self.passes.len(),
                mean_us,
                median_us: floor_us,
                p99_us,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pleio::layout::ShardPart;

    fn part(file: usize, offset: u64, row_bytes: u64) -> ShardPart {
        ShardPart {
            tensor: "t".into(),
            file,
            offset,
            row_bytes,
        }
    }

    fn table(offset: u64, row_bytes: u64) -> Rows {
        Rows::new(vec![Shard {
            index: 0,
            row_start: 0,
            rows: 1 << 40,
            parts: vec![part(0, offset, row_bytes)],
        }])
    }

    /// The ranges of extents all in file 0.
    fn ranges(v: Vec<FileExtent>) -> Vec<Range<u64>> {
        v.into_iter()
            .map(|(f, r)| {
                assert_eq!(f, 0);
                r
            })
            .collect()
    }

    fn phase_ranges(v: Vec<Vec<FileExtent>>) -> Vec<Vec<Range<u64>>> {
        v.into_iter().map(ranges).collect()
    }

    const PAGES: Grain = Grain {
        block: 4096,
        page: 4096,
    };
    const BLOCKS: Grain = Grain {
        block: 512,
        page: 4096,
    };

    #[test]
    fn extents_merge_contiguous_pages_only() {
        // Gemma 4 Q5_K rows: 7392 bytes, from offset 4096.
        let t = table(4096, 7392);
        let p = |a: u64, b: u64| a * 4096..b * 4096;
        // Row 0: bytes 4096..11488, pages 1..=2. Row 1: 11488..18880,
        // pages 2..=4: contiguous with row 0, one extent. Row 10: bytes
        // 78016..85408, pages 19..=20. Row 12: 92800..100192, pages 22..=24.
        assert_eq!(
            ranges(row_extents(&t, PAGES, &[10, 1, 0, 12, 0])),
            vec![p(1, 5), p(19, 21), p(22, 25)]
        );
        // Rows 11 (85408..92800, pages 20..=22) joins 10 and 12.
        assert_eq!(
            ranges(row_extents(&t, PAGES, &[10, 11, 12])),
            vec![p(19, 25)]
        );
        assert!(ranges(row_extents(&t, PAGES, &[])).is_empty());
        // In 512-byte blocks, the same extents trimmed to the blocks the
        // end rows need: rows 0 and 1 are blocks 8..=36, row 10 152..=166,
        // row 12 181..=195.
        let b = |a: u64, z: u64| a * 512..z * 512;
        assert_eq!(
            ranges(row_extents(&t, BLOCKS, &[10, 1, 0, 12])),
            vec![b(8, 37), b(152, 167), b(181, 196)]
        );
        // Small rows: one page's rows are one extent from the first row's
        // block to the last row's; the next page's rows join it.
        let q = table(0, 90);
        assert_eq!(ranges(row_extents(&q, PAGES, &[0, 3, 40])), vec![p(0, 1)]);
        assert_eq!(ranges(row_extents(&q, PAGES, &[0, 46])), vec![p(0, 2)]);
        // Rows 3 (270..360) and 40 (3600..3690): blocks 0 and 7, one page.
        assert_eq!(ranges(row_extents(&q, BLOCKS, &[40, 3])), vec![b(0, 8)]);
        // Row 46 (4140..4230) is block 8: page 1 follows page 0.
        assert_eq!(ranges(row_extents(&q, BLOCKS, &[3, 46])), vec![b(0, 9)]);
        // Row 100 (9000..9090), block 17, page 2: joins page 1's row 46.
        assert_eq!(ranges(row_extents(&q, BLOCKS, &[46, 100])), vec![b(8, 18)]);
        // Row 300 (27000..27090), page 6: apart.
        assert_eq!(
            ranges(row_extents(&q, BLOCKS, &[3, 300])),
            vec![b(0, 1), b(52, 53)]
        );
    }

    #[test]
    fn phase_extents_leave_out_what_earlier_steps_read() {
        let t = table(4096, 7392);
        let p = |a: u64, b: u64| a * 4096..b * 4096;
        let steps: [&[u64]; 3] = [&[0, 10], &[1, 10], &[0]];
        // Step 1: row 1's pages 2..=4 minus page 2 (row 0's); row 10 known.
        assert_eq!(
            phase_ranges(phase_extents(&t, PAGES, &steps)),
            vec![vec![p(1, 3), p(19, 21)], vec![p(3, 5)], vec![]]
        );
        // In blocks: row 1's blocks on page 2 are left out with the page.
        let b = |a: u64, z: u64| a * 512..z * 512;
        assert_eq!(
            phase_ranges(phase_extents(&t, BLOCKS, &steps[..2])),
            vec![vec![b(8, 23), b(152, 167)], vec![b(24, 37)]]
        );
        // Small rows: row 40 shares page 0 with row 3, read before.
        let q = table(0, 90);
        let steps: [&[u64]; 3] = [&[3], &[40, 46], &[3, 40]];
        assert_eq!(
            phase_ranges(phase_extents(&q, BLOCKS, &steps)),
            vec![vec![b(0, 1)], vec![b(8, 9)], vec![]]
        );
    }

    /// The floor's extents as it cut them before the coalescer: each
    /// row's parts found by a search, their blocks sorted and deduplicated,
    /// a block joining the extent before it in the same file when its page
    /// is that extent's last page or the next.
    fn reference(
        shards: &[Shard],
        g: Grain,
        rows: &[u64],
        skip: &[(usize, u64)],
    ) -> Vec<FileExtent> {
        let mut blocks = Vec::new();
        for &r in rows {
            let i = shards.partition_point(|s| s.row_start <= r);
            let Some(s) = i.checked_sub(1).map(|i| &shards[i]) else {
                continue;
            };
            let Some(k) = r.checked_sub(s.row_start).filter(|&k| k < s.rows) else {
                continue;
            };
            for p in &s.parts {
                let start = p.offset + k * p.row_bytes;
                let end = start + p.row_bytes;
                blocks.extend((start / g.block..=(end - 1) / g.block).map(|b| (p.file, b)));
            }
        }
        blocks.sort_unstable();
        blocks.dedup();
        let mut out: Vec<FileExtent> = Vec::new();
        for (file, b) in blocks {
            if skip.contains(&(file, b * g.block / g.page)) {
                continue;
            }
            let (start, end) = (b * g.block, (b + 1) * g.block);
            match out.last_mut() {
                Some((f, e)) if *f == file && start / g.page <= (e.end - 1) / g.page + 1 => {
                    e.end = end
                }
                _ => out.push((file, start..end)),
            }
        }
        out
    }

    #[test]
    fn extents_are_those_of_the_floor_before_the_coalescer() {
        let mut rng = crate::random::Rng::new(22);
        for case in 0..300 {
            // Up to four shards (equal but the last, or not), one to three
            // parts each in up to three files, rows of 1..9000 bytes.
            let n = 1 + rng.below(4) as usize;
            let parts = 1 + rng.below(3) as usize;
            let equal = rng.below(2) == 0;
            let lens: Vec<u64> = (0..parts).map(|_| 1 + rng.below(9000)).collect();
            let mut row_start = 0;
            let shards: Vec<Shard> = (0..n)
                .map(|index| {
                    let rows = if equal { 50 } else { 1 + rng.below(80) };
                    let s = Shard {
                        index,
                        row_start,
                        rows,
                        parts: lens
                            .iter()
                            .enumerate()
                            .map(|(k, &len)| {
                                part(
                                    rng.below(3) as usize,
                                    (index * 3 + k) as u64 * 2_000_000 + rng.below(5000),
                                    len,
                                )
                            })
                            .collect(),
                    };
                    row_start += rows;
                    s
                })
                .collect();
            let g = [PAGES, BLOCKS][case % 2];
            let t = Rows::new(shards.clone());
            let rows: Vec<u64> = (0..rng.below(60))
                .map(|_| rng.below(row_start + 5))
                .collect();
            assert_eq!(
                row_extents(&t, g, &rows),
                reference(&shards, g, &rows, &[]),
                "case {case}"
            );
            // Phases: the second step leaves out the first step's pages.
            let (a, b) = rows.split_at(rows.len() / 2);
            let first = reference(&shards, g, a, &[]);
            let seen: Vec<(usize, u64)> = first
                .iter()
                .flat_map(|(f, r)| (r.start / g.page..r.end.div_ceil(g.page)).map(move |p| (*f, p)))
                .collect();
            assert_eq!(
                phase_extents(&t, g, &[a, b]),
                vec![first, reference(&shards, g, b, &seen)],
                "case {case}"
            );
        }
    }

    #[test]
    fn extents_of_shards_in_several_files_stay_apart() {
        // Two shards of 100 rows, three parts each (MLX 4-bit: weights 80 B,
        // scales 10 B, biases 10 B per row); shard 0 in file 0 (weights at
        // 4096, scales at 20480, biases at 24576), shard 1 in file 1 at the
        // same offsets, so equal offsets in two files must not merge.
        let shard = |index: usize, file: usize| Shard {
            index,
            row_start: index as u64 * 100,
            rows: 100,
            parts: vec![
                part(file, 4096, 80),
                part(file, 20480, 10),
                part(file, 24576, 10),
            ],
        };
        let t = Rows::new(vec![shard(0, 0), shard(1, 1)]);
        let b = |f: usize, a: u64, z: u64| (f, a * 512..z * 512);
        // Row 0: weights block 8, scales block 40, biases block 48; row
        // 100 the same blocks of file 1. Scales and biases are pages 5 and
        // 6, contiguous: one extent.
        assert_eq!(
            row_extents(&t, BLOCKS, &[100, 0]),
            vec![b(0, 8, 9), b(0, 40, 49), b(1, 8, 9), b(1, 40, 49)]
        );
        // Past the last shard: nothing.
        assert!(row_extents(&t, BLOCKS, &[200]).is_empty());
        // A page read in file 0 is not read in file 1.
        let steps: [&[u64]; 2] = [&[0], &[1, 101]];
        assert_eq!(
            phase_extents(&t, BLOCKS, &steps),
            vec![
                vec![b(0, 8, 9), b(0, 40, 49)],
                vec![b(1, 8, 9), b(1, 40, 49)]
            ]
        );
    }
}
