//! `cached`: a row cache in pleio's own memory under a byte budget, filled
//! by `O_DIRECT` reads, so neither the cache nor the page cache grows past
//! what the caller allowed.
//!
//! A gather finds its distinct ids (a hash table, no sort) and looks them
//! up in the [`RowCache`] ([`RowCache::lookup_many`]: shard by shard, the
//! memory loads of a run of rows asked for together): a hit's bytes (a
//! row's stored bytes: its parts concatenated in part order) are copied to
//! its request slot; a miss is claimed, and all claimed rows are sorted
//! and read together into one of the cache's budgeted staging buffers,
//! chunk by chunk, each row copied out and stored as soon as the read
//! holding it is in, while the chunk's later reads are still in flight
//! ([`Reader::read_each`]; a row of several parts, a checkpoint's, once
//! the chunk is in). A chunk's
//! reads are the aligned blocks covering every part of every row (the
//! coalescer's block mode, [`crate::coalesce`]: blocks of one region that
//! touch merged into one read), laid out file by file
//! and read in one batch of one private `O_DIRECT` io_uring over every
//! file the table's rows are in. The staged rows, in request order, are
//! written to the output in one copy or one decoder call. A
//! row another gather is reading at that moment is waited for, not read
//! twice. Every row's bytes are collected first (hits copied out of the
//! cache under the shard's lock) and written to the output last, so a
//! failed read leaves it untouched. Where `O_DIRECT` or io_uring is
//! unavailable for any of the files the reads of every file go through the
//! buffered backends (flagged as a fallback).
//!
//! The cache stays true to the files: each gather first looks at every
//! file holding rows of the table (one `fstat` each: one for a GGUF
//! tensor), and if the length, inode, modification or change time of any
//! differ from what the previous gather saw, the cache is emptied, so a
//! file that shrank is an error (its rows are read again, and the reads
//! fail) and a file rewritten in place is served as it is now, never as a
//! mix of old and new rows. A change landing while a gather runs is seen
//! by the next one. Files of a checkpoint that hold none of the table's
//! rows are not looked at: nothing cached came from them.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::direct::{read_error, with_scratch, Kind, Picked, Scratch};
use super::{with_staged, GatherError, GatherStats, Staged, Table};
use crate::cache::{CachePolicy, Found, RowCache, Sizing};
use crate::coalesce::{CoalesceError, Mode, Plan};
use crate::io::process::PerProcess;
use crate::io::{Engine, Extent, IoError, Read, Reader, ReaderConfig};
use crate::layout::Layout;
use crate::output::{Decoder, Out};
use crate::quant::DecodeError;
use crate::tuning::TUNING;

/// The row cache budget of a table handle that did not set one.
pub const DEFAULT_BUDGET: u64 = 256 << 20;

/// Reads in flight on the cache's ring
/// ([`Tuning::cache_queue_depth`](crate::tuning::Tuning::cache_queue_depth)).
const QUEUE_DEPTH: u32 = TUNING.cache_queue_depth;

/// A handle's cache settings and the cache, made on first use (clones of
/// the handle share it). Each process has its own cache: a child forked
/// while another thread of the parent held a shard's lock, had rows
/// claimed or staging on loan would wait forever for the parent's thread
/// (which does not exist in the child) to let go; it starts empty instead.
pub(super) struct CacheCell {
    pub(super) budget: u64,
    pub(super) policy: CachePolicy,
    cache: PerProcess<Result<Arc<CachedReader>, String>>,
    /// The machine-wide cache's reader (strategy `shared`), same budget.
    pub(super) shared: super::shared::SharedCell,
}

impl CacheCell {
    pub(super) fn new(budget: u64, policy: CachePolicy) -> CacheCell {
        CacheCell {
            budget,
            policy,
            cache: PerProcess::lazy(),
            shared: super::shared::SharedCell::default(),
        }
    }

    /// This process's cache if it has been made.
    pub(super) fn made(&self) -> Option<&CachedReader> {
        self.cache.get()?.as_ref().ok().map(|c| &**c)
    }
}

/// A row cache and the reader that fills it.
pub(super) struct CachedReader {
    pub(super) cache: RowCache,
    /// Reads the misses.
    miss: MissReader,
}

/// What a row cache's misses are read with (`cached` and `shared`): the
/// table's files, or the Redis cluster a remote table is published to.
pub(super) struct MissReader {
    /// The strategy, named in errors.
    backend: &'static str,
    source: MissSource,
}

enum MissSource {
    Files(FileMisses),
    /// A table published to Redis: misses go to the cluster.
    Remote(Arc<crate::remote::RemoteTable>),
}

/// One `O_DIRECT` io_uring over every file the table's rows are in, or a
/// buffered reader standing in (flagged), the chunk planning over the
/// coalescer's block mode, and the files' stamps at the last gather.
struct FileMisses {
    reader: Picked,
    /// Alignment of every read (a multiple of each file's `O_DIRECT`
    /// alignment; 1 when buffered).
    align: usize,
    /// Regions of the table ([`Layout::regions`]).
    regions: usize,
    /// How each of the reader's files looked at the last gather.
    seen: Mutex<Vec<Option<Stamp>>>,
}

/// What a file's `fstat` says about its contents: if any of it changes,
/// rows cached before may be wrong.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(f: &File) -> std::io::Result<Stamp> {
        let m = f.metadata()?;
        Ok(Stamp {
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// A cache whose claims can be given back (the private row cache: by row;
/// the shared segment: by slot).
pub(super) trait Claimer {
    /// What names a claim.
    type Key: Copy;
    /// Gives a claim back unfilled.
    fn abandon(&self, key: Self::Key);
}

impl Claimer for RowCache {
    type Key = u64;
    fn abandon(&self, row: u64) {
        RowCache::abandon(self, row);
    }
}

/// Claims a gather holds: on an early return every claim not yet filled
/// is abandoned, so other gathers waiting for those rows read them
/// themselves instead of waiting forever.
pub(super) struct Claims<'a, C: Claimer> {
    pub(super) cache: &'a C,
    pub(super) keys: Vec<C::Key>,
    pub(super) filled: usize,
}

impl<'a, C: Claimer> Claims<'a, C> {
    pub(super) fn new(cache: &'a C) -> Claims<'a, C> {
        Claims {
            cache,
            keys: Vec::new(),
            filled: 0,
        }
    }
}

impl<C: Claimer> Drop for Claims<'_, C> {
    fn drop(&mut self) {
        for &k in &self.keys[self.filled..] {
            self.cache.abandon(k);
        }
    }
}

/// A distinct row and the range of the request holding it: its run in
/// the sorted request (`redis`, `shared`), or its one request index
/// (`cached`'s reads).
#[derive(Clone, Copy)]
pub(super) struct Group {
    pub(super) row: u64,
    pub(super) start: usize,
    pub(super) end: usize,
}

/// Sorts the request into `s.order` (row, request index), sizes the
/// staging `st` for its distinct rows and returns them.
pub(super) fn group_request(
    t: &Table,
    s: &mut Scratch,
    st: &mut Staged,
    rows: &[u64],
    out: &Out<'_>,
) -> Result<Vec<Group>, GatherError> {
    s.order.clear();
    s.order.extend(rows.iter().copied().zip(0..));
    super::order::sort_pairs(&mut s.order, &mut s.sort);
    let groups = groups_of(&s.order);
    t.stage_rows(&mut st.bytes, groups.len(), rows.len(), out)?;
    Ok(groups)
}

/// The distinct rows of `order` (sorted by row) and where each one's run
/// is.
pub(super) fn groups_of(order: &[(u64, usize)]) -> Vec<Group> {
    let mut groups = Vec::new();
    let mut k = 0;
    while k < order.len() {
        let row = order[k].0;
        let mut e = k + 1;
        while e < order.len() && order[e].0 == row {
            e += 1;
        }
        groups.push(Group {
            row,
            start: k,
            end: e,
        });
        k = e;
    }
    groups
}

/// Writes each distinct row's staged bytes (`staged[u * rb..]` for
/// `groups[u]`) to every request slot of its group. A decoded output gets
/// the rows put back in request order in `ordered` (scratch) and decoded
/// as one batch ([`Out::put_decoded_rows`]): one decoder call a row cost a
/// warm 1792-row IQ4_NL gather to f32 1.7x the decode time of one call.
pub(super) fn put_groups(
    out: &mut Out<'_>,
    order: &[(u64, usize)],
    groups: &[Group],
    staged: &[u8],
    rb: usize,
    decoder: &Decoder,
    ordered: &mut Vec<u8>,
) -> Result<(), DecodeError> {
    if !out.is_raw() && order.len() > 1 {
        if let Some(len) = order.len().checked_mul(rb) {
            if ordered.len() < len {
                ordered.resize(len, 0);
            }
            for (u, g) in groups.iter().enumerate() {
                let src = &staged[u * rb..(u + 1) * rb];
                for &(_, i) in &order[g.start..g.end] {
                    ordered[i * rb..(i + 1) * rb].copy_from_slice(src);
                }
            }
            if out.put_decoded_rows(&ordered[..len], decoder)? {
                return Ok(());
            }
        }
    }
    for (u, g) in groups.iter().enumerate() {
        put_all(out, &order[g.start..g.end], &staged[u * rb..(u + 1) * rb], decoder)?;
    }
    Ok(())
}

/// Writes one row's bytes to every request slot of its group.
fn put_all(
    out: &mut Out<'_>,
    slots: &[(u64, usize)],
    bytes: &[u8],
    decoder: &Decoder,
) -> Result<(), DecodeError> {
    for &(_, i) in slots {
        out.put(i, bytes, decoder)?;
    }
    Ok(())
}

impl Table {
    /// The handle's cache in this process, made on first use.
    pub(super) fn cached_reader(&self) -> Result<&CachedReader, GatherError> {
        let cell = &self.cache;
        cell.cache
            .get_or_init(|| CachedReader::create(self, cell.budget, cell.policy).map(Arc::new))
            .as_ref()
            .map(|c| &**c)
            .map_err(|reason| GatherError::Setup {
                backend: "cached",
                reason: reason.clone(),
            })
    }

    pub(super) fn gather_cached(
        &self,
        rows: &[u64],
        out: &mut Out<'_>,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        let cr = self.cached_reader()?;
        cr.check_file()?;
        let r = with_scratch(|s| with_staged(|st| cr.gather(self, rows, out, s, st, stats)));
        let k = cr.cache.counters();
        stats.cache_bytes = Some(k.resident_bytes);
        r
    }
}

impl CachedReader {
    fn create(t: &Table, budget: u64, policy: CachePolicy) -> Result<CachedReader, String> {
        let miss = MissReader::open(t, "cached")?;
        let sizing = Sizing::for_table(budget, &t.shared.table, miss.align(), policy)
            .map_err(|e| e.to_string())?;
        Ok(CachedReader {
            cache: RowCache::new(sizing),
            miss,
        })
    }

    /// Empties the cache if any file holding rows changed since the last
    /// look (one `fstat` per such file; see the module docs).
    pub(super) fn check_file(&self) -> Result<(), GatherError> {
        if self.miss.changed()? {
            self.cache.clear();
        }
        Ok(())
    }

    /// Every row's bytes are gathered into `st` in request order (each
    /// distinct row looked up once: hits copied out of the cache, misses
    /// read, repeats copied from their first occurrence), and only then
    /// written to `out`, in one copy or one decoder call: a failed read
    /// leaves the output untouched. The request is not sorted: its distinct
    /// rows are found with a hash table ([`super::order::Repeats`]), and
    /// only the misses are sorted, for the reads (a warm 1792-row gather
    /// spent 17% of its time sorting the request, and more putting the
    /// rows back in request order).
    fn gather(
        &self,
        t: &Table,
        rows: &[u64],
        out: &mut Out<'_>,
        s: &mut Scratch,
        st: &mut Staged,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        let rb = t.row_bytes() as usize;
        let need = t.stage_rows(&mut st.bytes, rows.len(), rows.len(), out)?;
        let r = &mut s.repeats;
        r.split(rows);
        let firsts = &r.firsts;
        let mut claims = Claims::new(&self.cache);
        // Request indices of the rows this gather claimed, and of those
        // another gather was reading.
        let (mut missed, mut busy) = (Vec::new(), Vec::new());
        let bytes = &mut st.bytes;
        self.cache.lookup_many(
            firsts.len(),
            |j| rows[firsts[j]],
            &mut s.by_shard,
            |j, found, b| {
                let i = firsts[j];
                match found {
                    Found::Hit => {
                        stats.cache_hits += 1;
                        copy_row(&mut bytes[i * rb..(i + 1) * rb], b)?;
                    }
                    Found::Claimed => {
                        claims.keys.push(rows[i]);
                        missed.push(i);
                    }
                    Found::Busy => busy.push(i),
                }
                Ok::<(), GatherError>(())
            },
        )?;
        // Read in row order, which the claims' bookkeeping (filled in that
        // order) goes by.
        claims.keys.sort_unstable();
        missed.sort_unstable_by_key(|&i| rows[i]);
        self.read_fill(t, rows, &missed, Some(&mut st.bytes[..need]), &mut claims, stats)?;
        // Rows other gathers were reading: by now they are in, or their
        // reader gave up and the row is ours to read.
        let mut cold = std::mem::take(&mut missed);
        missed.clear();
        busy.sort_unstable_by_key(|&i| rows[i]);
        for &i in &busy {
            let dst = &mut st.bytes[i * rb..(i + 1) * rb];
            match self.cache.wait_lookup(rows[i], |b| copy_row(dst, b))? {
                Found::Hit => stats.cache_hits += 1,
                _ => {
                    claims.keys.push(rows[i]);
                    missed.push(i);
                }
            }
        }
        self.read_fill(t, rows, &missed, Some(&mut st.bytes[..need]), &mut claims, stats)?;
        // Repeats: their first occurrence's bytes (counted cold with it).
        cold.extend_from_slice(&missed);
        for f in cold {
            r.flags[f] = true;
        }
        for &(i, first) in &r.repeats {
            st.bytes.copy_within(first * rb..(first + 1) * rb, i * rb);
            stats.cold_rows += u64::from(r.flags[first]);
        }
        t.put_staged(&st.bytes[..need], None, out)
    }

    /// Reads the claimed rows `rows[i]` for `i` in `picked` (ascending by
    /// row) chunk by chunk into staging, copies each to `dst` (at `i * row
    /// bytes`, when given) and stores it in the cache.
    fn read_fill(
        &self,
        t: &Table,
        rows: &[u64],
        picked: &[usize],
        mut dst: Option<&mut [u8]>,
        claims: &mut Claims<'_, RowCache>,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        if picked.is_empty() {
            return Ok(());
        }
        let rb = t.row_bytes() as usize;
        // Each row a group of its own, over its request index.
        let groups: Vec<Group> = picked
            .iter()
            .map(|&i| Group {
                row: rows[i],
                start: i,
                end: i + 1,
            })
            .collect();
        let all: Vec<usize> = (0..groups.len()).collect();
        let mut staging = self.cache.staging();
        self.miss.read_groups(
            t,
            &groups,
            &all,
            staging.bytes(),
            None,
            stats,
            &mut |_, g, bytes| {
                if let Some(d) = dst.as_deref_mut() {
                    d[g.start * rb..(g.start + 1) * rb].copy_from_slice(bytes);
                }
                claims.filled += 1;
                self.cache.fill(g.row, bytes)
            },
        )
    }
}

impl MissReader {
    /// The reader of `t`'s rows for strategy `backend`.
    pub(super) fn open(t: &Table, backend: &'static str) -> Result<MissReader, String> {
        if let super::Source::Remote { table, .. } = &t.shared.source {
            return Ok(MissReader {
                backend,
                source: MissSource::Remote(table.clone()),
            });
        }
        let layout = &t.shared.table;
        let backends = &t.shared.backends;
        let paths = backends
            .used()
            .iter()
            .map(|&i| {
                backends
                    .path(i)
                    .ok_or_else(|| "the table was opened without a file path".to_string())
            })
            .collect::<Result<Vec<_>, String>>()?;
        let cfg = ReaderConfig {
            queue_depth: QUEUE_DEPTH,
            direct: true,
            ..ReaderConfig::new(Engine::Uring)
        };
        // O_DIRECT io_uring on every file, or buffered reads on all.
        let reader = match Reader::open(&paths, cfg) {
            Ok(r) => Picked {
                reader: Arc::new(r),
                fallback: false,
            },
            Err(IoError::UringUnavailable(_) | IoError::DirectUnsupported { .. }) => {
                let mut p = backends
                    .get(Kind::Uring, backend)
                    .map_err(|e| e.to_string())?;
                p.fallback = true;
                p
            }
            Err(e) => return Err(e.to_string()),
        };
        let r = &reader.reader;
        let align = r.common_alignment();
        let seen = (0..r.files())
            .map(|k| r.file(k).and_then(|f| Stamp::of(f).ok()))
            .collect();
        Ok(MissReader {
            backend,
            source: MissSource::Files(FileMisses {
                regions: layout.regions().count(),
                reader,
                align,
                seen: Mutex::new(seen),
            }),
        })
    }

    /// Alignment of every read (1 when buffered or remote).
    pub(super) fn align(&self) -> usize {
        match &self.source {
            MissSource::Files(f) => f.align,
            MissSource::Remote(_) => 1,
        }
    }

    /// The published table the misses are read from, if remote.
    pub(super) fn remote(&self) -> Option<&crate::remote::RemoteTable> {
        match &self.source {
            MissSource::Files(_) => None,
            MissSource::Remote(r) => Some(r),
        }
    }

    /// The reader of the misses (`None` for a remote table).
    pub(super) fn reader(&self) -> Option<&Reader> {
        match &self.source {
            MissSource::Files(f) => Some(&f.reader.reader),
            MissSource::Remote(_) => None,
        }
    }

    /// True if any file holding rows changed since the last look (one
    /// `fstat` per such file). A published table never changes: its id
    /// names its contents.
    pub(super) fn changed(&self) -> Result<bool, GatherError> {
        match &self.source {
            MissSource::Files(f) => f.changed(),
            MissSource::Remote(_) => Ok(false),
        }
    }

    /// Reads the rows `groups[u]`, `u` in `picked` (ascending), into
    /// `staging`, copies each to `dst` (at `u * row bytes`, when given),
    /// counts it as a miss and hands it to `store` (with its index in
    /// `picked`), which says if storing it evicted a row.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_groups(
        &self,
        t: &Table,
        groups: &[Group],
        picked: &[usize],
        staging: &mut [u8],
        mut dst: Option<&mut [u8]>,
        stats: &mut GatherStats,
        store: &mut dyn FnMut(usize, &Group, &[u8]) -> bool,
    ) -> Result<(), GatherError> {
        if picked.is_empty() {
            return Ok(());
        }
        let rb = t.row_bytes() as usize;
        let rows: Vec<u64> = picked.iter().map(|&u| groups[u].row).collect();
        self.read_rows(t, &rows, staging, stats, &mut |j, bytes, stats| {
            let u = picked[j];
            let g = &groups[u];
            if let Some(d) = dst.as_deref_mut() {
                d[u * rb..(u + 1) * rb].copy_from_slice(bytes);
            }
            stats.cold_rows += (g.end - g.start) as u64;
            stats.cache_misses += 1;
            if store(j, g, bytes) {
                stats.cache_evictions += 1;
            }
        })
    }

    /// Reads ascending `rows` (chunk by chunk into `buf`, aligned
    /// staging, from files; in one pipelined round from a cluster) and
    /// hands each row's stored bytes (its parts joined in part order) to
    /// `each` with the row's index in `rows`.
    fn read_rows(
        &self,
        t: &Table,
        rows: &[u64],
        buf: &mut [u8],
        stats: &mut GatherStats,
        each: &mut dyn FnMut(usize, &[u8], &mut GatherStats),
    ) -> Result<(), GatherError> {
        match &self.source {
            MissSource::Files(f) => f.read_rows(self.backend, t, rows, buf, stats, each),
            MissSource::Remote(remote) => {
                let bytes = remote.read(rows, &mut |j, b| each(j, b, stats))?;
                stats.read_bytes += bytes;
                stats.backend = Some("redis");
                Ok(())
            }
        }
    }

}

impl FileMisses {
    /// True if any file holding rows changed since the last look (one
    /// `fstat` per such file).
    fn changed(&self) -> Result<bool, GatherError> {
        let r = &self.reader.reader;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = false;
        for (k, seen) in seen.iter_mut().enumerate() {
            let now = r
                .file(k)
                .ok_or_else(|| std::io::Error::other("no such file"))
                .and_then(Stamp::of)
                .map_err(|error| GatherError::Read {
                    backend: r.name(),
                    path: r.path(k).map(Path::to_path_buf).unwrap_or_default(),
                    error: IoError::Os {
                        what: "fstat",
                        error,
                    },
                })?;
            if *seen != Some(now) {
                changed = true;
                *seen = Some(now);
            }
        }
        Ok(changed)
    }

    /// Reads ascending `rows` chunk by chunk into `buf` (aligned staging)
    /// and hands each row's stored bytes (its parts joined in part order)
    /// to `each` with the row's index in `rows`.
    fn read_rows(
        &self,
        backend: &'static str,
        t: &Table,
        rows: &[u64],
        buf: &mut [u8],
        stats: &mut GatherStats,
        each: &mut dyn FnMut(usize, &[u8], &mut GatherStats),
    ) -> Result<(), GatherError> {
        let layout = &t.shared.table;
        let rb = layout.row_bytes() as usize;
        let part_len: Vec<usize> = layout.shards()[0]
            .parts
            .iter()
            .map(|p| p.row_bytes as usize)
            .collect();
        let mut plan = ChunkPlan::new(self.regions);
        let mut joined = Vec::with_capacity(if part_len.len() > 1 { rb } else { 0 });
        let mut next = 0;
        while next < rows.len() {
            let chunk = &rows[next..];
            let n = plan.plan(
                layout,
                self.align as u64,
                chunk.iter().copied(),
                buf.len(),
                backend,
            )?;
            if n == 0 {
                return Err(GatherError::Setup {
                    backend,
                    reason: format!(
                        "staging of {} bytes cannot hold the reads of one row",
                        buf.len()
                    ),
                });
            }
            // Rows of one part each, in staging order, are handed over as
            // the read holding them comes in, while later reads are still in
            // flight; the rest once the chunk is in.
            let at = plan.at();
            let stream = match part_len[..] {
                [_] => at.windows(2).all(|w| w[0] <= w[1]),
                _ => false,
            };
            let mut j = 0;
            self.read_plan(backend, t, &plan, buf, stats, &mut |dst, bytes, stats| {
                while stream && j < n {
                    let part = at[j]
                        .checked_sub(dst)
                        .and_then(|a| bytes.get(a..a + part_len[0]));
                    let Some(part) = part else { break };
                    each(next + j, part, stats);
                    j += 1;
                }
            })?;
            for j in j..n {
                let at = &at[j * part_len.len()..(j + 1) * part_len.len()];
                let bytes = if let [len] = part_len[..] {
                    &buf[at[0]..at[0] + len]
                } else {
                    joined.clear();
                    for (&a, &len) in at.iter().zip(&part_len) {
                        joined.extend_from_slice(&buf[a..a + len]);
                    }
                    &joined[..]
                };
                each(next + j, bytes, stats);
            }
            next += n;
        }
        Ok(())
    }

    /// Reads a planned chunk into `buf`: every file's extents, back to
    /// back, in one batch of the reader (all in flight at its queue depth,
    /// whatever file they are in), handing each extent's bytes to `each`
    /// with where they are in `buf`, in order, as they come in
    /// ([`Reader::read_each`]).
    fn read_plan(
        &self,
        backend: &'static str,
        t: &Table,
        plan: &ChunkPlan,
        buf: &mut [u8],
        stats: &mut GatherStats,
        each: &mut dyn FnMut(usize, &[u8], &mut GatherStats),
    ) -> Result<(), GatherError> {
        let mut reads = Vec::with_capacity(plan.extents.len());
        let mut base = 0usize;
        for &(index, ref range) in &plan.files {
            let k = t
                .shared
                .backends
                .slot(index)
                .ok_or(GatherError::NoFile {
                    strategy: backend,
                })?;
            for e in &plan.extents[range.clone()] {
                reads.push(Read {
                    file: k,
                    offset: e.offset,
                    len: e.len,
                    dst: base,
                    need: e.want,
                });
                base += e.len;
            }
        }
        let r = &self.reader.reader;
        let io = r
            .read_each(&reads, &mut buf[..base], &mut |i, bytes| {
                each(reads[i].dst, bytes, stats)
            })
            .map_err(|e| read_error(r, e))?;
        stats.read_requests += io.requests;
        stats.read_bytes += io.bytes;
        stats.backend = Some(r.name());
        stats.fallback |= self.reader.fallback;
        Ok(())
    }

}

impl CachedReader {
    /// Brings the first `capacity` distinct rows of `rows` (hottest first)
    /// into the cache, reading the missing ones chunk by chunk at the
    /// ring's full queue depth; `progress(done, total)` after each chunk.
    /// Rows already cached or being read by a gather are skipped. Returns
    /// the rows read and the rows wanted (the first `capacity` distinct
    /// rows, in rank order).
    pub(super) fn prewarm(
        &self,
        t: &Table,
        rows: &[u64],
        progress: &mut dyn FnMut(u64, u64),
        stats: &mut GatherStats,
    ) -> Result<(u64, Vec<u64>), GatherError> {
        self.check_file()?;
        let capacity = self.cache.sizing().capacity() as usize;
        let mut want: Vec<u64> = Vec::with_capacity(rows.len().min(capacity));
        let mut seen = std::collections::HashSet::new();
        for &r in rows {
            if want.len() >= capacity {
                break;
            }
            if seen.insert(r) {
                want.push(r);
            }
        }
        let wanted = want.clone();
        want.sort_unstable();
        let mut claims = Claims::new(&self.cache);
        let none = |_: &[u8]| Ok::<(), GatherError>(());
        for &r in &want {
            if self.cache.lookup(r, none)? == Found::Claimed {
                claims.keys.push(r);
            }
        }
        let claimed = claims.keys.clone();
        let total = claimed.len() as u64;
        // Rows whose reads fill about one staging buffer per step.
        let per = (self.cache.sizing().staging_bytes / 4096).max(64);
        let all: Vec<usize> = (0..claimed.len()).collect();
        let mut done = 0u64;
        progress(0, total);
        for chunk in all.chunks(per) {
            self.read_fill(t, &claimed, chunk, None, &mut claims, stats)?;
            done += chunk.len() as u64;
            progress(done, total);
        }
        Ok((done, wanted))
    }
}

/// Copies a cached row's bytes out (under its shard's lock).
fn copy_row(dst: &mut [u8], src: &[u8]) -> Result<(), GatherError> {
    dst.copy_from_slice(src);
    Ok(())
}

/// The reads of one chunk of rows: the coalescer's block mode over every
/// part of every row (a region's parts are one stream, so blocks of one
/// region that touch merge into one extent), laid out in staging file by
/// file (each file's extents by offset, back to back), and where each part
/// landed.
struct ChunkPlan {
    /// The extents, grouped by file, ascending by offset within a file.
    extents: Vec<Extent>,
    /// Each file's run of `extents`, ascending by file index.
    files: Vec<(usize, std::ops::Range<usize>)>,
    /// The coalescer's plan: its `at()[j * parts + k]` is the staging
    /// position of part `k` of the chunk's row `j`.
    plan: Plan,
}

impl ChunkPlan {
    /// A plan for a table of `regions` regions (one stream each).
    fn new(regions: usize) -> ChunkPlan {
        ChunkPlan {
            extents: Vec::new(),
            files: Vec::new(),
            plan: Plan::with_streams(regions),
        }
    }

    /// Where each part of each planned row landed (`j * parts + k`).
    fn at(&self) -> &[usize] {
        self.plan.at()
    }

    /// Plans ascending `rows` while their blocks fit in `room` bytes of
    /// staging (a row's parts all or none); returns how many rows.
    fn plan(
        &mut self,
        layout: &Layout,
        align: u64,
        rows: impl Iterator<Item = u64>,
        room: usize,
        backend: &'static str,
    ) -> Result<usize, GatherError> {
        let setup = |e: CoalesceError| GatherError::Setup {
            backend,
            reason: format!("planning reads: {e}"),
        };
        self.plan.start(Mode::Block {
            block: align,
            page: align,
        });
        let mut used = 0u64;
        let mut n = 0usize;
        for row in rows {
            let ex = layout.extents(row)?;
            let ex = ex.as_slice();
            // The bytes this row adds: each part's blocks past the end of
            // its region's open extent.
            let mut grow = 0u64;
            for e in ex {
                grow += self
                    .plan
                    .grow(e.region, e.file, e.offset, e.len)
                    .map_err(setup)?;
            }
            if used + grow > room as u64 {
                break;
            }
            used += grow;
            for e in ex {
                self.plan
                    .push(e.region, e.file, e.offset, e.len)
                    .map_err(setup)?;
            }
            n += 1;
        }
        self.plan.finish().map_err(setup)?;
        self.extents.clear();
        self.extents.extend(self.plan.runs().iter().map(|r| Extent {
            offset: r.start,
            len: r.len() as usize,
            want: (r.want - r.start) as usize,
        }));
        self.files.clear();
        self.files.extend_from_slice(self.plan.files());
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Shard, ShardPart};

    fn part(file: usize, offset: u64, row_bytes: u64) -> ShardPart {
        ShardPart {
            tensor: String::new(),
            file,
            offset,
            row_bytes,
        }
    }

    /// Images of `files` (each byte a function of its file and offset).
    fn byte(file: usize, off: u64) -> u8 {
        ((off * 7 + file as u64 * 13) % 251) as u8
    }

    /// Reads `plan` from the images as the readers would: each file's
    /// extents back to back, `want` bytes each.
    fn staged(plan: &ChunkPlan) -> Vec<u8> {
        let mut buf = Vec::new();
        for (file, r) in &plan.files {
            for e in &plan.extents[r.clone()] {
                assert!(e.want <= e.len);
                buf.extend((e.offset..e.offset + e.len as u64).map(|o| byte(*file, o)));
            }
        }
        buf
    }

    #[test]
    fn one_region_plans_cover_rows_and_merge_touching_blocks() {
        // 90-byte rows from offset 1000, 4096-byte blocks. Rows 0 and 1
        // share block 0; row 44 straddles blocks 0/1 (4960..5050); row 1000
        // is far away.
        let t = Layout::for_test(
            vec![Shard {
                index: 0,
                row_start: 0,
                rows: 2000,
                parts: vec![part(0, 1000, 90)],
            }],
            90,
        );
        let mut p = ChunkPlan::new(1);
        let rows = [0u64, 1, 44, 1000];
        let n = p.plan(&t, 4096, rows.iter().copied(), 1 << 20, "cached").unwrap();
        assert_eq!(n, 4);
        assert_eq!(p.extents.len(), 2);
        assert_eq!(p.files, vec![(0, 0..2)]);
        assert_eq!((p.extents[0].offset, p.extents[0].len), (0, 8192));
        assert_eq!(p.extents[0].want, 5050);
        let far = 1000 + 1000 * 90;
        assert_eq!(p.extents[1].offset, far / 4096 * 4096);
        let buf = staged(&p);
        for (&r, &a) in rows.iter().zip(p.at()) {
            let s = 1000 + r * 90;
            let want: Vec<u8> = (s..s + 90).map(|o| byte(0, o)).collect();
            assert_eq!(&buf[a..a + 90], &want[..], "row {r}");
        }
        // A room of one block plans only the rows inside it.
        let n = p.plan(&t, 4096, rows.iter().copied(), 4096, "cached").unwrap();
        assert_eq!(n, 2);
        assert_eq!(p.extents.len(), 1);
        // Buffered (alignment 1): each row exactly, neighbours merged.
        let n = p.plan(&t, 1, rows.iter().copied(), 1 << 20, "cached").unwrap();
        assert_eq!(n, 4);
        assert_eq!(p.extents.len(), 3);
        assert_eq!((p.extents[0].offset, p.extents[0].len), (1000, 180));
    }

    #[test]
    fn parts_over_files_land_where_at_says_and_rows_stay_whole() {
        // Two shards of 10 rows, three parts each (40 + 8 + 4 bytes); shard 0
        // in file 1 (parts at unaligned offsets), shard 1's parts split
        // over files 0 and 2, one of them sharing a block with another
        // region.
        let shards = vec![
            Shard {
                index: 0,
                row_start: 0,
                rows: 10,
                parts: vec![part(1, 4090, 40), part(1, 9000, 8), part(1, 9083, 4)],
            },
            Shard {
                index: 1,
                row_start: 10,
                rows: 10,
                parts: vec![part(2, 100, 40), part(0, 4095, 8), part(2, 600, 4)],
            },
        ];
        let t = Layout::for_test(shards, 52);
        let mut p = ChunkPlan::new(1);
        let rows = [0u64, 1, 9, 10, 15, 19];
        let n = p.plan(&t, 512, rows.iter().copied(), 1 << 20, "cached").unwrap();
        assert_eq!(n, rows.len());
        let files: Vec<usize> = p.files.iter().map(|f| f.0).collect();
        assert_eq!(files, vec![0, 1, 2]);
        for e in &p.extents {
            assert!(e.offset % 512 == 0 && e.len % 512 == 0);
        }
        let buf = staged(&p);
        for (j, &r) in rows.iter().enumerate() {
            for (k, x) in t.extents(r).unwrap().as_slice().iter().enumerate() {
                let a = p.at()[j * 3 + k];
                let want: Vec<u8> = (x.offset..x.offset + x.len)
                    .map(|o| byte(x.file, o))
                    .collect();
                assert_eq!(&buf[a..a + x.len as usize], &want[..], "row {r} part {k}");
            }
        }
        // A room too small for a whole row plans none of its parts.
        let n = p.plan(&t, 512, rows.iter().copied(), 1024, "cached").unwrap();
        assert_eq!(n, 0);
        assert!(p.extents.is_empty() && p.at().is_empty());
        let n = p.plan(&t, 512, rows.iter().copied(), 2048, "cached").unwrap();
        assert_eq!(n, 3, "rows 0, 1 and 9 share their blocks");
    }
}
