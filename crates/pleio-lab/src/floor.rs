//! The device floor: the least time this device takes to deliver a batch's
//! bytes, against which every strategy is measured (`limit` in `pleio bench`
//! and `pleio demo`, the floor of a replay's prefill and decode).
//!
//! The floor reads a batch's distinct byte *extents*: the pages its rows
//! touch, contiguous pages merged (as the best strategy would read them: a
//! Gemma 4 row of 7392 bytes spans two or three pages and is one request,
//! not three), each extent trimmed at both ends to the `O_DIRECT` blocks
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
use std::path::Path;
use std::time::{Duration, Instant};

use pleio::io::{IoError, ReadStats, UringBackend, UringConfig};
use pleio::layout::Layout;
use rustc_hash::FxHashSet;

use crate::bench::summary;
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

/// Where a table's rows lie in its file: what the floor needs of a
/// [`Layout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    /// Byte offset of row 0 in the file.
    pub offset: u64,
    /// Bytes per row.
    pub row_bytes: u64,
}

impl From<&Layout> for Rows {
    fn from(l: &Layout) -> Rows {
        Rows {
            offset: l.offset(),
            row_bytes: l.row_bytes(),
        }
    }
}

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

/// The distinct block indices that `rows` of `t` touch, sorted.
fn blocks_of(t: &Rows, g: Grain, rows: &[u64]) -> Vec<u64> {
    let rb = t.row_bytes.max(1);
    let mut blocks: Vec<u64> = Vec::with_capacity(rows.len() * 2);
    for &r in rows {
        let start = t.offset.saturating_add(r.saturating_mul(rb));
        let last = start.saturating_add(rb - 1);
        blocks.extend(start / g.block..=last / g.block);
    }
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

/// Sorted block indices as byte extents: a block joins the extent before
/// it when its page is that extent's last page or the next one.
fn merge(blocks: &[u64], g: Grain) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for &b in blocks {
        let (start, end) = (b * g.block, (b + 1) * g.block);
        match out.last_mut() {
            Some(e) if start / g.page <= (e.end - 1) / g.page + 1 => e.end = end,
            _ => out.push(start..end),
        }
    }
    out
}

/// The distinct byte extents `rows` of table `t` occupy, in file order (see
/// [`Grain`]).
pub fn row_extents(t: &Rows, g: Grain, rows: &[u64]) -> Vec<Range<u64>> {
    merge(&blocks_of(t, g, rows), g)
}

/// The extents each step of a phase reads cold when the phase starts with
/// the table evicted: blocks on a page an earlier step touched are left out,
/// as the page cache of the strategies that fill it holds that whole page.
pub fn phase_extents(t: &Rows, g: Grain, steps: &[&[u64]]) -> Vec<Vec<Range<u64>>> {
    let per_page = g.page / g.block;
    let mut seen_pages = FxHashSet::default();
    steps
        .iter()
        .map(|rows| {
            let blocks = blocks_of(t, g, rows);
            let cold: Vec<u64> = blocks
                .iter()
                .copied()
                .filter(|b| !seen_pages.contains(&(b / per_page)))
                .collect();
            seen_pages.extend(blocks.iter().map(|b| b / per_page));
            merge(&cold, g)
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
/// chosen queue depth.
#[derive(Debug)]
pub struct Floor {
    backend: UringBackend,
    table: Rows,
    grain: Grain,
}

impl Floor {
    /// The floor of table `t` of the file at `path` at `queue_depth`, with
    /// extents of whole `O_DIRECT` blocks ([`UringBackend::alignment`])
    /// merged across pages of `page_bytes` (see [`Grain`]).
    pub fn open(
        path: &Path,
        t: &Layout,
        page_bytes: u64,
        queue_depth: u32,
    ) -> Result<Floor, IoError> {
        let backend = UringBackend::open(
            path,
            UringConfig {
                queue_depth,
                direct: true,
                ..UringConfig::default()
            },
        )?;
        let page = page_bytes.max(1);
        let block = (backend.alignment() as u64).clamp(1, page);
        if !page.is_multiple_of(block) {
            return Err(IoError::DirectUnsupported {
                path: path.to_path_buf(),
                reason: format!("O_DIRECT alignment {block} does not divide the page size {page}"),
            });
        }
        Ok(Floor {
            backend,
            table: Rows::from(t),
            grain: Grain { block, page },
        })
    }

    /// Sweeps [`QUEUE_DEPTHS`] ([`SWEEP_ROUNDS`] batches of [`SWEEP_ROWS`]
    /// random rows each, fresh rows for every read, the depths' order
    /// rotated each round) and opens the floor at the depth with the lowest
    /// median batch time.
    pub fn fastest(
        path: &Path,
        t: &Layout,
        page_bytes: u64,
        seed: u64,
    ) -> Result<(Floor, DepthSweep), IoError> {
        if t.single_region().is_none() {
            return Err(IoError::DirectUnsupported {
                path: path.to_path_buf(),
                reason: "the device floor reads tables of one region of one file (GGUF); \
                         a checkpoint table's shards and parts are not measured yet"
                    .into(),
            });
        }
        let floors = QUEUE_DEPTHS
            .iter()
            .map(|&qd| Floor::open(path, t, page_bytes, qd))
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
        self.backend.config().queue_depth
    }

    /// How extents are cut.
    pub fn grain(&self) -> Grain {
        self.grain
    }

    /// The distinct extents of `rows` ([`row_extents`]).
    pub fn extents(&self, rows: &[u64]) -> Vec<Range<u64>> {
        row_extents(&self.table, self.grain, rows)
    }

    /// Reads `extents` (from [`Floor::extents`]), one request each.
    pub fn read(&self, extents: &[Range<u64>]) -> Result<ReadStats, IoError> {
        self.backend.read_extents(extents)
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
    extents: Vec<Vec<Range<u64>>>,
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

    fn table(offset: u64, row_bytes: u64) -> Rows {
        Rows { offset, row_bytes }
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
            row_extents(&t, PAGES, &[10, 1, 0, 12, 0]),
            vec![p(1, 5), p(19, 21), p(22, 25)]
        );
        // Rows 11 (85408..92800, pages 20..=22) joins 10 and 12.
        assert_eq!(row_extents(&t, PAGES, &[10, 11, 12]), vec![p(19, 25)]);
        assert!(row_extents(&t, PAGES, &[]).is_empty());
        // In 512-byte blocks, the same extents trimmed to the blocks the
        // end rows need: rows 0 and 1 are blocks 8..=36, row 10 152..=166,
        // row 12 181..=195.
        let b = |a: u64, z: u64| a * 512..z * 512;
        assert_eq!(
            row_extents(&t, BLOCKS, &[10, 1, 0, 12]),
            vec![b(8, 37), b(152, 167), b(181, 196)]
        );
        // Small rows: one page's rows are one extent from the first row's
        // block to the last row's; the next page's rows join it.
        let q = table(0, 90);
        assert_eq!(row_extents(&q, PAGES, &[0, 3, 40]), vec![p(0, 1)]);
        assert_eq!(row_extents(&q, PAGES, &[0, 46]), vec![p(0, 2)]);
        // Rows 3 (270..360) and 40 (3600..3690): blocks 0 and 7, one page.
        assert_eq!(row_extents(&q, BLOCKS, &[40, 3]), vec![b(0, 8)]);
        // Row 46 (4140..4230) is block 8: page 1 follows page 0.
        assert_eq!(row_extents(&q, BLOCKS, &[3, 46]), vec![b(0, 9)]);
        // Row 100 (9000..9090), block 17, page 2: joins page 1's row 46.
        assert_eq!(row_extents(&q, BLOCKS, &[46, 100]), vec![b(8, 18)]);
        // Row 300 (27000..27090), page 6: apart.
        assert_eq!(row_extents(&q, BLOCKS, &[3, 300]), vec![b(0, 1), b(52, 53)]);
    }

    #[test]
    fn phase_extents_leave_out_what_earlier_steps_read() {
        let t = table(4096, 7392);
        let p = |a: u64, b: u64| a * 4096..b * 4096;
        let steps: [&[u64]; 3] = [&[0, 10], &[1, 10], &[0]];
        // Step 1: row 1's pages 2..=4 minus page 2 (row 0's); row 10 known.
        assert_eq!(
            phase_extents(&t, PAGES, &steps),
            vec![vec![p(1, 3), p(19, 21)], vec![p(3, 5)], vec![]]
        );
        // In blocks: row 1's blocks on page 2 are left out with the page.
        let b = |a: u64, z: u64| a * 512..z * 512;
        assert_eq!(
            phase_extents(&t, BLOCKS, &steps[..2]),
            vec![vec![b(8, 23), b(152, 167)], vec![b(24, 37)]]
        );
        // Small rows: row 40 shares page 0 with row 3, read before.
        let q = table(0, 90);
        let steps: [&[u64]; 3] = [&[3], &[40, 46], &[3, 40]];
        assert_eq!(
            phase_extents(&q, BLOCKS, &steps),
            vec![vec![b(0, 1)], vec![b(8, 9)], vec![]]
        );
    }
}
