//! Replays a row-id stream through the row cache's bookkeeping, without
//! bytes or I/O, to compare eviction policies by hit rate.
//!
//! The simulation runs the engine's own code ([`pleio::cache::Slots`],
//! sized by [`pleio::cache::Sizing`] from the same budget and split over
//! the same shards by [`pleio::cache::shard_of`]) and follows the `cached`
//! strategy's order of work: per gather, the distinct rows ascending are
//! looked up (a hit counts for the policy), then the missing ones are
//! inserted in the same order. So its hit rate is the one a single-threaded
//! replay through `cached` gets, at a tiny fraction of the time.

use pleio::cache::{shard_of, CacheError, CachePolicy, Sizing, Slots};

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

/// Runs `gathers` (each a gather's row ids, duplicates allowed) through a
/// cache of `budget` bytes for rows of `row_bytes` read with alignment
/// `align`, evicting by `policy`.
pub fn simulate<'a>(
    gathers: impl IntoIterator<Item = &'a [u64]>,
    budget: u64,
    row_bytes: usize,
    align: usize,
    policy: CachePolicy,
) -> Result<SimResult, CacheError> {
    let sizing = Sizing::for_budget(budget, row_bytes, align, policy)?;
    let mut cache = SimCache::new(&sizing);
    let mut r = SimResult {
        policy,
        budget,
        capacity: sizing.capacity(),
        lookups: 0,
        hits: 0,
        evictions: 0,
    };
    let mut distinct = Vec::new();
    let mut missing = Vec::new();
    for rows in gathers {
        distinct.clear();
        distinct.extend_from_slice(rows);
        distinct.sort_unstable();
        distinct.dedup();
        missing.clear();
        for &row in &distinct {
            if cache.shard(row).get(row).is_some() {
                r.hits += 1;
            } else {
                missing.push(row);
            }
        }
        r.lookups += distinct.len() as u64;
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

    #[test]
    fn a_stream_that_fits_misses_only_once_per_row() {
        let gathers: Vec<Vec<u64>> = (0..10).map(|_| (0..500).collect()).collect();
        for &p in CachePolicy::ALL {
            let r = simulate(gathers.iter().map(Vec::as_slice), 1 << 20, 90, 4096, p).unwrap();
            assert_eq!((r.lookups, r.misses(), r.evictions), (5000, 500, 0), "{p}");
            assert!((r.hit_rate() - 0.9).abs() < 1e-12);
        }
    }

    #[test]
    fn duplicates_in_a_gather_are_one_lookup() {
        let gathers = [vec![1u64, 1, 1, 2], vec![2, 2]];
        let r = simulate(
            gathers.iter().map(Vec::as_slice),
            1 << 20,
            90,
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
        let budget = 256 << 10;
        for &p in CachePolicy::ALL {
            let s = Sizing::for_budget(budget, 90, 4096, p).unwrap();
            assert_eq!(s.shards, 1);
            let rows: Vec<u64> = (0..s.capacity() * 2).collect();
            let gathers: Vec<&[u64]> = (0..10).flat_map(|_| rows.chunks(100)).collect();
            let r = simulate(gathers.iter().copied(), budget, 90, 4096, p).unwrap();
            assert_eq!(r.evictions, r.misses() - s.capacity(), "{p}");
            if p == CachePolicy::Lru {
                assert_eq!(r.hits, 0);
            }
        }
    }
}
