//! Prewarming: bring the rows a profile says are hot into memory before
//! the first request needs them.
//!
//! A profile is a list of row ids, hottest first ([`rank_by_frequency`]
//! turns a text's row ids into one). [`Table::prewarm`] reads them at the
//! device's full queue depth: into the handle's row cache for the `cached`
//! strategy (as many as the budget holds), or into the page cache for every
//! other strategy (as many rows as `budget` bytes of pages hold), where
//! `auto` also learns them as resident.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::direct::{read_error, Kind};
use super::{GatherError, GatherStats, Strategy, Table};
use crate::error::Error;
use crate::output::{Dtype, Out};
use crate::io::Read;

/// Staging for page-cache warming reads, per chunk.
const PAGE_CHUNK: usize = 4 << 20;

/// What a prewarm did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmReport {
    /// Where the rows went: `row cache` or `page cache`.
    pub target: &'static str,
    /// Rows of the profile taken as the warm set (read now or warm
    /// already).
    pub rows: u64,
    /// Of those, rows read by this call.
    pub rows_read: u64,
    /// Distinct pages the warm set covers (page cache only).
    pub pages: Option<u64>,
    /// Read requests issued.
    pub read_requests: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// How long it took.
    pub elapsed: Duration,
    /// The warm set: row ids in profile order.
    pub set: Vec<u64>,
}

/// Row ids ranked by how often `ids` holds them, most frequent first (ties
/// by first appearance): the hot set of a profile text.
pub fn rank_by_frequency(ids: &[u64]) -> Vec<u64> {
    let mut count: HashMap<u64, (u64, usize)> = HashMap::with_capacity(ids.len() / 2);
    for (pos, &r) in ids.iter().enumerate() {
        count.entry(r).or_insert((0, pos)).0 += 1;
    }
    let mut ranked: Vec<(u64, (u64, usize))> = count.into_iter().collect();
    ranked.sort_unstable_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.1 .1.cmp(&b.1 .1)));
    ranked.into_iter().map(|(r, _)| r).collect()
}

impl Table {
    /// Reads the hottest rows of `ranked` (hottest first, e.g. from
    /// [`rank_by_frequency`]) ahead of use. With the table's strategy
    /// [`Strategy::Cached`], into this handle's row cache, as many as its
    /// budget holds (`budget` is ignored). Otherwise into the page cache:
    /// rows in rank order while the distinct pages of their parts (in
    /// whichever files hold them) fit in `budget` bytes,
    /// read with buffered io_uring (every read in flight at queue depth 64),
    /// and marked resident for `auto`. `progress(done, total)` reports rows
    /// read. Ids are checked first.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn prewarm(
        &self,
        ranked: &[u64],
        budget: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<WarmReport, Error> {
        self.prewarm_inner(ranked, budget, progress)
            .map_err(|e| self.locate(e))
    }

    fn prewarm_inner(
        &self,
        ranked: &[u64],
        budget: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<WarmReport, GatherError> {
        self.shared.table.check_rows(ranked)?;
        let t0 = Instant::now();
        let mut stats = GatherStats::default();
        if self.strategy == Strategy::Cached {
            let cr = self.cached_reader()?;
            let (read, set) = cr.prewarm(self, ranked, progress, &mut stats)?;
            return Ok(WarmReport {
                target: "row cache",
                rows: set.len() as u64,
                rows_read: read,
                pages: None,
                read_requests: stats.read_requests,
                read_bytes: stats.read_bytes,
                elapsed: t0.elapsed(),
                set,
            });
        }
        if self.strategy == Strategy::Shared && !crate::sys::NOOP {
            return self.prewarm_shared(ranked, progress, t0);
        }
        self.prewarm_pages(ranked, budget, progress, t0)
    }

    /// The first distinct rows of `ranked` that the machine-wide cache
    /// holds, gathered through it in chunks (rows already there are hits,
    /// the others are read once and inserted).
    fn prewarm_shared(
        &self,
        ranked: &[u64],
        progress: &mut dyn FnMut(u64, u64),
        t0: Instant,
    ) -> Result<WarmReport, GatherError> {
        let capacity = self.shared_segment()?.slots();
        let mut seen = HashSet::new();
        let set: Vec<u64> = ranked
            .iter()
            .copied()
            .filter(|&r| seen.insert(r))
            .take(capacity)
            .collect();
        let rb = self.shared.table.row_bytes() as usize;
        let chunk = (4usize << 20).div_ceil(rb.max(1)).max(1);
        let mut buf = vec![0u8; chunk.min(set.len().max(1)) * rb];
        let (mut read, mut requests, mut bytes, mut done) = (0, 0, 0, 0u64);
        progress(0, set.len() as u64);
        for rows in set.chunks(chunk) {
            let out = Out::bytes(Dtype::Raw, &self.shared.table, &mut buf[..rows.len() * rb])
                .ok_or_else(|| GatherError::Setup {
                    backend: "shared",
                    reason: "no raw output for this table".into(),
                })?;
            let st = self.gather_inner(Strategy::Shared, rows, out)?;
            read += st.cache_misses;
            requests += st.read_requests;
            bytes += st.read_bytes;
            done += rows.len() as u64;
            progress(done, set.len() as u64);
        }
        Ok(WarmReport {
            target: "shared row cache",
            rows: set.len() as u64,
            rows_read: read,
            pages: None,
            read_requests: requests,
            read_bytes: bytes,
            elapsed: t0.elapsed(),
            set,
        })
    }

    fn prewarm_pages(
        &self,
        ranked: &[u64],
        budget: u64,
        progress: &mut dyn FnMut(u64, u64),
        t0: Instant,
    ) -> Result<WarmReport, GatherError> {
        let t = &self.shared.table;
        let page = self
            .mapping()
            .map_or_else(crate::sys::page_size, |m| m.page_size());
        let max_pages = budget / page;
        // The pages of every part of each row: (file, page).
        let mut pages: HashSet<(usize, u64)> = HashSet::new();
        let mut set = Vec::new();
        let mut seen = HashSet::new();
        let mut new = Vec::new();
        for &r in ranked {
            if !seen.insert(r) {
                continue;
            }
            new.clear();
            for e in t.extents(r)?.as_slice() {
                let (p0, p1) = (e.offset / page, (e.offset + e.len - 1) / page);
                new.extend((p0..=p1).map(|p| (e.file, p)));
            }
            new.sort_unstable();
            new.dedup();
            new.retain(|k| !pages.contains(k));
            if pages.len() as u64 + new.len() as u64 > max_pages {
                break;
            }
            pages.extend(new.iter().copied());
            set.push(r);
        }
        let mut sorted: Vec<(usize, u64)> = pages.into_iter().collect();
        sorted.sort_unstable();
        let mut staging = vec![0u8; PAGE_CHUNK];
        let per = (PAGE_CHUNK as u64 / page).max(1) as usize;
        let total = set.len() as u64;
        let mut stats = GatherStats::default();
        progress(0, total);
        let mut done_pages = 0usize;
        // Every file's pages through one buffered io_uring reader, a chunk
        // at a time.
        let picked = self.shared.backends.get(Kind::Uring, "prewarm")?;
        let reader = &picked.reader;
        let mut reads: Vec<Read> = Vec::new();
        let mut file_len = (usize::MAX, None);
        for chunk in sorted.chunks(per) {
            // Adjacent pages merge into one read; a file's last page is
            // read as far as the file goes.
            reads.clear();
            let mut dst = 0usize;
            for &(file, p) in chunk {
                if file_len.0 != file {
                    file_len = (file, self.mapping_of(file).map(|m| m.len() as u64));
                }
                let k = self
                    .shared
                    .backends
                    .slot(file)
                    .ok_or(GatherError::NoFile {
                        strategy: "prewarm",
                    })?;
                let off = p * page;
                let len = file_len.1.map_or(page, |l| l.saturating_sub(off).min(page)) as usize;
                match reads.last_mut() {
                    Some(r) if r.file == k && r.offset + r.len as u64 == off => {
                        r.len += len;
                        r.need += len;
                    }
                    _ => reads.push(Read::new(k, off, len, dst)),
                }
                dst += len;
            }
            let io = reader
                .read(&reads, &mut staging[..dst])
                .map_err(|e| read_error(reader, e))?;
            stats.read_requests += io.requests;
            stats.read_bytes += io.bytes;
            done_pages += chunk.len();
            // Rows are reported in proportion to the pages read.
            progress(
                (total as u128 * done_pages as u128 / sorted.len().max(1) as u128) as u64,
                total,
            );
        }
        let res = self.residency();
        for &r in &set {
            res.mark(r);
        }
        progress(total, total);
        Ok(WarmReport {
            target: "page cache",
            rows: total,
            rows_read: total,
            pages: Some(sorted.len() as u64),
            read_requests: stats.read_requests,
            read_bytes: stats.read_bytes,
            elapsed: t0.elapsed(),
            set,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranking_is_by_count_then_first_seen() {
        let ids = [5, 3, 5, 9, 3, 5, 7, 9, 1];
        assert_eq!(rank_by_frequency(&ids), vec![5, 3, 9, 7, 1]);
        assert!(rank_by_frequency(&[]).is_empty());
    }
}
