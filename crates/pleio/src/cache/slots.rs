//! Which row lives in which slot: the bookkeeping of one cache shard
//! without the row bytes (so the policy simulator runs the very code the
//! cache runs).

use crate::sys::Zeroed;
use super::index::Index;
use super::policy::{CachePolicy, Order};

/// A fixed number of slots, each holding one row id, with an eviction
/// order. Allocated once; [`Slots::bytes_for`] says how much.
#[derive(Debug, Clone)]
pub struct Slots {
    index: Index,
    keys: Zeroed<u64>,
    order: Order,
    used: usize,
}

/// Where [`Slots::insert`] put a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// The slot now holding the row.
    pub slot: u32,
    /// The row that held the slot before and was evicted, if the slots were
    /// full.
    pub evicted: Option<u64>,
}

impl Slots {
    /// `capacity` empty slots (at most `u32::MAX - 1`) ordered by `policy`.
    pub fn new(policy: CachePolicy, capacity: usize) -> Slots {
        let capacity = capacity.min(u32::MAX as usize - 1);
        Slots {
            index: Index::new(capacity),
            // Zeroed: only filled slots' keys are ever read.
            keys: Zeroed::new(capacity),
            order: Order::new(policy, capacity),
            used: 0,
        }
    }

    /// Bytes that `Slots::new(policy, capacity)` allocates.
    pub fn bytes_for(policy: CachePolicy, capacity: usize) -> u64 {
        Index::bytes_for(capacity) + capacity as u64 * 8 + Order::bytes_for(policy, capacity)
    }

    /// The slot of `row`, counting a hit for the eviction order.
    #[inline]
    pub fn get(&mut self, row: u64) -> Option<u32> {
        let slot = self.index.get(row, &self.keys)?;
        self.order.hit(slot);
        Some(slot)
    }

    /// The slot of `row`, without counting a hit.
    #[inline]
    pub fn peek(&self, row: u64) -> Option<u32> {
        self.index.get(row, &self.keys)
    }

    /// Where `row`'s lookup starts: the first of four stages that let a
    /// batch's lookups wait for memory together, not one after another
    /// ([`crate::cache::RowCache::lookup_many`]). Valid until the slots
    /// next change.
    #[inline]
    pub(crate) fn home(&self, row: u64) -> usize {
        self.index.home(row)
    }

    /// The second stage: asks memory for the index bucket at `home`.
    #[inline]
    pub(crate) fn prefetch_bucket(&self, home: usize) {
        self.index.prefetch_home(home);
    }

    /// The third stage: asks memory for the keys the bucket run at `home`
    /// names.
    #[inline]
    pub(crate) fn prefetch_keys(&self, home: usize) {
        self.index.prefetch_run_keys(home, &self.keys, 4);
    }

    /// The fourth stage: the slot of `row` (whose [`Slots::home`] is
    /// `home`), as [`Slots::peek`], with its eviction-order entry asked of
    /// memory; count the hit with [`Slots::hit`].
    #[inline]
    pub(crate) fn find_prefetch(&self, home: usize, row: u64) -> Option<u32> {
        let slot = self.index.get_from(home, row, &self.keys)?;
        self.order.prefetch_hit(slot);
        Some(slot)
    }

    /// Counts a hit on `slot` (found by [`Slots::find_prefetch`]) for the
    /// eviction order.
    #[inline]
    pub(crate) fn hit(&mut self, slot: u32) {
        self.order.hit(slot);
    }

    /// Puts `row` (not present) in a free slot, or evicts a row to make
    /// room. `None` if there are no slots at all.
    pub fn insert(&mut self, row: u64) -> Option<Placed> {
        debug_assert!(self.index.get(row, &self.keys).is_none());
        if self.keys.is_empty() {
            return None;
        }
        let (slot, evicted) = if self.used < self.keys.len() {
            self.used += 1;
            ((self.used - 1) as u32, None)
        } else {
            let v = self.order.victim(&self.keys);
            let old = self.keys[v as usize];
            self.index.remove(old, &self.keys);
            (v, Some(old))
        };
        self.keys[slot as usize] = row;
        self.index.insert(row, slot, &self.keys);
        self.order.fill(slot, row);
        Some(Placed { slot, evicted })
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.keys.len()
    }

    /// Forgets every row (keeps the allocations).
    pub fn clear(&mut self) {
        self.index.clear();
        self.order.clear();
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn slots_track_rows_exactly_under_every_policy() {
        for &p in CachePolicy::ALL {
            let mut s = Slots::new(p, 50);
            let mut held: HashSet<u64> = HashSet::new();
            let mut x = 99u64;
            for _ in 0..10_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(7);
                let row = (x >> 35) % 120;
                match s.get(row) {
                    Some(slot) => {
                        assert!(held.contains(&row), "{p}: phantom hit");
                        assert_eq!(s.keys[slot as usize], row);
                    }
                    None => {
                        assert!(!held.contains(&row), "{p}: lost row {row}");
                        let placed = s.insert(row).unwrap();
                        if let Some(old) = placed.evicted {
                            assert!(held.remove(&old), "{p}: evicted a row it did not hold");
                        }
                        held.insert(row);
                        assert_eq!(s.peek(row), Some(placed.slot));
                    }
                }
                assert_eq!(s.len(), held.len());
                assert!(s.len() <= 50);
            }
            s.clear();
            assert!(s.is_empty() && s.peek(3).is_none());
        }
    }

    #[test]
    fn zero_slots_hold_nothing() {
        let mut s = Slots::new(CachePolicy::Sieve, 0);
        assert_eq!(s.insert(4), None);
        assert_eq!(s.get(4), None);
    }

    #[test]
    fn bytes_for_matches_the_allocations() {
        // Index and order sizes are checked in their own modules; here the
        // sum is what the cache budgets.
        for &p in CachePolicy::ALL {
            let b = Slots::bytes_for(p, 1000);
            assert!(b > 1000 * 8 && b < 1000 * 64, "{p}: {b}");
        }
    }
}
