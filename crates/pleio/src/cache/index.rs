//! A map from row ids to slot numbers over a caller's key array: open
//! addressing with linear probing and backward-shift deletion.
//!
//! The row cache needs its memory bounded before it holds a single row, so
//! this table is sized for a maximum number of entries when built
//! ([`Index::bytes_for`]) with the load at most 3/4; but it starts small
//! and doubles as entries arrive, up to that size, so an unused budget
//! costs nothing (a hash table's inserts land on random pages: a table
//! allocated whole for a 1 TiB budget took 5 GB of resident memory to
//! index 110 MB of rows). A bucket holds only a slot number plus one (4
//! bytes, 0 = empty, so a fresh table is zeroed memory the OS maps
//! lazily); the row id is the caller's `keys[slot]`, which the cache keeps
//! anyway to know what it evicts.

/// Marks an empty bucket.
const EMPTY: u32 = 0;

/// Buckets of a new index (when its capacity allows that many): 16 KiB.
const FIRST_BUCKETS: usize = 4096;

/// Row id -> slot for at most `capacity` entries, keys in `keys[slot]`.
#[derive(Debug, Clone)]
pub(crate) struct Index {
    buckets: Vec<u32>,
    len: usize,
    capacity: usize,
}

/// The bucket count for `capacity` entries (load at most 3/4).
fn buckets_for(capacity: usize) -> usize {
    (capacity.saturating_mul(4) / 3 + 1).max(2)
}

/// A 64-bit multiplicative hash (Fibonacci hashing); the top bits are the
/// best mixed.
#[inline]
pub(crate) fn mix(key: u64) -> u64 {
    (key ^ (key >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Index {
    /// An empty index for at most `capacity` entries.
    pub(crate) fn new(capacity: usize) -> Index {
        let full = buckets_for(capacity);
        // The largest `full >> k` not above FIRST_BUCKETS (or `full`), so
        // every size it grows through is `full >> j`.
        let mut first = full;
        while first > FIRST_BUCKETS {
            first = first.div_ceil(2);
        }
        Index {
            buckets: vec![EMPTY; first],
            len: 0,
            capacity,
        }
    }

    /// The most an index for `capacity` entries allocates at once: its
    /// full table plus the half-size one it grew from.
    pub(crate) fn bytes_for(capacity: usize) -> u64 {
        let full = buckets_for(capacity) as u64;
        let before = if full as usize > FIRST_BUCKETS {
            full.div_ceil(2)
        } else {
            0
        };
        (full + before) * 4
    }

    /// Buckets allocated now.
    #[cfg(test)]
    pub(crate) fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Doubles the table (up to its full size) when one more entry would
    /// load it past 3/4, rehashing every entry from `keys`.
    fn grow_for_one_more(&mut self, keys: &[u64]) {
        let full = buckets_for(self.capacity);
        let n = self.buckets.len();
        if n >= full || (self.len + 1).saturating_mul(4) <= n.saturating_mul(3) {
            return;
        }
        // Sizes run full >> k ..= full: the next one up.
        let mut next = full;
        while next.div_ceil(2) > n {
            next = next.div_ceil(2);
        }
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; next]);
        for s in old.into_iter().filter(|&s| s != EMPTY) {
            let mut i = self.home(keys[s as usize - 1]);
            while self.buckets[i] != EMPTY {
                i = self.step(i);
            }
            self.buckets[i] = s;
        }
    }

    /// The bucket `key`'s probe run starts at (valid until the index
    /// next changes).
    #[inline]
    pub(crate) fn home(&self, key: u64) -> usize {
        // The top 32 bits of the hash scaled to the table size (no power
        // of two needed).
        (((mix(key) >> 32) * self.buckets.len() as u64) >> 32) as usize
    }

    #[inline]
    fn step(&self, i: usize) -> usize {
        if i + 1 == self.buckets.len() {
            0
        } else {
            i + 1
        }
    }

    /// The slot of `key`, if present.
    #[inline]
    pub(crate) fn get(&self, key: u64, keys: &[u64]) -> Option<u32> {
        self.get_from(self.home(key), key, keys)
    }

    /// The slot of `key`, whose [`Index::home`] is `home`, if present.
    #[inline]
    pub(crate) fn get_from(&self, home: usize, key: u64, keys: &[u64]) -> Option<u32> {
        let mut i = home;
        loop {
            let s = self.buckets[i];
            if s == EMPTY {
                return None;
            }
            if keys[s as usize - 1] == key {
                return Some(s - 1);
            }
            i = self.step(i);
        }
    }

    /// Asks memory for bucket `home` (a software prefetch; see
    /// [`crate::sys::prefetch_lines`]).
    #[inline]
    pub(crate) fn prefetch_home(&self, home: usize) {
        if let Some(b) = self.buckets.get(home) {
            crate::sys::prefetch_lines((b as *const u32).cast(), 4, 1);
        }
    }

    /// Asks memory for the keys of the slots in the probe run starting at
    /// bucket `home` (its buckets read, so best after
    /// [`Index::prefetch_home`]), at most `max` of them.
    #[inline]
    pub(crate) fn prefetch_run_keys(&self, home: usize, keys: &[u64], max: usize) {
        let mut i = home;
        for _ in 0..max {
            let Some(&s) = self.buckets.get(i) else { return };
            if s == EMPTY {
                return;
            }
            if let Some(k) = keys.get(s as usize - 1) {
                crate::sys::prefetch_lines((k as *const u64).cast(), 8, 1);
            }
            i = self.step(i);
        }
    }

    /// Adds `key -> slot` (`key` absent, `keys[slot] == key`). Returns
    /// false (and changes nothing) if the index is full.
    pub(crate) fn insert(&mut self, key: u64, slot: u32, keys: &[u64]) -> bool {
        debug_assert_eq!(keys[slot as usize], key);
        if self.len >= self.capacity || slot == u32::MAX {
            return false;
        }
        self.grow_for_one_more(keys);
        let mut i = self.home(key);
        while self.buckets[i] != EMPTY {
            i = self.step(i);
        }
        self.buckets[i] = slot + 1;
        self.len += 1;
        true
    }

    /// Removes `key` (with `keys` still holding it), returning its slot.
    pub(crate) fn remove(&mut self, key: u64, keys: &[u64]) -> Option<u32> {
        let n = self.buckets.len();
        let mut i = self.home(key);
        loop {
            let s = self.buckets[i];
            if s == EMPTY {
                return None;
            }
            if keys[s as usize - 1] == key {
                break;
            }
            i = self.step(i);
        }
        let slot = self.buckets[i] - 1;
        // Backward-shift: pull later members of the probe run into the hole
        // so lookups never need tombstones.
        let mut hole = i;
        let mut j = self.step(i);
        loop {
            let s = self.buckets[j];
            if s == EMPTY {
                break;
            }
            let home = self.home(keys[s as usize - 1]);
            // The entry at `j` may move to `hole` unless its home lies in
            // (hole, j] (cyclically).
            let dist_home = (j + n - home) % n;
            let dist_hole = (j + n - hole) % n;
            if dist_home >= dist_hole {
                self.buckets[hole] = s;
                hole = j;
            }
            j = self.step(j);
        }
        self.buckets[hole] = EMPTY;
        self.len -= 1;
        Some(slot)
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Forgets every entry (keeps the allocation as grown so far).
    pub(crate) fn clear(&mut self) {
        self.buckets.fill(EMPTY);
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn grows_with_its_entries_not_its_capacity() {
        // A capacity of 10^8 entries (a 1 TiB budget's worth of slots per
        // shard and more) starts at 16 KiB of buckets.
        let cap = 100_000_000;
        let mut ix = Index::new(cap);
        assert!(ix.buckets() <= FIRST_BUCKETS, "{}", ix.buckets());
        let n = 50_000usize;
        let keys: Vec<u64> = (0..n as u64).map(|k| k * 7919 + 3).collect();
        for (slot, &k) in keys.iter().enumerate() {
            assert!(ix.insert(k, slot as u32, &keys));
        }
        // Grown to hold them at load <= 3/4, nowhere near the full size.
        assert!(
            ix.buckets() * 3 >= n * 4 && ix.buckets() <= 4 * n,
            "{}",
            ix.buckets()
        );
        for (slot, &k) in keys.iter().enumerate() {
            assert_eq!(ix.get(k, &keys), Some(slot as u32));
        }
        assert_eq!(ix.get(1, &keys), None);
        // A small capacity never grows past its full size.
        let mut small = Index::new(10);
        let keys: Vec<u64> = (100..110).collect();
        for (slot, &k) in keys.iter().enumerate() {
            assert!(small.insert(k, slot as u32, &keys));
        }
        assert_eq!(small.buckets(), buckets_for(10));
        // A full index refuses one more (`keys` holds the newcomer at its
        // slot, as the contract asks).
        assert!(!small.insert(5, 0, &[5]));
        assert!(Index::bytes_for(cap) >= buckets_for(cap) as u64 * 4);
    }

    #[test]
    fn agrees_with_a_hash_map_under_churn() {
        let cap = 300;
        let mut ix = Index::new(cap);
        // Slot -> key, as the cache keeps it; free slots are reused.
        let mut keys = vec![u64::MAX; cap];
        let mut free: Vec<u32> = (0..cap as u32).rev().collect();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut x = 12345u64;
        for _ in 0..50_000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Keys from a small range so inserts, hits and removes all
            // happen, many consecutive to exercise probe runs.
            let key = (x >> 33) % 700;
            match x >> 62 {
                0 | 1 => {
                    if model.contains_key(&key) {
                        continue;
                    }
                    match free.pop() {
                        Some(slot) => {
                            keys[slot as usize] = key;
                            assert!(ix.insert(key, slot, &keys));
                            model.insert(key, slot);
                        }
                        None => assert_eq!(model.len(), cap),
                    }
                }
                2 => {
                    let got = ix.remove(key, &keys);
                    assert_eq!(got, model.remove(&key));
                    if let Some(slot) = got {
                        keys[slot as usize] = u64::MAX;
                        free.push(slot);
                    }
                }
                _ => assert_eq!(ix.get(key, &keys), model.get(&key).copied()),
            }
            assert_eq!(ix.len(), model.len());
        }
        for (&k, &v) in &model {
            assert_eq!(ix.get(k, &keys), Some(v));
        }
        // Full: one more is refused.
        let mut ix = Index::new(2);
        let keys = [10u64, 11, 12];
        assert!(ix.insert(10, 0, &keys) && ix.insert(11, 1, &keys));
        assert!(!ix.insert(12, 2, &keys));
        ix.clear();
        assert_eq!((ix.len(), ix.get(10, &keys)), (0, None));
    }

    #[test]
    fn size_is_known_before_use() {
        for cap in [0usize, 1, 2, 3, 100, 1000, 12345] {
            let mut ix = Index::new(cap);
            assert!(Index::bytes_for(cap) >= ix.buckets.len() as u64 * 4);
            // Filled to capacity: at its full size, within the bound, load
            // at most 3/4.
            let keys: Vec<u64> = (0..cap as u64).collect();
            for (slot, &k) in keys.iter().enumerate() {
                assert!(ix.insert(k, slot as u32, &keys));
            }
            assert!(Index::bytes_for(cap) >= ix.buckets.len() as u64 * 4);
            assert!(ix.buckets.len() * 3 >= cap * 4, "load at most 3/4");
        }
    }
}
