//! A row cache that keeps its own memory budget: stored (quantized) row
//! bytes in pleio's memory, sharded, with a fixed footprint.
//!
//! The cache is sized once from a byte budget and the table's layout
//! ([`Sizing::for_table`], the one way a cache is sized):
//! staging buffers for the reads that fill it, then as many row slots as
//! fit, split over up to 64 shards. Every allocation is made at that size
//! and never grows, so the memory the cache and its staging use is known
//! before the first row arrives and never exceeds the budget
//! ([`RowCache::allocated_bytes`] counts the real allocations).
//!
//! Rows are found by id in a shard chosen by a hash of the id; each shard
//! has its own lock, so threads gathering different rows rarely meet. A
//! row not in the cache is *claimed* by the first gather that misses it;
//! another gather that needs it meanwhile waits for that read instead of
//! reading it again ([`RowCache::lookup`], [`RowCache::wait_lookup`]).
//!
//! This module does no I/O: the `cached` strategy (`fetch::cached`) reads
//! the claimed rows with `O_DIRECT` into staging taken from
//! [`RowCache::staging`] and hands them over with [`RowCache::fill`].

mod index;
mod policy;
pub mod segment;
mod slots;

use crate::sys::Zeroed;
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use crate::layout::Layout;

pub use policy::CachePolicy;
pub use slots::{Placed, Slots};

/// Staging buffers per cache: one being filled by the ring while the rows
/// of the other are handed to the cache.
pub const STAGING_BUFFERS: usize = 2;

/// Largest staging buffer (each of [`STAGING_BUFFERS`]): 1024 pages, many
/// times the ring's queue depth, so a chunk of reads keeps the device busy.
const STAGING_MAX: u64 = 4 << 20;

/// At most this many shards (a power of two).
const MAX_SHARDS: usize = 64;

/// Rows of one shard whose lookups are staged together
/// ([`RowCache::lookup_many`]): enough to keep the CPU's line fill buffers
/// busy, few enough that a run's lines stay in its caches (16, 32 and 64
/// measured the same: `warm_loop` of 1792 raw rows, GGUF and FP8).
const LOOKUP_RUN: usize = 32;

/// A shard gets at least this many slots before the cache is split further.
const MIN_SHARD_SLOTS: usize = 4096;

/// Allocations per shard (row bytes, slot keys, index keys and values,
/// up to three order arrays, the ghost ring and its index).
const ALLOCS_PER_SHARD: u64 = 10;

/// Bytes charged per allocation for the allocator's own bookkeeping.
const ALLOC_OVERHEAD: u64 = 64;

/// Bytes charged per shard for its lock, condition variable and in-flight
/// set header.
const SHARD_FIXED: u64 = 256;

/// Errors sizing a cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The budget cannot hold the staging one read needs plus one row.
    #[error("a row cache budget of {budget} bytes is too small: rows of {row_bytes} bytes need at least {need}")]
    BudgetTooSmall {
        /// The budget asked for.
        budget: u64,
        /// Bytes per row.
        row_bytes: u64,
        /// The smallest budget that works.
        need: u64,
    },
    /// The budget is more than this machine's physical memory: the cache
    /// could never hold it, and its bookkeeping would be sized for it.
    #[error(
        "a row cache budget of {budget} bytes is more than this machine's {memory} bytes of memory"
    )]
    BudgetTooLarge {
        /// The budget asked for.
        budget: u64,
        /// The machine's physical memory.
        memory: u64,
    },
}

/// How a budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// The budget.
    pub budget: u64,
    /// Bytes per row.
    pub row_bytes: usize,
    /// Read alignment the staging is laid out for (1 when reads need none).
    pub align: usize,
    /// Usable bytes of each staging buffer (a multiple of `align`).
    pub staging_bytes: usize,
    /// Shards (a power of two).
    pub shards: usize,
    /// Row slots per shard.
    pub slots_per_shard: usize,
    /// The eviction policy.
    pub policy: CachePolicy,
}

impl Sizing {
    /// The cache of `table`'s rows under `budget`, read with alignment
    /// `align` (a power of two; 1 for none): the one way a cache is sized,
    /// by the `cached` strategy and by the lab's simulator alike, so both
    /// hold the same rows. A row of several parts (a checkpoint's one to
    /// three tensors) is read as the aligned blocks around each part.
    pub fn for_table(
        budget: u64,
        table: &Layout,
        align: usize,
        policy: CachePolicy,
    ) -> Result<Sizing, CacheError> {
        let row_bytes = usize::try_from(table.row_bytes()).unwrap_or(usize::MAX);
        Sizing::for_parts(budget, row_bytes, table.parts(), align, policy)
    }

    /// Splits `budget` for rows of `row_bytes` stored in `parts` separate
    /// extents (a checkpoint's row of one to three parts, each read as the
    /// aligned blocks around it), read with alignment `align` (a power of
    /// two; 1 for none): staging first, then slots. Each staging buffer
    /// holds the blocks of at least one whole row.
    fn for_parts(
        budget: u64,
        row_bytes: usize,
        parts: usize,
        align: usize,
        policy: CachePolicy,
    ) -> Result<Sizing, CacheError> {
        let memory = match crate::sys::physical_memory() {
            0 => isize::MAX as u64,
            m => m.min(isize::MAX as u64),
        };
        if budget > memory {
            return Err(CacheError::BudgetTooLarge { budget, memory });
        }
        let align = align.max(1).next_power_of_two();
        let a = align as u64;
        let rb = row_bytes.max(1) as u64;
        let p = parts.max(1) as u64;
        // One row read with O_DIRECT covers at most this many aligned bytes:
        // a part of `l` bytes covers at most `ceil((l + a - 1) / a)` blocks,
        // and a sum of `p` ceilings exceeds the ceiling of the sum by at
        // most `p - 1`.
        let one_read = (rb.saturating_add(p * (a - 1)))
            .div_ceil(a)
            .saturating_add(p - 1)
            .saturating_mul(a);
        let staging = (budget / 32).clamp(one_read, STAGING_MAX.max(one_read));
        let staging = staging.div_ceil(a).saturating_mul(a);
        let staging_total = STAGING_BUFFERS as u64 * (staging + a + ALLOC_OVERHEAD);
        let slot_cost = |cap: usize| -> u64 {
            cap as u64 * rb + Slots::bytes_for(policy, cap) + ALLOCS_PER_SHARD * ALLOC_OVERHEAD
        };
        let need = staging_total + SHARD_FIXED + slot_cost(1);
        let too_small = CacheError::BudgetTooSmall {
            budget,
            row_bytes: rb,
            need,
        };
        if budget < need {
            return Err(too_small);
        }
        let rest = budget - staging_total;
        // The largest slot count one shard of `bytes` can hold.
        let fit = |bytes: u64| -> usize {
            let bytes = bytes.saturating_sub(SHARD_FIXED);
            let (mut lo, mut hi) = (0usize, (bytes / rb).min(u32::MAX as u64 - 1) as usize);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if slot_cost(mid) <= bytes {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            lo
        };
        let mut shards = MAX_SHARDS;
        while shards > 1 && fit(rest / shards as u64) < MIN_SHARD_SLOTS {
            shards /= 2;
        }
        let slots_per_shard = fit(rest / shards as u64);
        if slots_per_shard == 0 {
            return Err(too_small);
        }
        Ok(Sizing {
            budget,
            row_bytes: row_bytes.max(1),
            align,
            staging_bytes: staging as usize,
            shards,
            slots_per_shard,
            policy,
        })
    }

    /// Rows the cache holds when full.
    pub fn capacity(&self) -> u64 {
        self.shards as u64 * self.slots_per_shard as u64
    }

    /// The most the cache and its staging allocate: what the budget was
    /// checked against.
    pub fn max_bytes(&self) -> u64 {
        let a = self.align as u64;
        let per_shard = self.slots_per_shard as u64 * self.row_bytes as u64
            + Slots::bytes_for(self.policy, self.slots_per_shard)
            + ALLOCS_PER_SHARD * ALLOC_OVERHEAD
            + SHARD_FIXED;
        STAGING_BUFFERS as u64 * (self.staging_bytes as u64 + a + ALLOC_OVERHEAD)
            + self.shards as u64 * per_shard
    }
}

/// The shard of `row` among `shards` (a power of two): a hash independent
/// of the index's (SplitMix64's finalizer), so a shard's rows still spread
/// over all of its buckets.
pub fn shard_of(row: u64, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let mut z = (row ^ (row >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) >> (64 - shards.trailing_zeros())) as usize
}

/// A `Hasher` for row ids (they arrive well spread; one multiply mixes).
#[derive(Default)]
struct RowHasher(u64);

impl Hasher for RowHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = index::mix(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = index::mix(v);
    }
}

type RowSet = HashSet<u64, BuildHasherDefault<RowHasher>>;

/// One shard: slots, their bytes, and the rows being read for it.
struct ShardState {
    slots: Slots,
    data: Zeroed<u8>,
    /// Rows claimed by a gather and not yet filled or abandoned.
    in_flight: RowSet,
}

impl ShardState {
    /// The bytes of a held `slot` (rows of `rb` bytes).
    #[inline]
    fn bytes(&self, rb: usize, slot: u32) -> &[u8] {
        &self.data[slot as usize * rb..][..rb]
    }

    /// Claims `row`, not held, for the caller to read and fill:
    /// [`Found::Claimed`], or [`Found::Busy`] if another gather has.
    #[inline]
    fn claim(&mut self, row: u64) -> Found {
        if self.in_flight.insert(row) {
            Found::Claimed
        } else {
            Found::Busy
        }
    }
}

struct Shard {
    state: Mutex<ShardState>,
    filled: Condvar,
}

/// What [`RowCache::lookup`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The row was cached; the closure saw its bytes.
    Hit,
    /// The row was missing and is now claimed by the caller, who must
    /// [`RowCache::fill`] or [`RowCache::abandon`] it.
    Claimed,
    /// Another caller is reading the row: wait for it
    /// ([`RowCache::wait_lookup`]).
    Busy,
}

/// Counters of a cache over its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Rows held now.
    pub rows: u64,
    /// Bytes of the rows held now.
    pub resident_bytes: u64,
    /// Rows evicted to make room, over the cache's life.
    pub evictions: u64,
    /// Row capacity.
    pub capacity: u64,
    /// The budget.
    pub budget: u64,
}

/// A budgeted, sharded cache of stored row bytes.
pub struct RowCache {
    sizing: Sizing,
    shards: Box<[Shard]>,
    rows: AtomicU64,
    evictions: AtomicU64,
    staging: StagingPool,
}

impl std::fmt::Debug for RowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowCache")
            .field("sizing", &self.sizing)
            .field("rows", &self.rows.load(Ordering::Relaxed))
            .finish()
    }
}

impl RowCache {
    /// A cache laid out as `sizing` says. Slot memory is allocated zeroed
    /// (so untouched slots cost no resident memory on systems that map
    /// zeroed pages lazily); staging is allocated on first use.
    pub fn new(sizing: Sizing) -> RowCache {
        let shards = (0..sizing.shards)
            .map(|_| Shard {
                state: Mutex::new(ShardState {
                    slots: Slots::new(sizing.policy, sizing.slots_per_shard),
                    data: Zeroed::new(sizing.slots_per_shard * sizing.row_bytes),
                    in_flight: RowSet::default(),
                }),
                filled: Condvar::new(),
            })
            .collect();
        RowCache {
            shards,
            rows: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            staging: StagingPool::new(sizing.staging_bytes, sizing.align),
            sizing,
        }
    }

    /// How the budget is spent.
    pub fn sizing(&self) -> &Sizing {
        &self.sizing
    }

    fn shard(&self, row: u64) -> &Shard {
        &self.shards[shard_of(row, self.shards.len())]
    }

    fn lock(shard: &Shard) -> MutexGuard<'_, ShardState> {
        // Nothing here can panic half-way through an update, so a poisoned
        // shard is still consistent.
        shard.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks `row` up: on a hit, `f` sees its bytes (under the shard's
    /// lock: keep it short); on a miss the row is claimed for the caller
    /// unless another caller claimed it first.
    pub fn lookup<E>(&self, row: u64, f: impl FnOnce(&[u8]) -> Result<(), E>) -> Result<Found, E> {
        let shard = self.shard(row);
        let mut st = Self::lock(shard);
        Self::find_or_claim(&mut st, self.sizing.row_bytes, row, f)
    }

    /// Looks up rows `row(0)..row(n)` as [`RowCache::lookup`] does, and
    /// calls `f(i, found, bytes)` for each (`bytes`: the row's bytes on a
    /// hit, under its shard's lock; empty otherwise), shard by shard: each
    /// shard's lock is taken once, and its rows are looked up in runs of
    /// [`LOOKUP_RUN`] whose memory loads (index bucket, slot key, the row's
    /// bytes and its eviction-order entry) are asked for together, stage by
    /// stage, so a batch waits for memory a few times a run instead of
    /// two or three times a row (warm 1792-row gathers of `cached` spent
    /// most of their lookup time waiting for the bucket and the key). Each
    /// row's hash and probe run are worked out once, its slot kept from
    /// the stage that finds it to the one that copies it (when every stage
    /// probed again, a warm 1792-row gather took ~25% longer).
    /// `scratch`: reused between calls. Stops at the first error of `f`.
    pub fn lookup_many<E>(
        &self,
        n: usize,
        row: impl Fn(usize) -> u64,
        scratch: &mut Vec<usize>,
        mut f: impl FnMut(usize, Found, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let shards = self.shards.len();
        let rb = self.sizing.row_bytes;
        // The request's indices grouped by shard (a counting sort).
        let mut start = [0usize; MAX_SHARDS + 1];
        for i in 0..n {
            start[shard_of(row(i), shards) + 1] += 1;
        }
        for s in 0..shards {
            start[s + 1] += start[s];
        }
        let mut at = start;
        scratch.clear();
        scratch.resize(n, 0);
        for i in 0..n {
            let s = shard_of(row(i), shards);
            scratch[at[s]] = i;
            at[s] += 1;
        }
        for (s, shard) in self.shards.iter().enumerate() {
            let mine = &scratch[start[s]..start[s + 1]];
            if mine.is_empty() {
                continue;
            }
            let mut st = Self::lock(shard);
            // Each row of a run: its index home, then its slot (if held).
            let mut home = [0usize; LOOKUP_RUN];
            let mut slot = [None::<u32>; LOOKUP_RUN];
            for run in mine.chunks(LOOKUP_RUN) {
                for (h, &i) in home.iter_mut().zip(run) {
                    *h = st.slots.home(row(i));
                    st.slots.prefetch_bucket(*h);
                }
                for &h in &home[..run.len()] {
                    st.slots.prefetch_keys(h);
                }
                for ((s, &h), &i) in slot.iter_mut().zip(&home).zip(run) {
                    *s = st.slots.find_prefetch(h, row(i));
                    if let Some(s) = *s {
                        crate::sys::prefetch_lines(st.bytes(rb, s).as_ptr(), rb, 4);
                    }
                }
                for (&s, &i) in slot.iter().zip(run) {
                    match s {
                        Some(s) => {
                            st.slots.hit(s);
                            f(i, Found::Hit, st.bytes(rb, s))?;
                        }
                        None => f(i, st.claim(row(i)), &[])?,
                    }
                }
            }
        }
        Ok(())
    }

    fn find_or_claim<E>(
        st: &mut ShardState,
        rb: usize,
        row: u64,
        f: impl FnOnce(&[u8]) -> Result<(), E>,
    ) -> Result<Found, E> {
        if let Some(slot) = st.slots.get(row) {
            f(st.bytes(rb, slot))?;
            return Ok(Found::Hit);
        }
        Ok(st.claim(row))
    }

    /// Waits until no one is reading `row`, then looks it up as
    /// [`RowCache::lookup`] does (never [`Found::Busy`]).
    pub fn wait_lookup<E>(
        &self,
        row: u64,
        f: impl FnOnce(&[u8]) -> Result<(), E>,
    ) -> Result<Found, E> {
        let shard = self.shard(row);
        let mut st = Self::lock(shard);
        while st.in_flight.contains(&row) {
            st = shard.filled.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        Self::find_or_claim(&mut st, self.sizing.row_bytes, row, f)
    }

    /// Stores the bytes of `row`, claimed by the caller, evicting another
    /// row if the shard is full, and wakes the gathers waiting for it.
    /// Returns true if a row was evicted.
    pub fn fill(&self, row: u64, bytes: &[u8]) -> bool {
        let rb = self.sizing.row_bytes;
        let shard = self.shard(row);
        let mut st = Self::lock(shard);
        st.in_flight.remove(&row);
        let mut evicted = false;
        if bytes.len() == rb && st.slots.peek(row).is_none() {
            if let Some(p) = st.slots.insert(row) {
                let at = p.slot as usize * rb;
                st.data[at..at + rb].copy_from_slice(bytes);
                if p.evicted.is_some() {
                    evicted = true;
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.rows.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        drop(st);
        shard.filled.notify_all();
        evicted
    }

    /// Gives up a claim on `row` (its read failed): waiters look again and
    /// one of them claims it.
    pub fn abandon(&self, row: u64) {
        let shard = self.shard(row);
        Self::lock(shard).in_flight.remove(&row);
        shard.filled.notify_all();
    }

    /// True if `row` is cached (no hit counted).
    pub fn contains(&self, row: u64) -> bool {
        Self::lock(self.shard(row)).slots.peek(row).is_some()
    }

    /// Drops every cached row (claims in flight stay); the memory stays
    /// allocated for reuse.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut st = Self::lock(shard);
            st.slots.clear();
        }
        self.rows.store(0, Ordering::Relaxed);
    }

    /// Rows held, bytes held, evictions so far.
    pub fn counters(&self) -> CacheCounters {
        let rows = self.rows.load(Ordering::Relaxed);
        CacheCounters {
            rows,
            resident_bytes: rows * self.sizing.row_bytes as u64,
            evictions: self.evictions.load(Ordering::Relaxed),
            capacity: self.sizing.capacity(),
            budget: self.sizing.budget,
        }
    }

    /// A staging buffer for reads (waits while every buffer is in use).
    pub fn staging(&self) -> Staging<'_> {
        self.staging.take()
    }

    /// Bytes the cache has actually allocated (slot memory, bookkeeping,
    /// staging made so far), from the allocations' real capacities plus
    /// the per-allocation and per-shard allowances the sizing charges.
    pub fn allocated_bytes(&self) -> u64 {
        let mut total = self.staging.allocated_bytes();
        for shard in self.shards.iter() {
            let st = Self::lock(shard);
            total += st.data.len() as u64
                + Slots::bytes_for(self.sizing.policy, st.slots.capacity())
                + ALLOCS_PER_SHARD * ALLOC_OVERHEAD
                + SHARD_FIXED;
            // The in-flight set grows with the rows being read at once; it
            // belongs to the requests, like their output buffers.
        }
        total
    }
}

/// A fixed number of aligned staging buffers, made on first use.
pub(crate) struct StagingPool {
    bytes: usize,
    align: usize,
    state: Mutex<PoolState>,
    free: Condvar,
}

struct PoolState {
    idle: Vec<Vec<u8>>,
    made: usize,
}

impl StagingPool {
    pub(crate) fn new(bytes: usize, align: usize) -> StagingPool {
        StagingPool {
            bytes,
            align,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                made: 0,
            }),
            free: Condvar::new(),
        }
    }

    pub(crate) fn take(&self) -> Staging<'_> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(buf) = st.idle.pop() {
                return Staging {
                    pool: self,
                    buf: Some(buf),
                };
            }
            if st.made < STAGING_BUFFERS {
                st.made += 1;
                drop(st);
                return Staging {
                    pool: self,
                    buf: Some(vec![0; self.bytes + self.align]),
                };
            }
            st = self.free.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn allocated_bytes(&self) -> u64 {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let each = (self.bytes + self.align) as u64 + ALLOC_OVERHEAD;
        st.made as u64 * each
    }
}

/// A staging buffer on loan from a cache; returned when dropped.
pub struct Staging<'a> {
    pool: &'a StagingPool,
    buf: Option<Vec<u8>>,
}

impl Staging<'_> {
    /// The usable bytes, starting on the pool's alignment.
    pub fn bytes(&mut self) -> &mut [u8] {
        let (n, align) = (self.pool.bytes, self.pool.align);
        let buf = self.buf.as_mut().expect("present until dropped");
        let skip = buf.as_ptr().align_offset(align);
        &mut buf[skip..skip + n]
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let mut st = self.pool.state.lock().unwrap_or_else(|e| e.into_inner());
            st.idle.push(buf);
            drop(st);
            self.pool.free.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_holds_the_blocks_of_a_row_of_several_parts() {
        // Three parts at the worst offsets (one byte into a block): each of
        // 1, 4097 and 4095 bytes covers 2 blocks.
        for (parts, lens) in [(1usize, vec![90u64]), (3, vec![1, 4097, 4095])] {
            let rb: u64 = lens.iter().sum();
            let s =
                Sizing::for_parts(64 << 20, rb as usize, parts, 4096, CachePolicy::Sieve).unwrap();
            let worst: u64 = lens.iter().map(|l| (1 + l).div_ceil(4096) * 4096).sum();
            assert!(s.staging_bytes as u64 >= worst, "{parts}: {s:?}");
            let tiny = Sizing::for_parts(1 << 16, rb as usize, parts, 4096, CachePolicy::Sieve);
            if let Ok(t) = tiny {
                assert!(t.staging_bytes as u64 >= worst && t.max_bytes() <= 1 << 16);
            }
        }
    }

    #[test]
    fn sizing_fits_the_budget_and_uses_most_of_it() {
        for &policy in CachePolicy::ALL {
            for (budget, rb, align) in [
                (64u64 << 10, 90usize, 4096usize),
                (1 << 20, 90, 512),
                (64 << 20, 90, 4096),
                (256 << 20, 90, 4096),
                (64 << 20, 7392, 4096),
                (1 << 30, 170, 1),
            ] {
                let s = Sizing::for_parts(budget, rb, 1, align, policy).unwrap();
                assert!(s.max_bytes() <= budget, "{policy} {budget} {rb}: {s:?}");
                assert!(s.shards.is_power_of_two() && s.shards <= MAX_SHARDS);
                assert!(s.staging_bytes.is_multiple_of(s.align));
                // Staging for one row read always fits.
                assert!(s.staging_bytes >= rb);
                if budget >= 64 << 20 {
                    // Big budgets go to rows, not bookkeeping.
                    let rows = s.capacity() * rb as u64;
                    assert!(rows * 10 >= budget * 6, "{policy} {budget}: {rows}");
                }
            }
        }
    }

    #[test]
    fn a_budget_beyond_the_machines_memory_is_refused() {
        // u64::MAX aborted (a failed allocation of the slots).
        for budget in [u64::MAX, 1 << 62] {
            let e = Sizing::for_parts(budget, 90, 1, 4096, CachePolicy::Sieve).unwrap_err();
            assert!(matches!(e, CacheError::BudgetTooLarge { .. }), "{e}");
            assert!(e.to_string().contains("memory"), "{e}");
        }
    }

    #[test]
    fn a_budget_below_one_row_and_its_staging_is_refused() {
        let e = Sizing::for_parts(4096, 90, 1, 4096, CachePolicy::Sieve).unwrap_err();
        let CacheError::BudgetTooSmall { need, .. } = e else {
            panic!("{e}");
        };
        assert!(need > 4096);
        assert!(Sizing::for_parts(need, 90, 1, 4096, CachePolicy::Sieve).is_ok());
        assert!(Sizing::for_parts(need - 1, 90, 1, 4096, CachePolicy::Sieve).is_err());
    }

    fn cache(budget: u64) -> RowCache {
        RowCache::new(Sizing::for_parts(budget, 10, 1, 1, CachePolicy::Sieve).unwrap())
    }

    #[test]
    fn claims_fills_and_hits() {
        let c = cache(64 << 10);
        let none = |_: &[u8]| Ok::<(), ()>(());
        assert_eq!(c.lookup(5, none), Ok(Found::Claimed));
        assert_eq!(c.lookup(5, none), Ok(Found::Busy));
        c.fill(5, &[7; 10]);
        let mut seen = Vec::new();
        assert_eq!(
            c.lookup(5, |b: &[u8]| {
                seen.extend_from_slice(b);
                Ok::<(), ()>(())
            }),
            Ok(Found::Hit)
        );
        assert_eq!(seen, [7; 10]);
        assert_eq!(c.counters().rows, 1);
        // An abandoned claim can be claimed again.
        assert_eq!(c.lookup(6, none), Ok(Found::Claimed));
        c.abandon(6);
        assert_eq!(c.wait_lookup(6, none), Ok(Found::Claimed));
        c.clear();
        assert!(!c.contains(5));
        assert_eq!(c.counters().rows, 0);
    }

    #[test]
    fn lookup_many_finds_what_lookup_finds() {
        let c = cache(8 << 20);
        assert!(c.sizing().shards > 1, "{:?}", c.sizing());
        let bytes = |row: u64| row.to_le_bytes()[..].repeat(2)[..10].to_vec();
        let none = |_: &[u8]| Ok::<(), ()>(());
        // Even rows cached, row 1 claimed by someone else.
        for row in (0..4000u64).step_by(2) {
            assert_eq!(c.lookup(row, none), Ok(Found::Claimed));
            c.fill(row, &bytes(row));
        }
        assert_eq!(c.lookup(1, none), Ok(Found::Claimed));
        // Hits, new rows, the busy row, and a new row twice.
        let rows: Vec<u64> = (0..3000u64)
            .map(|i| (i * 7919) % 4000)
            .chain([1, 4001, 4001, 0, 0])
            .collect();
        let mut seen = vec![None; rows.len()];
        let mut scratch = Vec::new();
        let r = c.lookup_many(rows.len(), |i| rows[i], &mut scratch, |i, found, b| {
            assert!(seen[i].is_none(), "row index {i} twice");
            if found == Found::Hit {
                assert_eq!(b, &bytes(rows[i])[..], "row {}", rows[i]);
            } else {
                assert!(b.is_empty());
            }
            seen[i] = Some(found);
            Ok::<(), ()>(())
        });
        assert_eq!(r, Ok(()));
        let mut claimed_4001 = 0;
        for (i, (&row, f)) in rows.iter().zip(&seen).enumerate() {
            let f = f.unwrap_or_else(|| panic!("row index {i} not looked up"));
            match row {
                1 => assert_eq!(f, Found::Busy),
                4001 => claimed_4001 += usize::from(f == Found::Claimed),
                r if r % 2 == 0 => assert_eq!(f, Found::Hit, "row {r}"),
                r if i < 3000 && rows[..i].contains(&r) => assert_eq!(f, Found::Busy, "row {r}"),
                r => assert_eq!(f, Found::Claimed, "row {r}"),
            }
        }
        // One of the two asks for row 4001 claims it, the other finds it busy.
        assert_eq!(claimed_4001, 1);
        // An error of the callback stops the lookups and is returned.
        let mut calls = 0;
        let r = c.lookup_many(rows.len(), |i| rows[i], &mut scratch, |_, _, _| {
            calls += 1;
            Err(calls)
        });
        assert_eq!((r, calls), (Err(1), 1));
    }

    #[test]
    fn a_waiter_gets_the_row_another_thread_reads() {
        let c = cache(64 << 10);
        let none = |_: &[u8]| Ok::<(), ()>(());
        assert_eq!(c.lookup(9, none), Ok(Found::Claimed));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut got = Vec::new();
                let f = c.wait_lookup(9, |b: &[u8]| {
                    got.extend_from_slice(b);
                    Ok::<(), ()>(())
                });
                (f, got)
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            c.fill(9, &[3; 10]);
            let (f, got) = waiter.join().unwrap();
            assert_eq!((f, got), (Ok(Found::Hit), vec![3; 10]));
        });
    }

    #[test]
    fn eviction_keeps_the_row_count_at_capacity() {
        let c = cache(64 << 10);
        let cap = c.sizing().capacity();
        let none = |_: &[u8]| Ok::<(), ()>(());
        for row in 0..cap * 3 {
            if c.lookup(row, none) == Ok(Found::Claimed) {
                c.fill(row, &row.to_le_bytes()[..].repeat(2)[..10]);
            }
        }
        let k = c.counters();
        assert!(k.rows <= cap && k.rows > 0);
        assert!(k.evictions >= cap);
        assert!(c.allocated_bytes() <= 64 << 10);
        // Whatever is held has its own bytes.
        for row in 0..cap * 3 {
            let _ = c.lookup(row, |b: &[u8]| {
                assert_eq!(&b[..8], &row.to_le_bytes());
                Ok::<(), ()>(())
            });
        }
    }

    #[test]
    fn staging_is_aligned_bounded_and_reused() {
        let s = Sizing::for_parts(1 << 20, 90, 1, 4096, CachePolicy::Lru).unwrap();
        let c = RowCache::new(s);
        {
            let mut a = c.staging();
            let mut b = c.staging();
            assert_eq!(a.bytes().as_ptr() as usize % 4096, 0);
            assert_eq!(b.bytes().len(), s.staging_bytes);
        }
        let _again = c.staging();
        assert!(c.allocated_bytes() <= s.budget);
        assert!(c.allocated_bytes() <= s.max_bytes());
    }
}
