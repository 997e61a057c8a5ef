//! `shared`: one row cache per machine, in a shared-memory segment every
//! process serving the same table maps ([`crate::cache::segment`]).
//!
//! A gather first looks every id up in request order, with no sort: a hit
//! is copied out under the slot's seqlock (no lock, no system call). Only
//! the ids it did not find are sorted and deduplicated, and each distinct
//! row probed again: a miss claims a slot (one claim per row machine-wide)
//! and all claimed rows are read together exactly as `cached` reads its
//! misses ([`super::cached::MissReader`]: the coalescer's block mode,
//! `O_DIRECT` io_uring), then published. A row another process is reading
//! is waited for (bounded; a dead writer's slot is taken over), then read
//! privately if the wait gave nothing. Every row's bytes are collected
//! first and written to the output last, so a failed read leaves it
//! untouched.
//!
//! A table published to Redis has no file read for a claim to save, and
//! a round trip to hide: its missed rows are all requested at once, and
//! probed and claimed while the requests are in flight; a row another
//! process holds or is filling is taken from the bytes read, not waited
//! for (`misses_during_read`).
//!
//! The segment is named by the table's identity (device, inode, size and
//! modification time of every file holding rows, and the rows' geometry).
//! Each gather looks at the files (`fstat`, as `cached`) and at the
//! segment's removed flag; a change moves the handle to the segment of the
//! table as it is now, so a rewritten table's rows never mix with the old.
//!
//! A build without shared memory (the no-op OS layer) serves `shared`
//! from a private `cached` cache, flagged as a fallback.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use crate::io::process::PerProcess;

use super::cached::{groups_of, Claimer, Claims, Group, MissReader};
use super::direct::{with_scratch, Scratch};
use super::order::Repeats;
use super::{with_staged, GatherError, GatherStats, Staged, Table};
use crate::cache::segment::{self, Identity, Probe, Segment, SegmentStats};
use crate::cache::StagingPool;
use crate::output::Out;

/// Bytes of the per-process staging the misses are read into (more when
/// one row's reads need it).
const STAGING: usize = 4 << 20;

/// A handle's shared-cache reader, made on first use in each process (a
/// forked child must not wait on the parent's staging or locks; see
/// `CacheCell`).
#[derive(Default)]
pub(super) struct SharedCell {
    reader: PerProcess<Result<Arc<SharedReader>, String>>,
    /// Keep the segment when the last process detaches (set by
    /// [`Table::keep_shared_cache`]; else `PLEIO_SHARED_KEEP=1`).
    keep: std::sync::atomic::AtomicBool,
}

/// The reader of the misses, staging, and the segment attached to.
pub(super) struct SharedReader {
    miss: MissReader,
    staging: StagingPool,
    budget: u64,
    seg: Mutex<Option<Arc<Segment>>>,
}

impl Claimer for Segment {
    type Key = usize;
    fn abandon(&self, slot: usize) {
        Segment::abandon(self, slot);
    }
}

fn setup(reason: impl std::fmt::Display) -> GatherError {
    GatherError::Setup {
        backend: "shared",
        reason: reason.to_string(),
    }
}

impl Table {
    fn shared_reader(&self) -> Result<&SharedReader, GatherError> {
        self.cache
            .shared
            .reader
            .get_or_init(|| SharedReader::create(self, self.cache.budget).map(Arc::new))
            .as_ref()
            .map(|c| &**c)
            .map_err(setup)
    }

    /// Keeps the machine-wide cache's segment when the last process
    /// detaches (`pleio warm --strategy shared`); call before the first
    /// gather.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn keep_shared_cache(&self) {
        self.cache
            .shared
            .keep
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Empties the machine-wide cache's segment, if this handle attached
    /// one (every process sharing it starts cold).
    pub(super) fn clear_shared(&self) {
        if let Some(Ok(sr)) = self.cache.shared.reader.get() {
            let seg = sr.seg.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = seg.as_ref() {
                s.clear();
            }
        }
    }

    /// The segment this handle's gathers use now (attached on first use).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn shared_segment(&self) -> Result<Arc<Segment>, GatherError> {
        self.shared_reader()?.segment(self)
    }

    pub(super) fn gather_shared(
        &self,
        rows: &[u64],
        out: &mut Out<'_>,
        stats: &mut GatherStats,
        guard: &crate::sys::guard::Scope,
    ) -> Result<(), GatherError> {
        if crate::sys::NOOP {
            // No shared memory in this build: a private cache stands in.
            stats.fallback = true;
            return self.gather_cached(rows, out, stats);
        }
        // A segment file another process shrinks raises SIGBUS here, which
        // only pleio's handler turns into a lost segment: without it in
        // place for this thread, read the rows without the segment.
        if !guard.use_mapping_trusting_recent() {
            guard.note_fallback();
            stats.fallback = true;
            if let super::Source::Remote { table, .. } = &self.shared.source {
                return self.gather_remote(table, rows, out, stats);
            }
            return self.gather_direct(super::direct::Kind::UringDirect, rows, out, stats);
        }
        let sr = self.shared_reader()?;
        let seg = sr.segment(self)?;
        with_scratch(|s| with_staged(|st| sr.gather(self, &seg, rows, out, s, st, stats)))
    }
}

impl SharedReader {
    fn create(t: &Table, budget: u64) -> Result<SharedReader, String> {
        let miss = MissReader::open(t, "shared")?;
        let layout = &t.shared.table;
        let a = miss.align();
        let parts = layout.parts().max(1);
        let one = (layout.row_bytes() as usize + 2 * a * parts).div_ceil(a) * a;
        Ok(SharedReader {
            staging: StagingPool::new(STAGING.max(one).div_ceil(a) * a, a),
            miss,
            budget,
            seg: Mutex::new(None),
        })
    }

    /// The current segment: attached on first use, and again when a file
    /// of the table changed or the segment was removed.
    fn segment(&self, t: &Table) -> Result<Arc<Segment>, GatherError> {
        let changed = self.miss.changed()?;
        let mut cur = self.seg.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = cur.as_ref() {
            if !changed && !s.removed() && !s.lost() {
                return Ok(s.clone());
            }
        }
        *cur = None;
        let s = Arc::new(self.attach(t)?);
        *cur = Some(s.clone());
        Ok(s)
    }

    fn attach(&self, t: &Table) -> Result<Segment, GatherError> {
        let layout = &t.shared.table;
        let r = self.miss.reader();
        let files: Vec<&std::fs::File> = r
            .map(|r| (0..r.files()).filter_map(|k| r.file(k)).collect())
            .unwrap_or_default();
        let mut geometry = String::new();
        let _ = write!(geometry, "{}", layout.name());
        if let super::Source::Remote { table, .. } = &t.shared.source {
            // A published table is named by its id and fingerprint.
            let m = table.manifest();
            let _ = write!(geometry, "|redis:{}:{}", m.id, m.fingerprint);
        } else if files.is_empty() {
            return Err(setup("the table has no file to read rows from"));
        }
        for sh in layout.shards() {
            let _ = write!(geometry, "|{},{},{}", sh.index, sh.row_start, sh.rows);
            for p in &sh.parts {
                let _ = write!(
                    geometry,
                    ";{},{},{},{}",
                    p.tensor, p.file, p.offset, p.row_bytes
                );
            }
        }
        let id = Identity::new(
            &files,
            layout.rows(),
            layout.row_bytes(),
            geometry.as_bytes(),
        )
        .map_err(|error| GatherError::Read {
            backend: "shared",
            path: r
                .and_then(|r| r.path(0))
                .map(|p| p.to_path_buf())
                .unwrap_or_default(),
            error: crate::io::IoError::Os {
                what: "fstat",
                error,
            },
        })?;
        let label = format!(
            "{} [{}]",
            t.source_path().display(),
            layout.name()
        );
        let keep = t.cache.shared.keep.load(std::sync::atomic::Ordering::Relaxed)
            || std::env::var_os("PLEIO_SHARED_KEEP").is_some_and(|v| v != "0");
        Segment::attach(
            &segment::shm_dir(),
            &id,
            self.budget,
            files.first().copied(),
            &label,
            !keep,
        )
        .map_err(setup)
    }

    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        t: &Table,
        seg: &Segment,
        rows: &[u64],
        out: &mut Out<'_>,
        s: &mut Scratch,
        st: &mut Staged,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        let (rb, n) = (t.row_bytes() as usize, rows.len());
        t.stage_rows(&mut st.bytes, n, n, out)?;
        let mut d = SegmentStats::default();
        s.order.clear();
        s.repeats.split(rows);
        let first = First {
            staged: &mut st.bytes[..n * rb],
            rb,
            missed: &mut s.order,
        };
        hits(seg, rows, &mut s.repeats, first, &mut d);
        if !s.order.is_empty() {
            super::order::sort_pairs(&mut s.order, &mut s.sort);
            let groups = groups_of(&s.order);
            t.stage_rows(&mut st.bytes, n + groups.len(), n, out)?;
            let (staged, missed) = st.bytes.split_at_mut(n * rb);
            self.misses(t, seg, &groups, missed, stats, &mut d)?;
            for (u, g) in groups.iter().enumerate() {
                let src = &missed[u * rb..(u + 1) * rb];
                for &(_, i) in &s.order[g.start..g.end] {
                    staged[i * rb..(i + 1) * rb].copy_from_slice(src);
                }
            }
        }
        stats.cache_hits += d.hits;
        stats.cache_evictions += d.evictions;
        seg.count(d);
        t.put_staged(&st.bytes[..n * rb], None, out)
    }

    /// Gets the distinct rows `groups` the segment did not hold at the
    /// first look into `bytes` (`bytes[u * rb..]` for `groups[u]`): each
    /// is probed again, and claimed and read, or waited for, or read
    /// privately.
    fn misses(
        &self,
        t: &Table,
        seg: &Segment,
        groups: &[Group],
        bytes: &mut [u8],
        stats: &mut GatherStats,
        d: &mut SegmentStats,
    ) -> Result<(), GatherError> {
        if let Some(remote) = self.miss.remote() {
            return misses_during_read(remote, t, seg, groups, bytes, stats, d);
        }
        let rb = t.row_bytes() as usize;
        let (reqs0, bytes0, misses0) = (stats.read_requests, stats.read_bytes, stats.cache_misses);
        let mut claims = Claims::new(seg);
        let mut claimed = Vec::new();
        let mut waits = Vec::new();
        let mut private = Vec::new();
        probe_groups(seg, groups, rb, Some(bytes), &mut d.evictions, |u, p| match p {
            Probe::Hit => d.hits += 1,
            Probe::Claimed(slot) => {
                claims.keys.push(slot);
                claimed.push(u);
            }
            Probe::Wait { slot, state } => waits.push((u, slot, state)),
            Probe::Uncached => private.push(u),
        });
        self.fill(t, groups, &claimed, &mut claims, bytes, stats)?;
        // Rows other processes were reading: by now in, or their writer
        // died (the slot is ours: read at once, so no claim is held while
        // waiting for others, which could wait for it), or probed again
        // after all the waits, and read ourselves.
        claimed.clear();
        let mut again = Vec::new();
        let mut nap = crate::cache::segment::FIRST_NAP;
        for &(u, slot, state) in &waits {
            d.waits += 1;
            let row = groups[u].row;
            let dst = &mut bytes[u * rb..(u + 1) * rb];
            match seg.wait(slot, state, row, dst, &mut d.reclaims, &mut nap) {
                Probe::Hit => d.hits += 1,
                Probe::Claimed(slot) => {
                    claims.keys.push(slot);
                    self.fill(t, groups, &[u], &mut claims, bytes, stats)?;
                }
                _ => again.push(u),
            }
        }
        for u in again {
            let dst = &mut bytes[u * rb..(u + 1) * rb];
            match seg.probe(groups[u].row, dst, &mut d.evictions) {
                Probe::Hit => d.hits += 1,
                Probe::Claimed(slot) => {
                    claims.keys.push(slot);
                    claimed.push(u);
                }
                _ => private.push(u),
            }
        }
        self.fill(t, groups, &claimed, &mut claims, bytes, stats)?;
        if !private.is_empty() {
            private.sort_unstable();
            d.uncached = private.len() as u64;
            let mut staging = self.staging.take();
            self.miss.read_groups(
                t,
                groups,
                &private,
                staging.bytes(),
                Some(bytes),
                stats,
                &mut |_, _, _| false,
            )?;
        }
        d.misses = stats.cache_misses - misses0 - d.uncached;
        d.reads = stats.read_requests - reqs0;
        d.bytes_read = stats.read_bytes - bytes0;
        Ok(())
    }

    /// Reads the rows `groups[u]`, `u` in `claimed` (ascending; their slots
    /// the last of `claims`), copies each to staging and publishes it.
    fn fill(
        &self,
        t: &Table,
        groups: &[Group],
        claimed: &[usize],
        claims: &mut Claims<'_, Segment>,
        bytes: &mut [u8],
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        if claimed.is_empty() {
            return Ok(());
        }
        let mut staging = self.staging.take();
        let first = claims.filled;
        // Each publish writes a slot claimed before the reads: prefetched
        // LEAD rows ahead, so its cache and TLB misses overlap.
        for &k in claims.keys[first..].iter().take(LEAD) {
            claims.cache.prefetch_slot(k);
        }
        self.miss.read_groups(
            t,
            groups,
            claimed,
            staging.bytes(),
            Some(bytes),
            stats,
            &mut |j, _, b| {
                if let Some(&k) = claims.keys.get(first + j + LEAD) {
                    claims.cache.prefetch_slot(k);
                }
                claims.cache.publish(claims.keys[first + j], b);
                claims.filled += 1;
                false
            },
        )
    }
}

/// Prefetch distance, in rows, of the miss paths' probes and inserts.
const LEAD: usize = 8;

/// Probes the rows of `groups` in order and hands each result to `on`
/// with the group's index. A hit is copied to `bytes[u * rb..]`, or to a
/// scratch row without `bytes`. Each probe reads its set's tags and claim
/// lock, prefetched LEAD rows ahead, so a cold batch's claims are made at
/// memory speed.
fn probe_groups(
    seg: &Segment,
    groups: &[Group],
    rb: usize,
    mut bytes: Option<&mut [u8]>,
    evictions: &mut u64,
    mut on: impl FnMut(usize, Probe),
) {
    let mut spare = Vec::new();
    for g in groups.iter().take(LEAD) {
        seg.prefetch_probe(g.row);
    }
    for (u, g) in groups.iter().enumerate() {
        if let Some(a) = groups.get(u + LEAD) {
            seg.prefetch_probe(a.row);
        }
        let dst = match bytes.as_deref_mut() {
            Some(b) => &mut b[u * rb..(u + 1) * rb],
            None => {
                spare.resize(rb, 0);
                &mut spare[..]
            }
        };
        on(u, seg.probe(g.row, dst, evictions));
    }
}

/// The misses of a table published to Redis, `groups[u]` into
/// `bytes[u * rb..]`: every missed row is requested at once, and the rows
/// are probed while the requests are in flight, so the claims cost no
/// time of their own. A claimed row is published when it arrives; a row
/// another process holds or is filling is taken from the bytes read (the
/// same row, checked), never waited for. Two processes missing one row at
/// the same moment both read it: the price of not waiting, a round trip
/// each, against a file's read that a claim saves.
fn misses_during_read(
    remote: &crate::remote::RemoteTable,
    t: &Table,
    seg: &Segment,
    groups: &[Group],
    bytes: &mut [u8],
    stats: &mut GatherStats,
    d: &mut SegmentStats,
) -> Result<(), GatherError> {
    struct Claimed<'a> {
        claims: Claims<'a, Segment>,
        /// `groups[u]`'s index in `claims.keys`, if it was claimed.
        of: Vec<Option<usize>>,
    }
    let rb = t.row_bytes() as usize;
    let rows: Vec<u64> = groups.iter().map(|g| g.row).collect();
    let state = std::cell::RefCell::new(Claimed {
        claims: Claims::new(seg),
        of: vec![None; groups.len()],
    });
    let mut evictions = 0;
    let mut during = || {
        let mut st = state.borrow_mut();
        probe_groups(seg, groups, rb, None, &mut evictions, |u, p| {
            if let Probe::Claimed(slot) = p {
                st.of[u] = Some(st.claims.keys.len());
                st.claims.keys.push(slot);
            }
        });
    };
    let (mut cold, mut read) = (0, 0);
    let mut each = |k: usize, b: &[u8]| {
        bytes[k * rb..(k + 1) * rb].copy_from_slice(b);
        cold += (groups[k].end - groups[k].start) as u64;
        read += 1;
        let mut st = state.borrow_mut();
        if let Some(&Some(j)) = st.of.get(k + LEAD) {
            seg.prefetch_slot(st.claims.keys[j]);
        }
        if let Some(j) = st.of[k] {
            seg.publish(st.claims.keys[j], b);
            st.claims.filled += 1;
        }
    };
    let got = remote.read_then(&rows, &mut during, &mut each)?;
    let claimed = state.borrow().claims.keys.len() as u64;
    stats.read_bytes += got;
    stats.backend = Some("redis");
    stats.cold_rows += cold;
    stats.cache_misses += read;
    d.evictions += evictions;
    d.misses = claimed;
    d.uncached = read - claimed;
    d.bytes_read = got;
    Ok(())
}

/// Where the first look puts what it finds.
struct First<'a> {
    /// `staged[i * rb..]` for `rows[i]`.
    staged: &'a mut [u8],
    rb: usize,
    /// `(row, i)` of every row not found.
    missed: &'a mut Vec<(u64, usize)>,
}

/// The first look: copies each row of `rows` the segment holds to
/// `f.staged`, in request order, with no sort (a batch of hits needs
/// none), and pushes `(row, i)` of every other to `f.missed`. Each
/// distinct row is looked up once, at its first occurrence (`r`): a repeat
/// is copied from there if it was found, or joins the missed (one claim and
/// one count per distinct row).
///
/// A software pipeline over chunks of rows, so their memory latencies
/// overlap: the sets of chunk k + 2 are prefetched, the slots of chunk
/// k + 1 found (and their payloads prefetched), the rows of chunk k read.
/// Each stage is a tight loop of its own: a prefetch that misses the TLB
/// holds up retirement until its page walk ends, so walks overlap only when
/// many fit in the out-of-order window (one row's read between two
/// prefetches let about two overlap).
fn hits(seg: &Segment, rows: &[u64], r: &mut Repeats, f: First<'_>, d: &mut SegmentStats) {
    const CHUNK: usize = 16;
    let firsts = &r.firsts;
    let chunk = |at: usize| firsts.get(at..firsts.len().min(at + CHUNK)).unwrap_or(&[]);
    let mut found = [None; 2 * CHUNK];
    let find = |at: usize, found: &mut [Option<usize>; 2 * CHUNK]| {
        for (k, &i) in chunk(at).iter().enumerate() {
            found[(at + k) % (2 * CHUNK)] = seg.find(rows[i]);
        }
    };
    for &i in chunk(0).iter().chain(chunk(CHUNK)) {
        seg.prefetch_set(rows[i]);
    }
    find(0, &mut found);
    let rb = f.rb;
    for (u, &i) in firsts.iter().enumerate() {
        if u % CHUNK == 0 {
            for &a in chunk(u + 2 * CHUNK) {
                seg.prefetch_set(rows[a]);
            }
            find(u + CHUNK, &mut found);
        }
        let dst = &mut f.staged[i * rb..(i + 1) * rb];
        if found[u % (2 * CHUNK)].take().is_some_and(|s| seg.read(s, rows[i], dst)) {
            d.hits += 1;
            r.flags[i] = true;
        } else {
            f.missed.push((rows[i], i));
        }
    }
    for &(i, first) in &r.repeats {
        if r.flags[first] {
            f.staged.copy_within(first * rb..(first + 1) * rb, i * rb);
        } else {
            f.missed.push((rows[i], i));
        }
    }
}
