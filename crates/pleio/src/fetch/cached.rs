//! `cached`: a row cache in pleio's own memory under a byte budget, filled
//! by `O_DIRECT` reads, so neither the cache nor the page cache grows past
//! what the caller allowed.
//!
//! A gather sorts and deduplicates its ids and looks each distinct row up
//! in the [`RowCache`]: a hit is decoded from the cache's bytes; a miss is
//! claimed, and all claimed rows are read together through a private
//! `O_DIRECT` io_uring (the aligned blocks covering each row, blocks that
//! touch merged into one read) into one of the cache's budgeted staging
//! buffers, chunk by chunk, then decoded and stored. A row another gather
//! is reading at that moment is waited for, not read twice. Every row's
//! bytes are collected first (hits copied out of the cache under the
//! shard's lock) and written to the output last, so a failed read leaves
//! it untouched. Where `O_DIRECT` or io_uring is unavailable the reads go
//! through the buffered backends (flagged as a fallback).
//!
//! The cache stays true to the file: each gather first looks at the file
//! (one `fstat`), and if its length, inode, modification or change time
//! differ from what the previous gather saw, the cache is emptied, so a
//! file that shrank is an error (its rows are read again, and the reads
//! fail) and a file rewritten in place is served as it is now, never as a
//! mix of old and new rows. A change landing while a gather runs is seen
//! by the next one.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use super::direct::{with_scratch, Kind, Picked, Scratch};
use super::{with_staged, GatherError, GatherStats, Staged, Table};
use crate::cache::{CachePolicy, Found, RowCache, Sizing};
use crate::io::{Extent, IoError, ReadPlan, ReadStats, RowReads, UringBackend, UringConfig};
use crate::output::{Decoder, Out};
use crate::quant::DecodeError;

/// The row cache budget of a table handle that did not set one.
pub const DEFAULT_BUDGET: u64 = 256 << 20;

/// Reads in flight on the cache's ring. Measured on the build machine's
/// virtio disk under load (cold replays of 16k corpus tokens, four rounds):
/// 256 beat 64 in every round (4.6-8.3k against 3.2-5.7k tokens/s); 512
/// was no better.
const QUEUE_DEPTH: u32 = 256;

/// A handle's cache settings and the cache, made on first use (clones of
/// the handle share it).
pub(super) struct CacheCell {
    pub(super) budget: u64,
    pub(super) policy: CachePolicy,
    cache: OnceLock<Result<Arc<CachedReader>, String>>,
}

impl CacheCell {
    pub(super) fn new(budget: u64, policy: CachePolicy) -> CacheCell {
        CacheCell {
            budget,
            policy,
            cache: OnceLock::new(),
        }
    }

    /// The cache if it has been made.
    pub(super) fn made(&self) -> Option<&CachedReader> {
        self.cache.get()?.as_ref().ok().map(|c| &**c)
    }
}

/// How misses are read.
enum Reader {
    /// `O_DIRECT` io_uring straight into aligned staging.
    Direct(Box<UringBackend>),
    /// A buffered backend standing in (no io_uring or no `O_DIRECT`).
    Buffered(Picked),
}

/// A row cache and the reader that fills it.
pub(super) struct CachedReader {
    pub(super) cache: RowCache,
    reader: Reader,
    /// The file the reads go to, and how it looked at the last gather.
    file: File,
    seen: Mutex<Option<Stamp>>,
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

/// Claims a gather holds: on an early return every claim not yet filled
/// is abandoned, so other gathers waiting for those rows read them
/// themselves instead of waiting forever.
struct Claims<'a> {
    cache: &'a RowCache,
    rows: Vec<u64>,
    filled: usize,
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        for &row in &self.rows[self.filled..] {
            self.cache.abandon(row);
        }
    }
}

/// A distinct row and the range of the sorted request holding it.
#[derive(Clone, Copy)]
struct Group {
    row: u64,
    start: usize,
    end: usize,
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
    /// The handle's cache, made on first use.
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
        cr.check_file(self)?;
        let r = with_scratch(|s| with_staged(|st| cr.gather(self, rows, out, s, st, stats)));
        let k = cr.cache.counters();
        stats.cache_bytes = Some(k.resident_bytes);
        r
    }
}

impl CachedReader {
    fn create(t: &Table, budget: u64, policy: CachePolicy) -> Result<CachedReader, String> {
        if t.shared.table.regions().count() != 1 {
            return Err(
                "the cached strategy serves tables stored as one region of one file \
                 (a GGUF tensor); this table's rows are split over several"
                    .into(),
            );
        }
        let path = t
            .shared
            .backends
            .path(0)
            .ok_or("the table was opened without a file path")?;
        let cfg = UringConfig {
            queue_depth: QUEUE_DEPTH,
            direct: true,
            ..UringConfig::default()
        };
        let (reader, align, file) = match UringBackend::open(path, cfg) {
            Ok(b) => {
                let a = b.alignment();
                let f = b.file().try_clone().map_err(|e| {
                    format!("cannot duplicate the descriptor of {}: {e}", path.display())
                })?;
                (Reader::Direct(Box::new(b)), a, f)
            }
            Err(IoError::UringUnavailable(_) | IoError::DirectUnsupported { .. }) => {
                let mut p = t
                    .shared
                    .backends
                    .get(Kind::Uring, "cached", 0)
                    .map_err(|e| e.to_string())?;
                p.fallback = true;
                let f =
                    File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
                (Reader::Buffered(p), 1, f)
            }
            Err(e) => return Err(e.to_string()),
        };
        let rb = usize::try_from(t.row_bytes()).map_err(|_| "rows too large".to_string())?;
        let sizing = Sizing::for_budget(budget, rb, align, policy).map_err(|e| e.to_string())?;
        Ok(CachedReader {
            cache: RowCache::new(sizing),
            reader,
            seen: Mutex::new(Stamp::of(&file).ok()),
            file,
        })
    }

    /// Empties the cache if the file changed since the last look (see the
    /// module docs).
    pub(super) fn check_file(&self, t: &Table) -> Result<(), GatherError> {
        let now = Stamp::of(&self.file).map_err(|error| {
            read_error(
                t,
                self.backend_name(),
                IoError::Os {
                    what: "fstat",
                    error,
                },
            )
        })?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if *seen != Some(now) {
            self.cache.clear();
            *seen = Some(now);
        }
        Ok(())
    }

    /// Every distinct row's bytes are gathered into `st` (hits copied out
    /// of the cache, misses read), and only then written to `out`: a failed
    /// read leaves the output untouched.
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
        s.order.clear();
        s.order.extend(rows.iter().copied().zip(0..));
        s.order.sort_unstable();
        let mut groups = Vec::new();
        let mut k = 0;
        while k < s.order.len() {
            let row = s.order[k].0;
            let mut e = k + 1;
            while e < s.order.len() && s.order[e].0 == row {
                e += 1;
            }
            groups.push(Group {
                row,
                start: k,
                end: e,
            });
            k = e;
        }
        t.stage_rows(&mut st.bytes, groups.len(), rows.len(), out)?;
        let mut claims = Claims {
            cache: &self.cache,
            rows: Vec::new(),
            filled: 0,
        };
        let mut misses = Vec::new();
        let mut busy = Vec::new();
        for (u, g) in groups.iter().enumerate() {
            let dst = &mut st.bytes[u * rb..(u + 1) * rb];
            match self.cache.lookup(g.row, |b| copy_row(dst, b))? {
                Found::Hit => stats.cache_hits += 1,
                Found::Claimed => {
                    claims.rows.push(g.row);
                    misses.push(u);
                }
                Found::Busy => busy.push(u),
            }
        }
        self.read_fill(
            t,
            &groups,
            &misses,
            Some(&mut st.bytes),
            &mut claims,
            &mut s.reads,
            stats,
        )?;
        // Rows other gathers were reading: by now they are in, or their
        // reader gave up and the row is ours to read.
        misses.clear();
        for &u in &busy {
            let dst = &mut st.bytes[u * rb..(u + 1) * rb];
            match self
                .cache
                .wait_lookup(groups[u].row, |b| copy_row(dst, b))?
            {
                Found::Hit => stats.cache_hits += 1,
                _ => {
                    claims.rows.push(groups[u].row);
                    misses.push(u);
                }
            }
        }
        self.read_fill(
            t,
            &groups,
            &misses,
            Some(&mut st.bytes),
            &mut claims,
            &mut s.reads,
            stats,
        )?;
        for (u, g) in groups.iter().enumerate() {
            put_all(
                out,
                &s.order[g.start..g.end],
                &st.bytes[u * rb..(u + 1) * rb],
                &t.shared.decoder,
            )?;
        }
        Ok(())
    }

    /// Reads the claimed rows `groups[u]` for `u` in `misses` (ascending)
    /// chunk by chunk into staging, copies each to `dst` (at `u * row
    /// bytes`, when given) and stores it in the cache.
    #[allow(clippy::too_many_arguments)]
    fn read_fill(
        &self,
        t: &Table,
        groups: &[Group],
        misses: &[usize],
        mut dst: Option<&mut Vec<u8>>,
        claims: &mut Claims<'_>,
        reads: &mut RowReads,
        stats: &mut GatherStats,
    ) -> Result<(), GatherError> {
        if misses.is_empty() {
            return Ok(());
        }
        let rb = t.row_bytes() as usize;
        let mut staging = self.cache.staging();
        let buf = staging.bytes();
        let mut extents = Vec::new();
        let mut at_rows = Vec::new();
        let mut ids = Vec::new();
        let mut next = 0;
        while next < misses.len() {
            let chunk = &misses[next..];
            let (n, io) = match &self.reader {
                Reader::Direct(b) => {
                    let n = plan_aligned(
                        t.shared.table.offset(),
                        rb as u64,
                        b.alignment() as u64,
                        chunk.iter().map(|&u| groups[u].row),
                        buf.len(),
                        &mut extents,
                        &mut at_rows,
                    );
                    let io = b
                        .read_into(&extents, buf)
                        .map_err(|e| read_error(t, b_name(b), e))?;
                    (n, io)
                }
                Reader::Buffered(p) => {
                    let n = (buf.len() / rb).min(chunk.len()).max(1);
                    ids.clear();
                    ids.extend(chunk[..n].iter().map(|&u| groups[u].row));
                    ReadPlan::for_rows_into(t.shared.table.offset(), rb, &ids, 0, reads).map_err(
                        |e| GatherError::Setup {
                            backend: "cached",
                            reason: format!("planning reads: {e}"),
                        },
                    )?;
                    let need = reads.plan.staging_len();
                    let io = p
                        .backend
                        .read(&reads.plan, &mut buf[..need])
                        .map_err(|e| read_error(t, p.backend.name(), e))?;
                    at_rows.clear();
                    at_rows.extend_from_slice(&reads.staging_offsets);
                    stats.fallback = true;
                    (n, io)
                }
            };
            count_io(stats, io, self.backend_name());
            for (&u, &at) in chunk[..n].iter().zip(&at_rows) {
                let g = &groups[u];
                let bytes = &buf[at..at + rb];
                if let Some(d) = dst.as_deref_mut() {
                    d[u * rb..(u + 1) * rb].copy_from_slice(bytes);
                }
                stats.cold_rows += (g.end - g.start) as u64;
                stats.cache_misses += 1;
                if self.cache.fill(g.row, bytes) {
                    stats.cache_evictions += 1;
                }
                claims.filled += 1;
            }
            next += n;
        }
        Ok(())
    }

    fn backend_name(&self) -> &'static str {
        match &self.reader {
            Reader::Direct(b) => b_name(b),
            Reader::Buffered(p) => p.backend.name(),
        }
    }

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
        self.check_file(t)?;
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
        let mut claims = Claims {
            cache: &self.cache,
            rows: Vec::new(),
            filled: 0,
        };
        let mut groups = Vec::new();
        let none = |_: &[u8]| Ok::<(), GatherError>(());
        for &r in &want {
            if self.cache.lookup(r, none)? == Found::Claimed {
                claims.rows.push(r);
                groups.push(Group {
                    row: r,
                    start: 0,
                    end: 0,
                });
            }
        }
        let total = groups.len() as u64;
        let mut reads = RowReads::default();
        // Rows whose reads fill about one staging buffer per step.
        let per = (self.cache.sizing().staging_bytes / 4096).max(64);
        let all: Vec<usize> = (0..groups.len()).collect();
        let mut done = 0u64;
        progress(0, total);
        for chunk in all.chunks(per) {
            self.read_fill(t, &groups, chunk, None, &mut claims, &mut reads, stats)?;
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

fn b_name(b: &UringBackend) -> &'static str {
    use crate::io::ReadBackend;
    b.name()
}

fn count_io(stats: &mut GatherStats, io: ReadStats, backend: &'static str) {
    stats.read_requests += io.requests;
    stats.read_bytes += io.bytes;
    stats.backend = Some(backend);
}

fn read_error(t: &Table, backend: &'static str, error: IoError) -> GatherError {
    GatherError::Read {
        backend,
        path: t
            .shared
            .backends
            .path(0)
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        error,
    }
}

/// Plans `O_DIRECT` reads of ascending `rows` (row `r` is `rb` bytes at
/// `base + r * rb`): the `align`-ed blocks covering each row, extents that
/// touch merged, packed back to back in a buffer of `room` bytes. Plans as
/// many rows as fit (at least one when one row's blocks fit); returns how
/// many, with `extents` and each row's position in the buffer (`at`).
fn plan_aligned(
    base: u64,
    rb: u64,
    align: u64,
    rows: impl Iterator<Item = u64>,
    room: usize,
    extents: &mut Vec<Extent>,
    at: &mut Vec<usize>,
) -> usize {
    extents.clear();
    at.clear();
    let mut used = 0usize;
    for row in rows {
        let start = base + row * rb;
        let end = start + rb;
        let (bs, be) = (start / align * align, end.div_ceil(align) * align);
        match extents.last_mut() {
            Some(e) if bs <= e.offset + e.len as u64 => {
                let grow = be.saturating_sub(e.offset + e.len as u64) as usize;
                if used + grow > room {
                    break;
                }
                e.len += grow;
                e.want = (end - e.offset) as usize;
                used += grow;
                at.push(used - e.len + (start - e.offset) as usize);
            }
            _ => {
                let len = (be - bs) as usize;
                if used + len > room {
                    break;
                }
                extents.push(Extent {
                    offset: bs,
                    len,
                    want: (end - bs) as usize,
                });
                at.push(used + (start - bs) as usize);
                used += len;
            }
        }
    }
    at.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_plans_cover_rows_and_merge_touching_blocks() {
        let mut ex = Vec::new();
        let mut at = Vec::new();
        // 90-byte rows from offset 1000, 4096-byte blocks. Rows 0 and 1
        // share block 0; row 44 straddles blocks 0/1 (4960..5050); row 1000
        // is far away.
        let rows = [0u64, 1, 44, 1000];
        let n = plan_aligned(
            1000,
            90,
            4096,
            rows.iter().copied(),
            1 << 20,
            &mut ex,
            &mut at,
        );
        assert_eq!(n, 4);
        assert_eq!(ex.len(), 2);
        assert_eq!((ex[0].offset, ex[0].len), (0, 8192));
        assert_eq!(ex[0].want, 5050);
        let far = 1000 + 1000 * 90;
        assert_eq!(ex[1].offset, far / 4096 * 4096);
        // Each row's bytes sit where `at` says in an image of the blocks.
        let file: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut buf = Vec::new();
        for e in &ex {
            buf.extend_from_slice(&file[e.offset as usize..e.offset as usize + e.len]);
        }
        for (&r, &a) in rows.iter().zip(&at) {
            let s = 1000 + r as usize * 90;
            assert_eq!(&buf[a..a + 90], &file[s..s + 90], "row {r}");
        }
        // A room of one block plans only the rows inside it.
        let n = plan_aligned(1000, 90, 4096, rows.iter().copied(), 4096, &mut ex, &mut at);
        assert_eq!(n, 2);
        assert_eq!(ex.len(), 1);
    }
}
