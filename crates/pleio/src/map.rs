//! Read-only shared mappings of model files, with lazy ranges and retained
//! fragments.
//!
//! A [`Mapping`] maps a whole file. Byte ranges of lazy tensors (tables
//! read a few random rows at a time) are registered as *lazy*: their pages
//! get `MADV_RANDOM`, so a fault reads one page instead of a readahead
//! window, and they are left out of [`Mapping::eager_ranges`]. Parts of the
//! file can be unmapped ([`Mapping::unmap_fragment`]) once an engine copied
//! them elsewhere; the mapping tracks the fragments still mapped and never
//! hands out, advises or reads bytes outside them.
//!
//! # Safety contract
//!
//! A mapping views the file's pages in place: the bytes it hands out change
//! if another process writes the file, and touching a page past the file's
//! end after someone shrinks it raises `SIGBUS`. pleio does not make
//! [`Mapping::map`] `unsafe` (as memmap2 does) because the hazard is the
//! file's owner's, not the caller's, and is handled where the bytes are
//! read: the direct strategies never touch the mapping, and the mapped
//! ones read rows only with [`Mapping::copy_rows`], under the `SIGBUS`
//! guard of [`crate::sys`] (or with `pread` when a host's handler displaced
//! it); see docs/reliability.md. Slices from [`Mapping::bytes`] are not
//! guarded. Unmapping needs `&mut self`, so no slice outlives its pages.
//!
//! This module may use `unsafe` (raw views of mapped bytes); the system
//! calls themselves live in [`crate::sys`].

use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::RwLock;

use crate::sys::{self, AdviceOutcome, Advisor, MemRun};

mod residency;

pub use residency::{ResidencyMethod, ResidentPages};

/// Errors registering or unmapping ranges of a [`Mapping`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    /// The range does not lie inside the mapped file.
    #[error("byte range {start}..{end} is outside the mapped file of {len} bytes")]
    OutsideFile {
        /// Range start.
        start: u64,
        /// Range end (exclusive).
        end: u64,
        /// File length at map time.
        len: u64,
    },
    /// The OS refused the call.
    #[error("unmapping bytes {start}..{end}: {error}")]
    Io {
        /// Range start.
        start: u64,
        /// Range end (exclusive).
        end: u64,
        /// The OS error.
        error: io::Error,
    },
}

/// Errors copying rows out of a [`Mapping`] ([`Mapping::copy_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// The rows' bytes do not all lie inside one retained fragment of the
    /// mapped file (past the file's end at map time, or unmapped).
    #[error("bytes {start}..{end} are not inside one mapped fragment of the file")]
    NotMapped {
        /// Start of the rows' byte range.
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// The destination cannot hold the rows.
    #[error("destination holds {got} bytes but the rows need {need}")]
    Destination {
        /// Bytes needed.
        need: u64,
        /// Bytes given.
        got: usize,
    },
    /// Reading the mapping raised `SIGBUS` (caught; see
    /// [`crate::sys::SIGBUS_PROTECTED`]), or reading the file instead (the
    /// guard displaced) came short or failed: the file no longer holds the
    /// byte (it shrank, or was truncated and rewritten in place) or the
    /// device failed to read it.
    #[error("reading the mapped file at offset {offset} failed: {}", fault_cause(*offset, *file_len))]
    Fault {
        /// Index (in the rows given) of the row that could not be read.
        index: usize,
        /// File offset of the byte that could not be read.
        offset: u64,
        /// The file's length right after the fault, if it could be read.
        file_len: Option<u64>,
    },
}

/// Why a mapped read of `offset` faults, given the file's length now.
fn fault_cause(offset: u64, file_len: Option<u64>) -> String {
    match file_len {
        Some(len) if len <= offset => {
            format!("the file is now {len} bytes long: it shrank under the mapping")
        }
        Some(len) => format!(
            "the file is {len} bytes long, so the device or file system failed to read it \
             (or the file shrank and grew back)"
        ),
        None => "the file shrank under the mapping or could not be read".to_owned(),
    }
}

/// A whole file mapped read-only and shared.
///
/// Reading faults pages in from the page cache. If the file is truncated by
/// someone else while mapped, reads past the new end raise `SIGBUS`: pleio
/// checks every range against the length seen at map time, never writes
/// through the mapping, and reads rows only with [`Mapping::copy_rows`],
/// which turns that signal into an error (see
/// [`crate::sys::SIGBUS_PROTECTED`]). Slices from [`Mapping::bytes`] are
/// not protected.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    page: u64,
    /// The mapped file (a duplicate descriptor): its length after a fault,
    /// and page-cache residency queries.
    file: Option<File>,
    /// How residency is learned, decided on first use.
    residency: std::sync::OnceLock<ResidencyMethod>,
    /// File byte ranges still mapped: sorted, disjoint, non-empty. Starts are
    /// page-aligned; ends are page-aligned or the file length.
    retained: Vec<Range<u64>>,
    /// Lazy byte ranges: sorted, disjoint, non-adjacent, non-empty.
    lazy: RwLock<Vec<Range<u64>>>,
}

// SAFETY: the mapping is read-only; unmapping needs `&mut self`, so no
// `&[u8]` handed out can outlive the pages it views. Sharing views across
// threads is as safe as sharing any immutable slice.
unsafe impl Send for Mapping {}
// SAFETY: as above; the only interior mutability (the lazy list) is behind
// a lock.
unsafe impl Sync for Mapping {}

/// Cache lines of a row [`Mapping::prefetch`] asks for: a qwen4exp row
/// (90-200 bytes) whole; the hardware prefetcher follows longer rows.
pub(crate) const PREFETCH_LINES: u32 = 4;

fn floor_to(x: u64, page: u64) -> u64 {
    x - x % page
}

fn ceil_to(x: u64, page: u64) -> u64 {
    x.div_ceil(page).saturating_mul(page)
}

impl Mapping {
    /// Maps all of `file` read-only, nothing lazy. An empty file gives an
    /// empty mapping.
    pub fn map(file: &File) -> io::Result<Mapping> {
        let len = file.metadata()?.len();
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large to map"))?;
        let page = sys::page_size();
        if len == 0 {
            return Ok(Mapping {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
                page,
                file: file.try_clone().ok(),
                residency: std::sync::OnceLock::new(),
                retained: Vec::new(),
                lazy: RwLock::new(Vec::new()),
            });
        }
        let ptr = sys::map_shared_read_only(file, len)?;
        Ok(Mapping {
            ptr,
            len,
            page,
            file: file.try_clone().ok(),
            residency: std::sync::OnceLock::new(),
            retained: std::iter::once(0..len as u64).collect(),
            lazy: RwLock::new(Vec::new()),
        })
    }

    /// Maps all of `file` and registers `lazy` ranges at once (see
    /// [`Mapping::register_lazy`]).
    pub fn map_with_lazy(
        file: &File,
        lazy: &[Range<u64>],
        advisor: &dyn Advisor,
    ) -> Result<Mapping, MapError> {
        let m = Mapping::map(file).map_err(|source| MapError::Io {
            start: 0,
            end: 0,
            error: source,
        })?;
        for r in lazy {
            m.register_lazy(r.clone(), advisor)?;
        }
        Ok(m)
    }

    /// Registers `range` (file bytes) as lazy: its pages get `MADV_RANDOM`
    /// and it is excluded from [`Mapping::eager_ranges`]. Overlapping or
    /// adjacent lazy ranges merge. Registering again is harmless. A refused
    /// `MADV_RANDOM` is not an error (it only costs readahead).
    pub fn register_lazy(&self, range: Range<u64>, advisor: &dyn Advisor) -> Result<(), MapError> {
        self.check_in_file(&range)?;
        if range.is_empty() {
            return Ok(());
        }
        {
            let mut lazy = self.lazy.write().unwrap_or_else(|e| e.into_inner());
            if lazy
                .iter()
                .any(|l| l.start <= range.start && range.end <= l.end)
            {
                return Ok(());
            }
            lazy.push(range.clone());
            lazy.sort_by_key(|r| r.start);
            let mut merged: Vec<Range<u64>> = Vec::with_capacity(lazy.len());
            for r in lazy.drain(..) {
                match merged.last_mut() {
                    Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                    _ => merged.push(r),
                }
            }
            *lazy = merged;
        }
        let pages = floor_to(range.start, self.page)..ceil_to(range.end, self.page);
        for f in &self.retained {
            let s = pages.start.max(f.start);
            let e = pages.end.min(f.end);
            if s < e {
                advisor.random(self.mem_run(s..e));
            }
        }
        Ok(())
    }

    /// The lazy ranges, sorted.
    pub fn lazy_ranges(&self) -> Vec<Range<u64>> {
        self.lazy.read().map(|l| l.clone()).unwrap_or_default()
    }

    /// The lazy range wholly containing the non-empty `len` bytes at
    /// `offset`, if any.
    pub fn lazy_range_containing(&self, offset: u64, len: u64) -> Option<Range<u64>> {
        let end = offset.checked_add(len).filter(|_| len > 0)?;
        let lazy = self.lazy.read().ok()?;
        lazy.iter()
            .find(|l| l.start <= offset && end <= l.end)
            .cloned()
    }

    /// True if the non-empty `len` bytes at `offset` lie wholly inside one
    /// lazy range and one retained fragment.
    pub fn contains_lazy(&self, offset: u64, len: u64) -> bool {
        self.lazy_range_containing(offset, len).is_some()
            && self.fragment_containing(offset, len).is_some()
    }

    /// The fragments still mapped (file byte ranges), sorted and disjoint.
    pub fn retained(&self) -> &[Range<u64>] {
        &self.retained
    }

    /// The retained fragment wholly containing `len` bytes at `offset`.
    fn fragment_containing(&self, offset: u64, len: u64) -> Option<&Range<u64>> {
        let end = offset.checked_add(len)?;
        let i = self.retained.partition_point(|f| f.end <= offset);
        self.retained
            .get(i)
            .filter(|f| f.start <= offset && end <= f.end)
    }

    /// Unmaps the file bytes `first..last`, rounded inward to whole pages
    /// (`last` at or past the file end reaches the end of the mapping, its
    /// partial last page included). Only still-retained parts are unmapped.
    /// Returns the byte range unmapped, `None` if rounding left nothing.
    ///
    /// Takes `&mut self`, so no borrowed bytes can outlive the pages.
    pub fn unmap_fragment(
        &mut self,
        first: u64,
        last: u64,
    ) -> Result<Option<Range<u64>>, MapError> {
        let len = self.len as u64;
        if first > last || first > len {
            return Err(MapError::OutsideFile {
                start: first,
                end: last,
                len,
            });
        }
        let start = ceil_to(first, self.page);
        let end = if last >= len {
            len
        } else {
            floor_to(last, self.page)
        };
        if start >= end {
            return Ok(None);
        }
        let mut kept = Vec::with_capacity(self.retained.len() + 1);
        for f in std::mem::take(&mut self.retained) {
            let s = start.max(f.start);
            let e = end.min(f.end);
            if s >= e {
                kept.push(f);
                continue;
            }
            let run = self.mem_run(s..e);
            // SAFETY: `run` is a page-aligned part of a fragment this value
            // mapped and still owns; `&mut self` guarantees no slice of it
            // is borrowed. munmap rounds the length up to the page, which
            // past the file end is still our mapping's last page.
            if let Err(source) = unsafe { sys::unmap(run) } {
                kept.push(f);
                self.retained = kept;
                return Err(MapError::Io {
                    start: s,
                    end: e,
                    error: source,
                });
            }
            if f.start < s {
                kept.push(f.start..s);
            }
            if e < f.end {
                kept.push(e..f.end);
            }
        }
        self.retained = kept;
        Ok(Some(start..end))
    }

    /// The `len` bytes at file offset `offset`, if they lie inside the file
    /// and inside one retained fragment. `len == 0` gives an empty slice for
    /// any offset up to the file length.
    pub fn bytes(&self, offset: u64, len: u64) -> Option<&[u8]> {
        if len == 0 {
            return (offset <= self.len as u64).then_some(&[][..]);
        }
        self.fragment_containing(offset, len)?;
        // SAFETY: the range lies inside a retained fragment, which is mapped
        // readable for as long as `self` is borrowed (unmapping needs `&mut`),
        // and nothing writes through the mapping.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(offset as usize), len as usize) })
    }

    /// Copies rows out of the mapping: `row_bytes` bytes from file offset
    /// `offset + rows[i] * row_bytes` to `dst[i * row_bytes..]`, for every
    /// `i`. Every row must lie inside one retained fragment, checked first.
    ///
    /// The one way pleio reads row bytes through a mapping: a file that
    /// shrank under it (or a device error) is [`CopyError::Fault`], not
    /// `SIGBUS`, where [`crate::sys::SIGBUS_PROTECTED`]. When a host's
    /// `SIGBUS` handler displaced pleio's, the rows are read from the file
    /// with `pread` instead, with the same result. On `Err`, `dst` holds the
    /// rows before the failing one and unspecified bytes after. Checks the
    /// guard on every call (a `sigaction` query); the engine's gathers
    /// check it once per gather.
    pub fn copy_rows(
        &self,
        offset: u64,
        row_bytes: u64,
        rows: &[u64],
        dst: &mut [u8],
    ) -> Result<(), CopyError> {
        self.copy_rows_in(&sys::guard::Scope::new(), offset, row_bytes, rows, dst)
    }

    /// Asks the CPU to start loading the first cache lines of `len` bytes at
    /// file offset `offset` (at most [`PREFETCH_LINES`] lines): a software
    /// prefetch, which never faults, blocks or reads outside the mapping, so
    /// a batch's rows can be requested from memory together before they are
    /// copied one after another. Ranges not wholly inside the mapping, and
    /// CPUs without the instruction, are ignored.
    #[inline]
    pub(crate) fn prefetch(&self, offset: u64, len: u64) {
        if offset.checked_add(len).is_some_and(|e| e <= self.len as u64) {
            sys::prefetch_lines(
                self.ptr.wrapping_add(offset as usize),
                len as usize,
                PREFETCH_LINES as usize,
            );
        }
    }

    /// Copies `len` bytes at each `(mapping, file offset)` of `parts` into
    /// `dst`, one after another, with one guarded copy for all of them
    /// (where [`Mapping::copy_rows_in`] takes one call per mapping and row
    /// size): the parts of a checkpoint batch, spread over shard tensors
    /// and files. `addrs` is scratch.
    ///
    /// Returns false, with `dst` unspecified, if it cannot: a part is
    /// `None` or not inside a retained fragment of its mapping, `dst` is
    /// too short, this thread's reads are not guarded, or a read faulted.
    /// The caller then copies part by part, which names the failing part
    /// or reads it with `pread`.
    pub(crate) fn copy_parts_in<'m>(
        scope: &sys::guard::Scope,
        parts: impl Iterator<Item = Option<(&'m Mapping, u64)>>,
        len: u64,
        addrs: &mut Vec<u64>,
        dst: &mut [u8],
    ) -> bool {
        if !scope.use_mapping() {
            return false;
        }
        addrs.clear();
        for part in parts {
            let Some((m, offset)) = part else {
                return false;
            };
            if m.fragment_containing(offset, len).is_none() {
                return false;
            }
            // Inside the mapping: the address cannot overflow.
            addrs.push(m.ptr as u64 + offset);
        }
        let Ok(len) = usize::try_from(len) else {
            return false;
        };
        if addrs.len().checked_mul(len).is_none_or(|n| n > dst.len()) {
            return false;
        }
        // SAFETY: every address starts `len` bytes inside a retained
        // fragment of a mapping borrowed for `'m` (unmapping needs `&mut`),
        // mapped read-only; `dst` holds every part (checked).
        unsafe { sys::guard::copy_from(dst, addrs, len) }.is_ok()
    }

    /// [`Mapping::copy_rows`] within a gather's guard `scope`.
    pub(crate) fn copy_rows_in(
        &self,
        scope: &sys::guard::Scope,
        offset: u64,
        row_bytes: u64,
        rows: &[u64],
        dst: &mut [u8],
    ) -> Result<(), CopyError> {
        let need = (rows.len() as u64).checked_mul(row_bytes);
        if need.is_none_or(|n| n > dst.len() as u64) {
            return Err(CopyError::Destination {
                need: need.unwrap_or(u64::MAX),
                got: dst.len(),
            });
        }
        let Some(&last) = rows.iter().max() else {
            return Ok(());
        };
        if row_bytes == 0 {
            return Ok(());
        }
        let end = last
            .checked_add(1)
            .and_then(|n| n.checked_mul(row_bytes))
            .and_then(|b| b.checked_add(offset));
        let Some(end) = end.filter(|&e| self.fragment_containing(offset, e - offset).is_some())
        else {
            return Err(CopyError::NotMapped {
                start: offset,
                end: end.unwrap_or(u64::MAX),
            });
        };
        debug_assert!(end <= self.len as u64);
        if let (false, Some(file)) = (scope.use_mapping(), &self.file) {
            scope.note_fallback();
            return self.read_rows(file, offset, row_bytes, rows, dst);
        }
        // SAFETY: every row's bytes lie in `offset..end`, inside a retained
        // fragment, mapped read-only for as long as `self` is borrowed
        // (unmapping needs `&mut self`); `dst` holds all rows (checked);
        // `end` fits the mapping, so `row * row_bytes` cannot overflow.
        let copied = unsafe {
            sys::guard::copy_rows(dst, self.ptr.add(offset as usize), rows, row_bytes as usize)
        };
        copied.map_err(|f| CopyError::Fault {
            index: f.index,
            offset: (f.addr as u64).saturating_sub(self.ptr as u64),
            file_len: self.file_len_now(),
        })
    }

    /// The rows of [`Mapping::copy_rows_in`] read from `file` (the mapped
    /// file) with `pread`, row by row: what the mapping would have held. A
    /// short or failed read is the [`CopyError::Fault`] a mapped read of
    /// that byte would have been. The rows lie inside the file's length at
    /// map time (checked by the caller), so no offset overflows.
    fn read_rows(
        &self,
        file: &File,
        offset: u64,
        row_bytes: u64,
        rows: &[u64],
        dst: &mut [u8],
    ) -> Result<(), CopyError> {
        use std::os::unix::fs::FileExt;
        for (index, (&row, slot)) in rows
            .iter()
            .zip(dst.chunks_exact_mut(row_bytes as usize))
            .enumerate()
        {
            let at = offset + row * row_bytes;
            let mut done = 0usize;
            while done < slot.len() {
                match file.read_at(&mut slot[done..], at + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            if done < slot.len() {
                return Err(CopyError::Fault {
                    index,
                    offset: at + done as u64,
                    file_len: self.file_len_now(),
                });
            }
        }
        Ok(())
    }

    /// True if the rows can be read from the file when the `SIGBUS` guard
    /// is displaced (a duplicate of its descriptor was kept).
    pub(crate) fn has_file(&self) -> bool {
        self.file.is_some()
    }

    /// The mapped file's length now (`fstat`), if it can be read: after a
    /// fault, whether the file shrank.
    pub fn file_len_now(&self) -> Option<u64> {
        self.file.as_ref()?.metadata().ok().map(|m| m.len())
    }

    /// Length of the mapping in bytes (the file length at map time).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Page size the mapping rounds to.
    pub fn page_size(&self) -> u64 {
        self.page
    }

    /// Address of file byte 0 in this process (to relate advised addresses
    /// back to file offsets, e.g. in tests with a recording advisor).
    pub fn base_addr(&self) -> usize {
        self.ptr as usize
    }

    fn mem_run(&self, r: Range<u64>) -> MemRun {
        MemRun {
            addr: self.ptr as usize + r.start as usize,
            len: (r.end - r.start) as usize,
        }
    }

    fn check_in_file(&self, r: &Range<u64>) -> Result<(), MapError> {
        if r.start <= r.end && r.end <= self.len as u64 {
            Ok(())
        } else {
            Err(MapError::OutsideFile {
                start: r.start,
                end: r.end,
                len: self.len as u64,
            })
        }
    }

    /// Converts file-byte `runs` to addresses in `scratch`, keeping only
    /// runs that are non-empty, start on a page and lie inside one retained
    /// fragment. Returns how many were dropped.
    fn checked_runs(&self, runs: &[Range<u64>], scratch: &mut Vec<MemRun>) -> u64 {
        scratch.clear();
        let mut dropped = 0;
        for r in runs {
            let ok = r.start < r.end
                && r.start % self.page == 0
                && self.fragment_containing(r.start, r.end - r.start).is_some();
            if ok {
                scratch.push(self.mem_run(r.clone()));
            } else {
                dropped += 1;
            }
        }
        dropped
    }

    /// `MADV_WILLNEED` over `runs` (file byte ranges). A run that does not
    /// start on a page or is not wholly inside a retained fragment is never
    /// advised; it is counted as a failure. `scratch` is reused storage.
    pub fn advise_will_need(
        &self,
        runs: &[Range<u64>],
        advisor: &dyn Advisor,
        scratch: &mut Vec<MemRun>,
    ) -> AdviceOutcome {
        let dropped = self.checked_runs(runs, scratch);
        let mut out = if scratch.is_empty() {
            AdviceOutcome::default()
        } else {
            advisor.will_need(scratch)
        };
        out.failures += dropped;
        out
    }

    /// Retained parts of the file outside every lazy range, with the pages
    /// a lazy range touches left out: what an eager prefetch may advise.
    pub fn eager_ranges(&self) -> Vec<Range<u64>> {
        let lazy = self.lazy_ranges();
        let mut out = Vec::new();
        for f in &self.retained {
            let mut s = f.start;
            for l in &lazy {
                let hole = floor_to(l.start, self.page)..ceil_to(l.end, self.page);
                if hole.end <= s || hole.start >= f.end {
                    continue;
                }
                if s < hole.start {
                    out.push(s..hole.start);
                }
                s = s.max(hole.end);
            }
            if s < f.end {
                out.push(s..f.end);
            }
        }
        out
    }

    /// Eagerly prefetches ([`Mapping::eager_ranges`]) everything but the lazy
    /// ranges.
    pub fn prefetch_eager(&self, advisor: &dyn Advisor) -> AdviceOutcome {
        let mut scratch = Vec::new();
        self.advise_will_need(&self.eager_ranges(), advisor, &mut scratch)
    }

    /// Drops this process's page-table entries for the retained pages of
    /// `range` (page-rounded outward), so the kernel may evict them
    /// ([`sys::evict`]); later reads fault them in again from the file. For
    /// cold-cache measurements. Returns false if the OS refused.
    pub fn drop_resident(&self, range: Range<u64>) -> bool {
        let pages = floor_to(range.start, self.page)..ceil_to(range.end, self.page);
        self.retained.iter().all(|f| {
            let s = pages.start.max(f.start);
            let e = pages.end.min(f.end);
            // SAFETY: the run is inside this read-only MAP_SHARED file
            // mapping's retained fragment.
            s >= e || unsafe { sys::dont_need_shared(self.mem_run(s..e)) }
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        for f in &self.retained {
            let run = self.mem_run(f.clone());
            // SAFETY: unmapping a fragment this value mapped and still owns;
            // no slice borrowed from it can outlive `self`. Only retained
            // fragments are unmapped: the holes may hold others' mappings.
            let _ = unsafe { sys::unmap(run) };
        }
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("len", &self.len)
            .field("retained", &self.retained)
            .field("lazy", &self.lazy_ranges())
            .finish()
    }
}

#[cfg(test)]
// Single ranges are what these tests are about.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use crate::sys::RecordingAdvisor;
    use std::io::Write;

    fn file_of(len: usize) -> std::fs::File {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        f
    }

    #[test]
    fn bytes_are_checked_against_the_file() {
        let p = sys::page_size() as usize;
        let m = Mapping::map(&file_of(3 * p + 100)).unwrap();
        assert_eq!(m.bytes(5, 3), Some(&[5u8, 6, 7][..]));
        assert!(m.bytes(3 * p as u64, 100).is_some());
        assert!(m.bytes(3 * p as u64, 101).is_none());
        assert!(m.bytes(u64::MAX, 2).is_none());
        assert_eq!(m.bytes(m.len() as u64, 0), Some(&[][..]));
        assert!(m.bytes(m.len() as u64 + 1, 0).is_none());
        let empty = Mapping::map(&file_of(0)).unwrap();
        assert_eq!(empty.bytes(0, 0), Some(&[][..]));
        assert!(empty.retained().is_empty());
    }

    #[test]
    fn unmap_rounds_inward_and_splits_fragments() {
        let p = sys::page_size();
        let len = 8 * p + 100;
        let mut m = Mapping::map(&file_of(len as usize)).unwrap();
        // Less than one whole page inside: nothing unmapped.
        assert_eq!(m.unmap_fragment(10, p + 5).unwrap(), None);
        assert_eq!(m.retained(), &[0..len]);
        // 2p+1 .. 5p-1 rounds inward to 3p..4p.
        assert_eq!(
            m.unmap_fragment(2 * p + 1, 5 * p - 1).unwrap(),
            Some(3 * p..4 * p)
        );
        assert_eq!(m.retained(), &[0..3 * p, 4 * p..len]);
        assert!(m.bytes(3 * p - 1, 1).is_some());
        assert!(m.bytes(3 * p, 1).is_none());
        assert!(m.bytes(3 * p - 1, 2).is_none(), "a range across the hole");
        assert!(m.bytes(4 * p, 1).is_some());
        // The tail, partial last page included.
        assert_eq!(m.unmap_fragment(7 * p, u64::MAX).unwrap(), Some(7 * p..len));
        assert_eq!(m.retained(), &[0..3 * p, 4 * p..7 * p]);
        assert!(m.bytes(len - 1, 1).is_none());
        // Unmapping across an existing hole only touches retained parts.
        assert_eq!(m.unmap_fragment(2 * p, 5 * p).unwrap(), Some(2 * p..5 * p));
        assert_eq!(m.retained(), &[0..2 * p, 5 * p..7 * p]);
        assert!(matches!(
            m.unmap_fragment(len + 1, len + 2),
            Err(MapError::OutsideFile { .. })
        ));
        assert!(m.unmap_fragment(5, 4).is_err());
    }

    #[test]
    fn lazy_ranges_get_random_advice_and_merge() {
        let p = sys::page_size();
        let len = 10 * p;
        let rec = RecordingAdvisor::new(None);
        let m = Mapping::map_with_lazy(&file_of(len as usize), &[p + 10..3 * p + 5], &rec).unwrap();
        let base = m.base_addr();
        let rnd = rec.random_runs();
        assert_eq!(rnd.len(), 1);
        assert_eq!(rnd[0].addr - base, p as usize);
        assert_eq!(rnd[0].len, 3 * p as usize);
        assert!(m.contains_lazy(p + 10, 2 * p - 5));
        assert!(!m.contains_lazy(p + 10, 2 * p - 4));
        assert!(!m.contains_lazy(p + 9, 2));
        assert!(!m.contains_lazy(p + 10, 0));
        m.register_lazy(3 * p + 5..4 * p, &rec).unwrap();
        assert_eq!(m.lazy_ranges(), vec![p + 10..4 * p]);
        assert!(m.register_lazy(0..len + 1, &rec).is_err());
        // Eager ranges leave out every page a lazy range touches.
        assert_eq!(m.eager_ranges(), vec![0..p, 4 * p..len]);
    }

    #[test]
    fn contains_lazy_needs_a_retained_fragment() {
        let p = sys::page_size();
        let rec = RecordingAdvisor::new(None);
        let mut m = Mapping::map_with_lazy(&file_of(6 * p as usize), &[0..6 * p], &rec).unwrap();
        m.unmap_fragment(2 * p, 3 * p).unwrap();
        assert!(m.contains_lazy(0, 2 * p));
        assert!(!m.contains_lazy(p, 2 * p));
        assert!(m.contains_lazy(3 * p, p));
    }

    #[test]
    fn advice_skips_unaligned_and_unmapped_runs() {
        let p = sys::page_size();
        let rec = RecordingAdvisor::new(None);
        let mut m = Mapping::map(&file_of(6 * p as usize)).unwrap();
        m.unmap_fragment(2 * p, 3 * p).unwrap();
        let mut scratch = Vec::new();
        let runs = [
            0..p,
            p + 1..2 * p,
            2 * p..3 * p,
            p..3 * p,
            4 * p..5 * p,
            5 * p..5 * p,
        ];
        let o = m.advise_will_need(&runs, &rec, &mut scratch);
        assert_eq!(o.failures, 4);
        let base = m.base_addr();
        let got: Vec<_> = rec
            .will_need_runs()
            .iter()
            .map(|r| (r.addr - base) as u64..(r.addr - base + r.len) as u64)
            .collect();
        assert_eq!(got, vec![0..p, 4 * p..5 * p]);
    }
}
