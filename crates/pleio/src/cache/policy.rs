//! Eviction orders: which cached slot makes room for the next row.
//!
//! Each order works on slot numbers `0..capacity` of fixed size and
//! allocates everything once ([`Order::bytes_for`]). A slot is filled with
//! [`Order::fill`] (the first `capacity` rows), touched with [`Order::hit`],
//! and when the cache is full [`Order::victim`] names the slot whose row
//! leaves; the new row then takes that slot with [`Order::fill`].
//!
//! - LRU: a doubly linked recency list; every hit moves a slot to the front.
//! - CLOCK: one reference bit per slot and a hand sweeping the slots.
//! - SIEVE (Zhang et al., NSDI 2024): a FIFO list with a visited bit; the
//!   hand moves from old to new, clearing bits, and evicts the first
//!   unvisited slot, leaving survivors in place.
//! - S3-FIFO (Yang et al., SOSP 2023): a small FIFO (10% of the slots) that
//!   filters rows seen once, a main FIFO with reinsertion (2-bit counts),
//!   and a ghost FIFO of recently evicted ids that sends a returning row
//!   straight to the main queue.
//!
//! Hits in CLOCK, SIEVE and S3-FIFO only set a bit or bump a counter; LRU
//! relinks on every hit.

use crate::sys::Zeroed;
use std::fmt;
use std::str::FromStr;

use super::index::Index;

/// How a full cache picks the row to evict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CachePolicy {
    /// Least recently used.
    Lru,
    /// CLOCK (second chance).
    Clock,
    /// SIEVE: FIFO order, visited bit, a hand that leaves survivors in place
    /// (the default: best hit rate on the row streams measured, with the
    /// cheapest hit; see docs/cache.md, "Which eviction policy").
    #[default]
    Sieve,
    /// S3-FIFO: small probationary FIFO, main FIFO, ghost ids.
    S3Fifo,
}

impl CachePolicy {
    /// Every policy.
    pub const ALL: &'static [CachePolicy] = &[
        CachePolicy::Lru,
        CachePolicy::Clock,
        CachePolicy::Sieve,
        CachePolicy::S3Fifo,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Lru => "lru",
            CachePolicy::Clock => "clock",
            CachePolicy::Sieve => "sieve",
            CachePolicy::S3Fifo => "s3-fifo",
        }
    }
}

impl fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CachePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.to_ascii_lowercase().replace('_', "-");
        let s = if s == "s3fifo" { "s3-fifo" } else { s.as_str() };
        CachePolicy::ALL
            .iter()
            .copied()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!("unknown cache policy {s:?} (known: lru, clock, sieve, s3-fifo)")
            })
    }
}

/// No slot.
const NIL: u32 = u32::MAX;

/// A doubly linked list over slot numbers (several lists may share the
/// link arrays, each slot in at most one of them).
#[derive(Debug, Clone)]
struct Links {
    /// Toward the head (newer).
    prev: Zeroed<u32>,
    /// Toward the tail (older).
    next: Zeroed<u32>,
}

/// One list's ends and length.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

impl Links {
    fn new(n: usize) -> Links {
        // Zeroed (so the OS maps it lazily): a slot's links are written
        // when it joins a list, before they are ever read.
        Links {
            prev: Zeroed::new(n),
            next: Zeroed::new(n),
        }
    }

    fn push_front(&mut self, l: &mut List, s: u32) {
        self.prev[s as usize] = NIL;
        self.next[s as usize] = l.head;
        if l.head != NIL {
            self.prev[l.head as usize] = s;
        } else {
            l.tail = s;
        }
        l.head = s;
        l.len += 1;
    }

    fn unlink(&mut self, l: &mut List, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            l.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            l.tail = p;
        }
        l.len -= 1;
    }
}

/// Least recently used.
#[derive(Debug, Clone)]
pub(crate) struct Lru {
    links: Links,
    list: List,
}

/// CLOCK: reference bits and a hand.
#[derive(Debug, Clone)]
pub(crate) struct Clock {
    bits: Zeroed<u8>,
    hand: u32,
}

/// SIEVE: FIFO list, visited bits, a hand moving from old to new.
#[derive(Debug, Clone)]
pub(crate) struct Sieve {
    links: Links,
    list: List,
    visited: Zeroed<u8>,
    hand: u32,
}

/// S3-FIFO's share of slots for the small queue, in tenths.
const S3_SMALL_TENTHS: usize = 1;
/// S3-FIFO's ghost size, in tenths of the slots.
const S3_GHOST_TENTHS: usize = 9;
/// Hits a row needs while in the small queue to move to the main queue.
/// The paper's pseudo-code says 2, its reference simulator's default is 1;
/// on the row streams measured (docs/cache.md) 1 gave the higher hit rate.
const S3_PROMOTE_HITS: u8 = 1;
/// Flag bit in `S3Fifo::meta`: the slot is in the main queue.
const IN_MAIN: u8 = 0x80;
/// Frequency bits in `S3Fifo::meta` (0..=3).
const FREQ: u8 = 0x03;

/// S3-FIFO: small and main FIFO queues sharing the slots, and a ghost FIFO
/// of row ids evicted from the small queue.
#[derive(Debug, Clone)]
pub(crate) struct S3Fifo {
    links: Links,
    small: List,
    main: List,
    meta: Zeroed<u8>,
    small_target: u32,
    capacity: u32,
    ghost: Ghost,
}

/// A FIFO of recently evicted row ids with membership lookups. The ring
/// holds ids plus one (0 = empty), so it starts as zeroed memory.
#[derive(Debug, Clone)]
struct Ghost {
    ring: Zeroed<u64>,
    at: usize,
    index: Index,
}

impl Ghost {
    fn new(n: usize) -> Ghost {
        Ghost {
            ring: Zeroed::new(n),
            at: 0,
            index: Index::new(n),
        }
    }

    fn bytes_for(n: usize) -> u64 {
        n as u64 * 8 + Index::bytes_for(n)
    }

    fn push(&mut self, key: u64) {
        if self.ring.is_empty() {
            return;
        }
        let k1 = key + 1;
        // An id is in the ring at most once (a returning id is taken out
        // before it can be evicted again), so the old one simply leaves.
        let old = self.ring[self.at];
        if old != 0 {
            self.index.remove(old, &self.ring);
        }
        self.ring[self.at] = k1;
        self.index.insert(k1, self.at as u32, &self.ring);
        self.at = (self.at + 1) % self.ring.len();
    }

    /// True (and forgets it) if `key` was evicted recently.
    fn take(&mut self, key: u64) -> bool {
        match self.index.remove(key + 1, &self.ring) {
            Some(at) => {
                self.ring[at as usize] = 0;
                true
            }
            None => false,
        }
    }

    fn clear(&mut self) {
        self.ring.fill(0);
        self.index.clear();
        self.at = 0;
    }
}

/// The eviction order of one set of slots.
#[derive(Debug, Clone)]
pub(crate) enum Order {
    Lru(Lru),
    Clock(Clock),
    Sieve(Sieve),
    S3Fifo(S3Fifo),
}

impl Order {
    /// An empty order over `capacity` slots.
    pub(crate) fn new(policy: CachePolicy, capacity: usize) -> Order {
        match policy {
            CachePolicy::Lru => Order::Lru(Lru {
                links: Links::new(capacity),
                list: List::EMPTY,
            }),
            CachePolicy::Clock => Order::Clock(Clock {
                bits: Zeroed::new(capacity),
                hand: 0,
            }),
            CachePolicy::Sieve => Order::Sieve(Sieve {
                links: Links::new(capacity),
                list: List::EMPTY,
                visited: Zeroed::new(capacity),
                hand: NIL,
            }),
            CachePolicy::S3Fifo => Order::S3Fifo(S3Fifo {
                links: Links::new(capacity),
                small: List::EMPTY,
                main: List::EMPTY,
                meta: Zeroed::new(capacity),
                small_target: (capacity * S3_SMALL_TENTHS / 10).max(1) as u32,
                capacity: capacity as u32,
                ghost: Ghost::new(capacity * S3_GHOST_TENTHS / 10),
            }),
        }
    }

    /// Bytes the order of `policy` over `capacity` slots allocates.
    pub(crate) fn bytes_for(policy: CachePolicy, capacity: usize) -> u64 {
        let n = capacity as u64;
        match policy {
            CachePolicy::Lru => n * 8,
            CachePolicy::Clock => n,
            CachePolicy::Sieve => n * 9,
            CachePolicy::S3Fifo => n * 9 + Ghost::bytes_for(capacity * S3_GHOST_TENTHS / 10),
        }
    }

    /// Asks memory for what [`Order::hit`] of `slot` writes first (a
    /// software prefetch, so a batch's hits do not wait for it one by one).
    #[inline]
    pub(crate) fn prefetch_hit(&self, slot: u32) {
        let s = slot as usize;
        let at: Option<*const u8> = match self {
            Order::Lru(o) => o.links.prev.get(s).map(|p| (p as *const u32).cast()),
            Order::Clock(o) => o.bits.get(s).map(|b| b as *const u8),
            Order::Sieve(o) => o.visited.get(s).map(|b| b as *const u8),
            Order::S3Fifo(o) => o.meta.get(s).map(|b| b as *const u8),
        };
        if let Some(p) = at {
            crate::sys::prefetch_lines(p, 1, 1);
        }
    }

    /// `slot` was hit.
    #[inline]
    pub(crate) fn hit(&mut self, slot: u32) {
        let s = slot as usize;
        match self {
            Order::Lru(o) => {
                if o.list.head != slot {
                    o.links.unlink(&mut o.list, slot);
                    o.links.push_front(&mut o.list, slot);
                }
            }
            Order::Clock(o) => o.bits[s] = 1,
            Order::Sieve(o) => o.visited[s] = 1,
            Order::S3Fifo(o) => {
                let m = o.meta[s];
                if m & FREQ < 3 {
                    o.meta[s] = m + 1;
                }
            }
        }
    }

    /// `slot` (empty, or just named by [`Order::victim`]) now holds the row
    /// `key`.
    pub(crate) fn fill(&mut self, slot: u32, key: u64) {
        let s = slot as usize;
        match self {
            Order::Lru(o) => o.links.push_front(&mut o.list, slot),
            Order::Clock(o) => o.bits[s] = 0,
            Order::Sieve(o) => {
                o.visited[s] = 0;
                o.links.push_front(&mut o.list, slot);
            }
            Order::S3Fifo(o) => {
                if o.ghost.take(key) {
                    o.meta[s] = IN_MAIN;
                    o.links.push_front(&mut o.main, slot);
                } else {
                    o.meta[s] = 0;
                    o.links.push_front(&mut o.small, slot);
                }
            }
        }
    }

    /// Picks the slot whose row leaves (every slot is full), takes it out
    /// of the order, and returns it; `keys[slot]` is each slot's row id.
    pub(crate) fn victim(&mut self, keys: &[u64]) -> u32 {
        match self {
            Order::Lru(o) => {
                let t = o.list.tail;
                o.links.unlink(&mut o.list, t);
                t
            }
            Order::Clock(o) => {
                let n = o.bits.len() as u32;
                loop {
                    let h = o.hand;
                    o.hand = if h + 1 == n { 0 } else { h + 1 };
                    if o.bits[h as usize] == 0 {
                        return h;
                    }
                    o.bits[h as usize] = 0;
                }
            }
            Order::Sieve(o) => {
                let mut h = if o.hand == NIL { o.list.tail } else { o.hand };
                while o.visited[h as usize] != 0 {
                    o.visited[h as usize] = 0;
                    h = o.links.prev[h as usize];
                    if h == NIL {
                        h = o.list.tail;
                    }
                }
                o.hand = o.links.prev[h as usize];
                o.links.unlink(&mut o.list, h);
                h
            }
            Order::S3Fifo(o) => o.victim(keys),
        }
    }

    /// Forgets every slot (keeps the allocations).
    pub(crate) fn clear(&mut self) {
        match self {
            Order::Lru(o) => o.list = List::EMPTY,
            Order::Clock(o) => {
                o.bits.fill(0);
                o.hand = 0;
            }
            Order::Sieve(o) => {
                o.list = List::EMPTY;
                o.visited.fill(0);
                o.hand = NIL;
            }
            Order::S3Fifo(o) => {
                o.small = List::EMPTY;
                o.main = List::EMPTY;
                o.meta.fill(0);
                o.ghost.clear();
            }
        }
    }
}

impl S3Fifo {
    fn victim(&mut self, keys: &[u64]) -> u32 {
        loop {
            if self.small.len >= self.small_target || self.main.len == 0 {
                // Small queue: rows hit while there move to main; the first
                // one that was not leaves, remembered by the ghost.
                let t = self.small.tail;
                self.links.unlink(&mut self.small, t);
                let m = self.meta[t as usize];
                if m & FREQ >= S3_PROMOTE_HITS {
                    self.meta[t as usize] = IN_MAIN | (m & FREQ);
                    self.links.push_front(&mut self.main, t);
                    if self.main.len > self.capacity - self.small_target {
                        return self.evict_main();
                    }
                    continue;
                }
                self.ghost.push(keys[t as usize]);
                return t;
            }
            return self.evict_main();
        }
    }

    /// Main queue: FIFO with reinsertion while the count lasts.
    fn evict_main(&mut self) -> u32 {
        loop {
            let t = self.main.tail;
            self.links.unlink(&mut self.main, t);
            let m = self.meta[t as usize];
            if m & FREQ > 0 {
                self.meta[t as usize] = m - 1;
                self.links.push_front(&mut self.main, t);
                continue;
            }
            return t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `policy` over `capacity` slots on a key stream; returns the
    /// keys resident at the end, sorted, and the hit count.
    fn run(policy: CachePolicy, capacity: usize, stream: &[u64]) -> (Vec<u64>, usize) {
        let mut order = Order::new(policy, capacity);
        let mut keys: Vec<u64> = Vec::new();
        let mut hits = 0;
        for &k in stream {
            if let Some(s) = keys.iter().position(|&x| x == k) {
                order.hit(s as u32);
                hits += 1;
                continue;
            }
            let slot = if keys.len() < capacity {
                keys.push(k);
                keys.len() as u32 - 1
            } else {
                let v = order.victim(&keys);
                keys[v as usize] = k;
                v
            };
            order.fill(slot, k);
        }
        keys.sort_unstable();
        (keys, hits)
    }

    #[test]
    fn lru_evicts_the_least_recent() {
        // 1 2 3, hit 1, insert 4: 2 leaves.
        let (keys, hits) = run(CachePolicy::Lru, 3, &[1, 2, 3, 1, 4]);
        assert_eq!((keys, hits), (vec![1, 3, 4], 1));
    }

    #[test]
    fn clock_gives_a_second_chance() {
        // 1 2 3, hit 1; 4 sweeps: 1 has its bit (cleared, spared), 2 leaves.
        let (keys, _) = run(CachePolicy::Clock, 3, &[1, 2, 3, 1, 4]);
        assert_eq!(keys, vec![1, 3, 4]);
        // Then 5: the hand is at 3 (bit 0): 3 leaves.
        let (keys, _) = run(CachePolicy::Clock, 3, &[1, 2, 3, 1, 4, 5]);
        assert_eq!(keys, vec![1, 4, 5]);
    }

    #[test]
    fn sieve_keeps_visited_rows_in_place() {
        // 1 2 3 (1 oldest), hit 1 and 3; 4: the hand clears 1, evicts 2.
        let (keys, _) = run(CachePolicy::Sieve, 3, &[1, 2, 3, 1, 3, 4]);
        assert_eq!(keys, vec![1, 3, 4]);
        // 5: the hand continues from 2's newer neighbour, 3: visited,
        // cleared; 4 unvisited leaves (1 survives, its bit cleared earlier
        // but the hand has not come back to it yet).
        let (keys, _) = run(CachePolicy::Sieve, 3, &[1, 2, 3, 1, 3, 4, 5]);
        assert_eq!(keys, vec![1, 3, 5]);
    }

    #[test]
    fn s3fifo_filters_one_hit_wonders_and_remembers_ghosts() {
        // 10 slots: small queue of 1. A hot set of 5 rows hit repeatedly
        // survives a scan of 100 rows seen once.
        let hot = [1u64, 2, 3, 4, 5];
        let mut stream: Vec<u64> = Vec::new();
        for _ in 0..3 {
            stream.extend_from_slice(&hot);
        }
        stream.extend(1000..1100);
        stream.extend_from_slice(&hot);
        let (keys, _) = run(CachePolicy::S3Fifo, 10, &stream);
        for h in hot {
            assert!(keys.contains(&h), "{h} evicted by a scan: {keys:?}");
        }
        // LRU loses all of them to the same scan.
        let (keys, _) = run(CachePolicy::Lru, 10, &stream[..stream.len() - 5]);
        assert!(hot.iter().all(|h| !keys.contains(h)));
    }

    #[test]
    fn every_policy_is_exact_about_what_it_holds() {
        // Against a brute-force model of residency: every policy's answer to
        // "hit or miss" must match whether the key is in its slots, and the
        // slot count never exceeds the capacity.
        let mut x = 7u64;
        let stream: Vec<u64> = (0..20_000)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                let r = x >> 33;
                if r.is_multiple_of(3) {
                    r % 40
                } else {
                    r % 400
                }
            })
            .collect();
        for &p in CachePolicy::ALL {
            for cap in [1usize, 2, 7, 64, 399] {
                let (keys, hits) = run(p, cap, &stream);
                assert!(keys.len() <= cap);
                let mut d = keys.clone();
                d.dedup();
                assert_eq!(d.len(), keys.len(), "{p} holds a key twice");
                assert!(hits > 0 || cap < 2, "{p} cap {cap}");
            }
        }
    }

    #[test]
    fn bytes_for_matches_the_allocations() {
        for &p in CachePolicy::ALL {
            for cap in [0usize, 1, 10, 1000] {
                let got = match Order::new(p, cap) {
                    Order::Lru(o) => (o.links.prev.len() + o.links.next.len()) as u64 * 4,
                    Order::Clock(o) => o.bits.len() as u64,
                    Order::Sieve(o) => {
                        (o.links.prev.len() + o.links.next.len()) as u64 * 4
                            + o.visited.len() as u64
                    }
                    Order::S3Fifo(o) => {
                        (o.links.prev.len() + o.links.next.len()) as u64 * 4
                            + o.meta.len() as u64
                            + o.ghost.ring.len() as u64 * 8
                            + Index::bytes_for(o.ghost.ring.len())
                    }
                };
                assert_eq!(got, Order::bytes_for(p, cap), "{p} {cap}");
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for &p in CachePolicy::ALL {
            assert_eq!(p.name().parse::<CachePolicy>(), Ok(p));
        }
        assert_eq!("S3FIFO".parse::<CachePolicy>(), Ok(CachePolicy::S3Fifo));
        assert!("arc".parse::<CachePolicy>().is_err());
    }
}
