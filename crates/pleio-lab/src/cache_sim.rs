//! Replays a row-id stream through the row cache's bookkeeping, without
//! bytes or I/O, to compare eviction policies by hit rate.
//!
//! The simulation runs the engine's own code ([`pleio::cache::Slots`],
//! sized by [`Sizing::for_table`] from the same budget, table layout and
//! read alignment as the `cached` strategy, and split over
//! the same shards by [`pleio::cache::shard_of`]) and follows the `cached`
//! strategy's order of work: per gather, the distinct rows are looked up
//! in the order they first appear (a hit counts for the policy; the cache
//! goes shard by shard, but each shard's bookkeeping sees its rows in that
//! order), then the missing ones are inserted ascending (the order they are
//! read in). So its hit rate is the one a single-threaded replay through
//! `cached` gets, at a tiny fraction of the time.

use std::path::Path;

use pleio::cache::{shard_of, CacheError, CachePolicy, Sizing, Slots};
use pleio::io::{Engine, Reader, ReaderConfig};
use pleio::layout::Layout;
use pleio::Table;

/// One policy at one budget.
#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    /// The policy.
    pub policy: CachePolicy,
    /// The budget in bytes.
    pub budget: u64,
    /// Rows the budget holds.
    pub capacity: u64,
    /// Distinct rows looked up, summed over gathers.
    pub lookups: u64,
    /// Of those, hits.
    pub hits: u64,
    /// Rows evicted.
    pub evictions: u64,
}

impl SimResult {
    /// Hits over lookups.
    pub fn hit_rate(&self) -> f64 {
        if self.lookups == 0 {
            0.0
        } else {
            self.hits as f64 / self.lookups as f64
        }
    }

    /// Misses (rows the device would deliver).
    pub fn misses(&self) -> u64 {
        self.lookups - self.hits
    }
}

/// The shards of a cache sized for `budget`.
struct SimCache {
    shards: Vec<Slots>,
}

impl SimCache {
    fn new(s: &Sizing) -> SimCache {
        SimCache {
            shards: (0..s.shards)
                .map(|_| Slots::new(s.policy, s.slots_per_shard))
                .collect(),
        }
    }

    fn shard(&mut self, row: u64) -> &mut Slots {
        let n = self.shards.len();
        &mut self.shards[shard_of(row, n)]
    }
}

/// The alignment the `cached` strategy reads `table` with: its files'
/// common `O_DIRECT` alignment, found as the strategy finds it (an
/// `O_DIRECT` io_uring reader over the files holding rows), or 1 where it
/// would read buffered (no io_uring, or no `O_DIRECT`).
pub fn read_alignment(table: &Table) -> usize {
    let mut files: Vec<usize> = table.layout().regions().map(|r| r.file).collect();
    files.sort_unstable();
    files.dedup();
    let paths: Vec<&Path> = files.iter().map(|&f| table.file_path(f)).collect();
    let cfg = ReaderConfig {
        queue_depth: 1,
        direct: true,
        ..ReaderConfig::new(Engine::Uring)
    };
    Reader::open(&paths, cfg).map_or(1, |r| r.common_alignment())
}

/// Runs `gathers` (each a gather's row ids, duplicates allowed) through a
/// cache of `budget` bytes for the rows of `table` read with alignment
/// `align` ([`read_alignment`]), evicting by `policy`.
pub fn simulate<'a>(
    gathers: impl IntoIterator<Item = &'a [u64]>,
    budget: u64,
    table: &Layout,
    align: usize,
    policy: CachePolicy,
) -> Result<SimResult, CacheError> {
    let sizing = Sizing::for_table(budget, table, align, policy)?;
    let mut cache = SimCache::new(&sizing);
    let mut r = SimResult {
        policy,
        budget,
        capacity: sizing.capacity(),
        lookups: 0,
        hits: 0,
        evictions: 0,
    };
    let mut seen = std::collections::HashSet::new();
    let mut missing = Vec::new();
    for rows in gathers {
        seen.clear();
        missing.clear();
        for &row in rows {
            if !seen.insert(row) {
                continue;
            }
            if cache.shard(row).get(row).is_some() {
                r.hits += 1;
            } else {
                missing.push(row);
            }
        }
        r.lookups += seen.len() as u64;
        missing.sort_unstable();
        for &row in &missing {
            if let Some(p) = cache.shard(row).insert(row) {
                r.evictions += u64::from(p.evicted.is_some());
            }
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pleio::model::Model;

    /// A small synthetic PLE table in a GGUF file (kept alive by the
    /// returned file).
    fn table() -> (tempfile::NamedTempFile, Layout) {
        let file = tempfile::NamedTempFile::new().unwrap();
        crate::synth::SynthSpec::qwen(pleio::quant::GgmlType::IQ4_NL, 3000, 1)
            .write(file.reopen().unwrap(), &mut |_| {})
            .unwrap();
        let model = Model::open(file.path()).unwrap();
        let t = Layout::of_ple(&model).unwrap();
        (file, t)
    }

    #[test]
    fn the_simulated_cache_holds_as_many_rows_as_the_engines() {
        // A checkpoint of rows in three parts (MLX 4-bit: weights, scales,
        // biases) over three files: the simulator, sized from the table's
        // layout, holds exactly the rows the `cached` strategy's cache does
        // (sizing it for one part per row gave a different capacity).
        use crate::synth_ckpt::{write_checkpoint, CkptEncoding, CkptSpec};
        let tmp = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
        let dir = tmp.path().join("ckpt");
        let spec = CkptSpec {
            shards: 8,
            ..CkptSpec::new(CkptEncoding::Mlx4, 6000, 3, 42)
        };
        write_checkpoint(&spec, &dir, &mut |_| {}).unwrap();
        let table = Table::open(&dir)
            .unwrap()
            .with_strategy(pleio::Strategy::Cached);
        assert_eq!(table.layout().parts(), 3);
        let align = read_alignment(&table);
        for budget in [256u64 << 10, 1 << 20, 8 << 20] {
            let t = table.clone().with_budget(budget).unwrap();
            let mut out = vec![0f32; t.row_elems()];
            t.gather(&[7], &mut out).unwrap();
            let engine = t.cache_counters().unwrap().capacity;
            for &p in CachePolicy::ALL {
                let t = t.clone().with_cache_policy(p);
                t.gather(&[7], &mut out).unwrap();
                let sim = simulate([], budget, t.layout(), align, p).unwrap();
                assert_eq!(
                    sim.capacity,
                    t.cache_counters().unwrap().capacity,
                    "{p} {budget}"
                );
                if p == CachePolicy::default() {
                    assert_eq!(sim.capacity, engine);
                }
            }
        }
    }

    #[test]
    fn a_stream_that_fits_misses_only_once_per_row() {
        let (_f, t) = table();
        let gathers: Vec<Vec<u64>> = (0..10).map(|_| (0..500).collect()).collect();
        for &p in CachePolicy::ALL {
            let r = simulate(gathers.iter().map(Vec::as_slice), 1 << 20, &t, 4096, p).unwrap();
            assert_eq!((r.lookups, r.misses(), r.evictions), (5000, 500, 0), "{p}");
            assert!((r.hit_rate() - 0.9).abs() < 1e-12);
        }
    }

    #[test]
    fn duplicates_in_a_gather_are_one_lookup() {
        let (_f, t) = table();
        let gathers = [vec![1u64, 1, 1, 2], vec![2, 2]];
        let r = simulate(
            gathers.iter().map(Vec::as_slice),
            1 << 20,
            &t,
            1,
            CachePolicy::Sieve,
        )
        .unwrap();
        assert_eq!((r.lookups, r.hits), (3, 1));
    }

    #[test]
    fn a_scan_larger_than_the_cache_evicts_every_further_miss() {
        // Ten passes over twice the rows that fit (one shard at this
        // budget): LRU gets no hit at all, and under every policy each miss
        // after the cache filled evicts exactly one row.
        let (_f, t) = table();
        let budget = 256 << 10;
        for &p in CachePolicy::ALL {
            let s = Sizing::for_table(budget, &t, 4096, p).unwrap();
            assert_eq!(s.shards, 1);
            let rows: Vec<u64> = (0..s.capacity() * 2).collect();
            let gathers: Vec<&[u64]> = (0..10).flat_map(|_| rows.chunks(100)).collect();
            let r = simulate(gathers.iter().copied(), budget, &t, 4096, p).unwrap();
            assert_eq!(r.evictions, r.misses() - s.capacity(), "{p}");
            if p == CachePolicy::Lru {
                assert_eq!(r.hits, 0);
            }
        }
    }
}
