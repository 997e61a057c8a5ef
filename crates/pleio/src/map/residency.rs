//! Which pages of a mapped file are in the page cache, asked in a way that
//! tells this process the truth.
//!
//! `mincore` answers for a file mapping only to the file's owner and to a
//! process that may write the file: since Linux 5.0 it reports every page
//! resident to anyone else (the usual container case: an unprivileged
//! server reading a root-owned model). `cachestat(2)` (Linux 6.5+) is exact
//! and takes one call per range, but since 6.14 it refuses the same callers
//! (`EPERM`). What works for any reader is a read that only succeeds from
//! the cache, `preadv2(RWF_NOWAIT)`: data back means cached, `EAGAIN` means
//! not, one call per page. Its catch: for a missing page the kernel starts
//! reading it before it answers. So a [`ResidencyMethod::ReadProbe`] that
//! only wants to *know* waits for those reads and drops the pages again
//! (`posix_fadvise(DONTNEED)`), leaving the cache as it found it, and
//! probes large ranges by sampling; `auto`, which is about to read the
//! missing rows anyway, keeps them.
//!
//! The method is chosen once per mapping ([`Mapping::residency_method`]):
//! `cachestat` if the kernel admits the call, else `mincore` if the kernel
//! shows it this file (owner, root, or may write), else read probes.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{ceil_to, floor_to, Mapping};
use crate::sys;

/// How a [`Mapping`] learns which pages of its file are in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResidencyMethod {
    /// `cachestat(2)`: exact page counts, one call per range.
    Cachestat,
    /// `mincore(2)` over the mapping: one flag per page, one call per
    /// range; true only for the owner or a process that may write the file.
    Mincore,
    /// `preadv2(RWF_NOWAIT)` of one byte per page: true for any reader, one
    /// call per page; pages it makes the kernel read are dropped again, and
    /// large ranges are sampled.
    ReadProbe,
    /// This build or OS cannot tell (the no-op OS layer, a file system
    /// without `RWF_NOWAIT`).
    Unavailable,
}

impl ResidencyMethod {
    /// Short name (`cachestat`, `mincore`, `read-probe`, `unavailable`).
    pub fn name(self) -> &'static str {
        match self {
            ResidencyMethod::Cachestat => "cachestat",
            ResidencyMethod::Mincore => "mincore",
            ResidencyMethod::ReadProbe => "read-probe",
            ResidencyMethod::Unavailable => "unavailable",
        }
    }
}

impl std::fmt::Display for ResidencyMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a residency query found for a range of pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResidentPages {
    /// Pages the range touches (retained parts only).
    pub pages: u64,
    /// Pages whose residency was asked: all of them, or a sample.
    pub probed: u64,
    /// Of the pages asked, those in the page cache.
    pub resident: u64,
}

impl ResidentPages {
    /// True if every page was asked (no sampling).
    pub fn is_exact(&self) -> bool {
        self.probed == self.pages
    }

    /// Resident pages, or their estimate from the sample (rounded).
    pub fn estimate(&self) -> u64 {
        if self.probed == 0 {
            return 0;
        }
        let e = u128::from(self.resident) * u128::from(self.pages) + u128::from(self.probed / 2);
        (e / u128::from(self.probed)) as u64
    }
}

/// Pages a cache-only read found missing: the kernel started reading them.
struct Pulled(Vec<u64>);

impl Mapping {
    /// How this mapping learns page-cache residency (decided on first use).
    pub fn residency_method(&self) -> ResidencyMethod {
        *self.residency.get_or_init(|| match &self.file {
            _ if sys::NOOP => ResidencyMethod::Unavailable,
            // No descriptor kept (dup refused): mincore, as before.
            None => ResidencyMethod::Mincore,
            Some(f) => match sys::cachestat(f, 0..self.page) {
                Ok(_) => ResidencyMethod::Cachestat,
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => ResidencyMethod::ReadProbe,
                Err(_) if sys::residency_visible(f) => ResidencyMethod::Mincore,
                Err(_) => ResidencyMethod::ReadProbe,
            },
        })
    }

    /// Page-aligned file byte ranges of `range` (page-rounded outward)
    /// that lie in retained fragments.
    fn retained_pages(&self, range: &Range<u64>) -> impl Iterator<Item = Range<u64>> + '_ {
        let pages = floor_to(range.start, self.page)..ceil_to(range.end, self.page);
        self.retained.iter().filter_map(move |f| {
            let s = pages.start.max(f.start);
            let e = pages.end.min(ceil_to(f.end, self.page));
            (s < e).then_some(s..e)
        })
    }

    /// How many pages of `range` (page-rounded outward, retained parts only)
    /// are in the page cache right now, exactly, if the OS can tell (see
    /// [`Mapping::residency_method`]). With read probes this costs a call
    /// per page, and a device read per missing page (dropped again): use
    /// [`Mapping::sample_resident`] for large ranges.
    pub fn resident_pages(&self, range: Range<u64>) -> Option<u64> {
        self.sample_resident(range, u64::MAX).map(|r| r.resident)
    }

    /// Residency of `range` (page-rounded outward, retained parts only),
    /// asking at most `max_probes` pages when the method probes page by
    /// page (spread over the range, at random within equal strata); exact
    /// otherwise. Leaves the page cache as it found it.
    pub fn sample_resident(&self, range: Range<u64>, max_probes: u64) -> Option<ResidentPages> {
        let runs: Vec<Range<u64>> = self.retained_pages(&range).collect();
        let pages: u64 = runs.iter().map(|r| (r.end - r.start) / self.page).sum();
        let mut out = ResidentPages {
            pages,
            ..ResidentPages::default()
        };
        match self.residency_method() {
            ResidencyMethod::Unavailable => return None,
            ResidencyMethod::Cachestat => {
                let f = self.file.as_ref()?;
                for r in runs {
                    out.resident += sys::cachestat(f, r).ok()?;
                }
                out.probed = pages;
            }
            ResidencyMethod::Mincore => {
                out.resident = self.mincore_count(&runs)?;
                out.probed = pages;
            }
            ResidencyMethod::ReadProbe => {
                let own = self.file.as_ref()?;
                let probe = sys::probe_handle(own);
                let f = probe.as_ref().unwrap_or(own);
                let picks = pick_pages(&runs, self.page, pages, max_probes);
                let mut pulled = Pulled(Vec::new());
                let asked: Option<u64> = picks
                    .iter()
                    .map(|&p| self.probe_page(f, p, &mut pulled, true).map(u64::from))
                    .sum();
                self.drop_pulled(f, pulled);
                out.resident = asked?;
                out.probed = picks.len() as u64;
            }
        }
        Some(out)
    }

    /// True if every page of `range` (a few pages, e.g. one row's) is in
    /// the page cache, if the OS can tell. With read probes a missing page
    /// is left to load (the caller is about to read it): one call per page
    /// and no waiting.
    pub fn all_resident(&self, range: Range<u64>) -> Option<bool> {
        let runs: Vec<Range<u64>> = self.retained_pages(&range).collect();
        let pages: u64 = runs.iter().map(|r| (r.end - r.start) / self.page).sum();
        match self.residency_method() {
            ResidencyMethod::Unavailable => None,
            ResidencyMethod::Cachestat => {
                let f = self.file.as_ref()?;
                let mut n = 0;
                for r in runs {
                    n += sys::cachestat(f, r).ok()?;
                }
                Some(n == pages)
            }
            ResidencyMethod::Mincore => Some(self.mincore_count(&runs)? == pages),
            ResidencyMethod::ReadProbe => {
                let f = self.file.as_ref()?;
                let mut pulled = Pulled(Vec::new());
                let mut all = true;
                for r in runs {
                    for p in (r.start / self.page)..(r.end / self.page) {
                        all &= self.probe_page(f, p, &mut pulled, false)?;
                    }
                }
                Some(all)
            }
        }
    }

    /// One flag per page of the whole file (`None`: not asked), into
    /// `flags`: every page for `mincore` and `cachestat`, at most
    /// `max_probes` for read probes. Leaves the page cache as it found it.
    /// `None` if the OS cannot tell.
    pub fn page_flags(&self, max_probes: u64, flags: &mut Vec<Option<bool>>) -> Option<()> {
        let n = (self.len as u64).div_ceil(self.page) as usize;
        flags.clear();
        flags.resize(n, None);
        let whole = 0..self.len as u64;
        let runs: Vec<Range<u64>> = self.retained_pages(&whole).collect();
        let visible = self.file.as_ref().is_none_or(sys::residency_visible);
        match self.residency_method() {
            ResidencyMethod::Unavailable => return None,
            ResidencyMethod::Mincore | ResidencyMethod::Cachestat if visible => {
                let mut buf = Vec::new();
                for r in runs {
                    let run = self.mem_run(r.start..r.end.min(self.len as u64));
                    sys::resident_pages(run, self.page, &mut buf)?;
                    let first = (r.start / self.page) as usize;
                    for (k, b) in buf.iter().enumerate() {
                        flags[first + k] = Some(b & 1 != 0);
                    }
                }
            }
            ResidencyMethod::Mincore => return None,
            ResidencyMethod::Cachestat => {
                // Admitted to cachestat but not shown mincore (a kernel
                // before the cachestat restriction): page by page.
                let f = self.file.as_ref()?;
                for r in runs {
                    for p in (r.start / self.page)..(r.end / self.page) {
                        let at = p * self.page;
                        flags[p as usize] = Some(sys::cachestat(f, at..at + 1).ok()? > 0);
                    }
                }
            }
            ResidencyMethod::ReadProbe => {
                let own = self.file.as_ref()?;
                let probe = sys::probe_handle(own);
                let f = probe.as_ref().unwrap_or(own);
                let pages: u64 = runs.iter().map(|r| (r.end - r.start) / self.page).sum();
                let mut pulled = Pulled(Vec::new());
                let mut refused = false;
                for p in pick_pages(&runs, self.page, pages, max_probes) {
                    flags[p as usize] = self.probe_page(f, p, &mut pulled, true);
                    refused |= flags[p as usize].is_none();
                }
                self.drop_pulled(f, pulled);
                if refused {
                    return None;
                }
            }
        }
        Some(())
    }

    /// `mincore` page count over page-aligned retained `runs`.
    fn mincore_count(&self, runs: &[Range<u64>]) -> Option<u64> {
        let mut buf = Vec::new();
        let mut total = 0;
        for r in runs {
            let run = self.mem_run(r.start..r.end.min(self.len as u64));
            total += sys::resident_pages(run, self.page, &mut buf)?;
        }
        Some(total)
    }

    /// Asks whether page `p` of the file is cached with a one-byte
    /// cache-only read; a missing page (whose read the kernel starts) goes
    /// to `pulled`. `None` if the OS refuses the call. A `scan` asks with
    /// [`sys::peek_cached`], so that a page whose read finished before the
    /// kernel answered leaves again (on a loaded machine, dozens of the 64
    /// a scan asks did, and stayed); a row about to be read asks with
    /// [`sys::read_cached`] and keeps it.
    fn probe_page(&self, f: &File, p: u64, pulled: &mut Pulled, scan: bool) -> Option<bool> {
        let mut byte = [0u8; 1];
        let read = if scan {
            sys::peek_cached
        } else {
            sys::read_cached
        };
        match read(f, p * self.page, &mut byte) {
            Ok(n) => Some(n == 1),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                pulled.0.push(p);
                Some(false)
            }
            Err(_) => None,
        }
    }

    /// Puts the cache back as it was before read probes: waits for the
    /// reads they started (a plain one-byte read of each page, served by
    /// the read in flight) and drops those pages again. Exact only when the
    /// probes went through a [`sys::probe_handle`], which reads no
    /// neighbours.
    fn drop_pulled(&self, f: &File, pulled: Pulled) {
        let mut byte = [0u8; 1];
        for &p in &pulled.0 {
            let _ = f.read_at(&mut byte, p * self.page);
        }
        for &p in &pulled.0 {
            let _ = sys::evict(f, p * self.page..(p + 1) * self.page);
        }
    }
}

/// At most `max` page indices out of `pages` pages of page-aligned `runs`:
/// every page when `max >= pages`, else one at random in each of `max`
/// equal strata (so repeated samples ask different pages).
fn pick_pages(runs: &[Range<u64>], page: u64, pages: u64, max: u64) -> Vec<u64> {
    let index = |mut k: u64| -> u64 {
        for r in runs {
            let n = (r.end - r.start) / page;
            if k < n {
                return r.start / page + k;
            }
            k -= n;
        }
        unreachable!("k < pages")
    };
    if max >= pages {
        return (0..pages).map(index).collect();
    }
    static SEED: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let mut x = SEED.fetch_add(0x6a09_e667_f3bc_c909, Ordering::Relaxed)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let mut next = move || {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..max)
        .map(|i| {
            let a = (u128::from(i) * u128::from(pages) / u128::from(max)) as u64;
            let b = (u128::from(i + 1) * u128::from(pages) / u128::from(max)) as u64;
            index(a + next() % (b - a).max(1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_cover_strata_in_order() {
        let page = 4096;
        let runs = [0..10 * page, 20 * page..30 * page];
        assert_eq!(pick_pages(&runs, page, 20, 100).len(), 20);
        assert_eq!(
            pick_pages(&runs, page, 20, 20),
            (0..10).chain(20..30).collect::<Vec<u64>>()
        );
        let picks = pick_pages(&runs, page, 20, 4);
        assert_eq!(picks.len(), 4);
        // One per stratum of five pages.
        let strata = [0..5, 5..10, 20..25, 25..30];
        for (p, s) in picks.iter().zip(strata) {
            assert!(s.contains(p), "{p} not in {s:?}");
        }
    }

    #[test]
    fn estimates_scale_the_sample() {
        let r = ResidentPages {
            pages: 1000,
            probed: 10,
            resident: 3,
        };
        assert_eq!((r.estimate(), r.is_exact()), (300, false));
        let e = ResidentPages {
            pages: 7,
            probed: 7,
            resident: 7,
        };
        assert_eq!((e.estimate(), e.is_exact()), (7, true));
        assert_eq!(ResidentPages::default().estimate(), 0);
    }
}
