//! The only place the engine talks to the OS: page size, mapping and
//! unmapping, page advice, residency (`mincore`), `O_DIRECT` alignment
//! (`statx`), fault counters (`getrusage`), cache eviction and cgroup joins.
//! A port to another OS touches this folder only. (What only the lab asks
//! of the OS, `/proc` counters, peak RSS, free space, lives in
//! `pleio_lab::os`.)
//!
//! # Safety
//!
//! Every `unsafe` block of the engine that calls the OS is here, each with
//! its `// SAFETY:` reason. What this module promises its callers: the safe
//! functions never touch memory they were not handed (advice and residency
//! take addresses, never dereference them); the `unsafe fn`s (`unmap`,
//! `dont_need_shared`) state in their `# Safety` section what the caller
//! must guarantee about the memory they name.
//!
//! One implementation per OS family, chosen at compile time. `stub.rs`
//! compiles everywhere (it is built in every configuration, so it cannot
//! rot), advises nothing and reports nothing; it is selected on platforms
//! without the needed calls, and on Linux by the `noop-os` cargo feature.

use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[cfg(unix)]
#[path = "unix.rs"]
mod base;

#[path = "stub.rs"]
#[allow(dead_code)]
mod stub;

#[cfg(not(unix))]
use stub as base;

#[cfg(all(target_os = "linux", not(feature = "noop-os")))]
#[path = "linux.rs"]
mod adv;

#[cfg(not(all(target_os = "linux", not(feature = "noop-os"))))]
use stub as adv;


/// This process's id, without a system call each time (glibc no longer
/// caches it, and the row caches ask per row): kept per thread with the
/// fork count it was read under, and read again in a forked child (whose
/// one thread starts from its parent thread's copy).
pub(crate) fn pid() -> u32 {
    thread_local! {
        static PID: std::cell::Cell<Option<(u64, u32)>> = const { std::cell::Cell::new(None) };
    }
    let Some(forks) = base::forks() else {
        return std::process::id();
    };
    PID.with(|c| match c.get() {
        Some((f, pid)) if f == forks => pid,
        _ => {
            let pid = std::process::id();
            c.set(Some((forks, pid)));
            pid
        }
    })
}

/// Asks the CPU to start loading the cache lines of the `len` bytes at
/// `start` into its caches, at most `max_lines` of them: a software
/// prefetch, which never faults, blocks or reads anything architecturally,
/// so a batch's rows can be requested from memory together before they are
/// read one after another. A no-op on CPUs without the instruction.
#[inline]
pub(crate) fn prefetch_lines(start: *const u8, len: usize, max_lines: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let end = (start as usize).saturating_add(len);
        let mut at = start as usize;
        for _ in 0..max_lines {
            if at >= end {
                break;
            }
            // SAFETY: a prefetch is a hint: it reads nothing
            // architecturally and never faults, whatever the address (the
            // pointer is made with wrapping arithmetic, never dereferenced).
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(at - start as usize).cast::<i8>())
            };
            at = (at | 63).saturating_add(1);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, len, max_lines);
}

pub(crate) mod clock;
pub(crate) mod guard;
pub mod shm;
mod zeroed;
pub(crate) use zeroed::Zeroed;

/// True where reads through pleio's mappings survive `SIGBUS` (a file that
/// shrank under its mapping, or a device error): Linux x86_64. There a
/// mapped gather returns an error instead of the process dying; elsewhere
/// the signal kills as it would without pleio.
pub const SIGBUS_PROTECTED: bool = guard::PROTECTED;

/// True when this build has the no-op OS layer (no advice, no fault
/// counters, no eviction): a non-Linux target or the `noop-os` feature.
pub const NOOP: bool = adv::NOOP;

/// The OS page size in bytes (4096 on most x86_64 Linux, 16384 on some
/// arm64 machines). Never a literal: always read from the OS.
pub fn page_size() -> u64 {
    base::page_size()
}

/// This machine's physical memory in bytes (0 where the OS does not tell).
pub fn physical_memory() -> u64 {
    base::physical_memory()
}


/// Opens `path` for reading only if it is a regular file: opened without
/// blocking (`O_NONBLOCK`, so a FIFO or a device cannot hang the open),
/// checked with `fstat`, then switched back to blocking reads. A FIFO, a
/// socket, a device or a directory is an `InvalidInput` error saying what
/// it is. Every table file pleio opens goes through here.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    open_checked(path, false)
}

/// [`open_regular`] with `O_DIRECT` (reads bypass the page cache): the same
/// non-blocking open and `fstat` check, the flag kept when the descriptor
/// is switched back to blocking. A file system that refuses `O_DIRECT`
/// fails the open with `EINVAL`; an OS without it is an `Unsupported` error.
pub fn open_regular_direct(path: &Path) -> std::io::Result<File> {
    open_checked(path, true)
}

fn open_checked(path: &Path, direct: bool) -> std::io::Result<File> {
    let file = base::open_nonblocking(path, direct)?;
    let ty = file.metadata()?.file_type();
    if ty.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    }
    if !ty.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("is {}, not a regular file", file_kind(&ty)),
        ));
    }
    base::set_blocking(&file)?;
    Ok(file)
}

/// What kind of file `ty` is, in words.
fn file_kind(ty: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ty.is_fifo() {
            return "a FIFO";
        }
        if ty.is_socket() {
            return "a socket";
        }
        if ty.is_char_device() || ty.is_block_device() {
            return "a device";
        }
    }
    "a special file"
}

/// Major page faults taken so far by the calling thread
/// (`getrusage(RUSAGE_THREAD)`), or `None` where the OS cannot tell.
///
/// Thread-scoped on purpose: a gather runs on its caller's thread, and a
/// process-wide count would include faults of unrelated threads (other
/// gathers, the rest of an engine) running at the same time.
pub fn thread_major_faults() -> Option<u64> {
    adv::thread_major_faults()
}

/// Drops the page-cache pages of `range` of `file`
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`), for cold-cache measurements.
///
/// Pages still mapped by some process stay cached: unmap them first (see
/// [`crate::map::Mapping::drop_resident`]). Fails with
/// [`std::io::ErrorKind::Unsupported`] in the no-op layer.
pub fn evict(file: &File, range: Range<u64>) -> std::io::Result<()> {
    adv::evict(file, range)
}

/// Tells the OS that reads through `file` (this open file description) are
/// random: no readahead, so a 90-byte row read pulls one page, not a window
/// of neighbours (`posix_fadvise(POSIX_FADV_RANDOM)`). False where refused
/// or unavailable; reads stay correct either way.
pub fn random_reads(file: &File) -> bool {
    adv::random_reads(file)
}

/// A second open file description of `file`'s file, with readahead off
/// ([`random_reads`]), for read probes that must leave the page cache as
/// they found it: a cache-only read of a missing page still starts reading
/// it, and through a readahead window also its neighbours, which nobody then
/// drops. `None` where it cannot be opened; callers fall back to `file`.
pub fn probe_handle(file: &File) -> Option<File> {
    let f = adv::reopen(file)?;
    random_reads(&f).then_some(f)
}

/// Makes the child that `cmd` spawns join the control group whose
/// `cgroup.procs` file `procs` is (open for writing), between fork and exec:
/// the child runs confined from its first instruction. A refused join fails
/// the spawn with the OS error. Unsupported off Unix.
pub fn join_cgroup_on_spawn(cmd: &mut std::process::Command, procs: File) -> std::io::Result<()> {
    base::join_cgroup_on_spawn(cmd, procs)
}

/// Drops this process's page-table entries for `run` (`MADV_DONTNEED`), so
/// its pages can leave the page cache. Returns false if refused.
///
/// # Safety
///
/// `run` must lie inside a read-only `MAP_SHARED` mapping of a file: there
/// dropping the entries discards nothing, later reads fault the same file
/// bytes back in. (On private or anonymous memory it would zero it.)
pub(crate) unsafe fn dont_need_shared(run: MemRun) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe { adv::dont_need_shared(run) }
}

/// Maps all `len` (> 0) bytes of `file` read-only and shared; returns the
/// address. The mapping's owner ([`crate::map::Mapping`]) unmaps it.
pub(crate) fn map_shared_read_only(file: &File, len: usize) -> std::io::Result<*mut u8> {
    base::map_shared(file, len, false)
}

/// Unmaps `run`.
///
/// # Safety
///
/// `run` must be a page-aligned part of a mapping made by
/// [`map_shared_read_only`] that the caller owns, with no reference into it
/// alive (the memory is gone afterwards).
pub(crate) unsafe fn unmap(run: MemRun) -> std::io::Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { base::unmap(run) }
}

/// `O_DIRECT` alignment of `file` as `(offset, memory)` bytes, from
/// `statx(STATX_DIOALIGN)` (Linux 6.1+); `(0, 0)` means the file system
/// refuses `O_DIRECT`; `None` where the OS does not say.
pub fn dio_alignment(file: &File) -> Option<(u32, u32)> {
    adv::dio_alignment(file)
}







/// Pages of `run` (page-aligned) resident in the page cache (`mincore`),
/// using `buf` as scratch; `None` where the OS cannot tell.
pub fn resident_pages(run: MemRun, page: u64, buf: &mut Vec<u8>) -> Option<u64> {
    adv::resident_pages(run, page, buf)
}

/// Pages of file bytes `range` (page-rounded outward) in the page cache,
/// by `cachestat(2)` (Linux 6.5+): exact, one call for any range.
///
/// Since Linux 6.14 the kernel refuses (`PermissionDenied`) a caller that
/// neither owns `file` nor may write it, as it makes `mincore` lie to such a
/// caller: this refusal is how pleio learns that only
/// [`read_cached`] tells it the truth. `Unsupported` (ENOSYS) on older
/// kernels and in the no-op layer.
pub fn cachestat(file: &File, range: Range<u64>) -> std::io::Result<u64> {
    adv::cachestat(file, range)
}

/// Reads `buf.len()` bytes at `offset` of `file` only if they are in the
/// page cache (`preadv2(RWF_NOWAIT)`): `Ok(n)` for the cached prefix
/// (`n < buf.len()` where a page is missing or the file ends),
/// `WouldBlock` if the first page is not cached. Works for any reader.
///
/// Not free of side effects: for a missing first page the kernel starts
/// reading it in (one page) before it answers `WouldBlock`.
pub fn read_cached(file: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    adv::read_cached(file, offset, buf)
}

/// [`read_cached`] for a probe that must leave the page cache as it found
/// it: a page the probe itself brings in is dropped again once read
/// (`RWF_DONTCACHE`, Linux 6.14+ on file systems that support it; elsewhere
/// exactly [`read_cached`]). The kernel starts reading a missing page
/// before it answers, and on a fast device that read can finish first: the
/// probe then gets the bytes (`Ok`) for a page that was not cached. With
/// `RWF_DONTCACHE` such a page leaves again; without it, it stays.
pub fn peek_cached(file: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    adv::peek_cached(file, offset, buf)
}

/// True if the kernel shows this process the page-cache residency of
/// `file` through `mincore`: it owns the file (or is root) or may write
/// it. Since Linux 5.0 `mincore` reports every page of a file mapping
/// resident to anyone else. Always false in the no-op layer.
pub fn residency_visible(file: &File) -> bool {
    adv::owns_or_may_write(file)
}

/// A range of this process's address space: `len` bytes from `addr`.
///
/// Only an address, never dereferenced by pleio's advice code; the mapping
/// that produces these guarantees they lie inside its live fragments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRun {
    /// Start address (page-aligned when produced by a mapping).
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

/// What one round of advice did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdviceOutcome {
    /// Runs handed to the kernel.
    pub runs: u64,
    /// Advice system calls made.
    pub syscalls: u64,
    /// Runs (or calls) the kernel refused; the data is then demand-paged.
    pub failures: u64,
}

impl AdviceOutcome {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: AdviceOutcome) {
        self.runs += other.runs;
        self.syscalls += other.syscalls;
        self.failures += other.failures;
    }
}

/// How `MADV_WILLNEED` is issued for a batch of runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdviceMode {
    /// One `madvise` per run.
    PerRun,
    /// One `process_madvise` on our own pidfd per batch of up to
    /// [`ADVICE_BATCH`] runs, falling back to `PerRun` where the kernel
    /// lacks it or refuses.
    Batched,
}

/// Most runs handed to the kernel in one `process_madvise` call.
pub const ADVICE_BATCH: usize = 256;

/// Issues page advice for ranges of mapped memory. The OS implementation is
/// [`OsAdvisor`]; tests substitute a [`RecordingAdvisor`].
///
/// Contract: `will_need` never fails the caller; refusals are counted in
/// the outcome. Runs are page-aligned and inside live mappings.
pub trait Advisor: Send + Sync + fmt::Debug {
    /// Tells the kernel the pages of `runs` will be read soon
    /// (`MADV_WILLNEED`): their reads start now, in parallel.
    fn will_need(&self, runs: &[MemRun]) -> AdviceOutcome;

    /// Tells the kernel accesses to `runs` are random (`MADV_RANDOM`), so a
    /// fault reads one page instead of a readahead window. Returns false if
    /// refused.
    fn random(&self, run: MemRun) -> bool;
}

/// The OS's advice calls (a no-op in the stub layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OsAdvisor {
    mode: AdviceMode,
}

/// The default [`AdviceMode`], the faster one measured on Linux 6.18 (see
/// the `advise_bench` example).
pub const DEFAULT_ADVICE_MODE: AdviceMode = AdviceMode::Batched;

impl OsAdvisor {
    /// An advisor issuing advice in `mode`.
    pub fn new(mode: AdviceMode) -> OsAdvisor {
        OsAdvisor { mode }
    }

    /// The mode used.
    pub fn mode(&self) -> AdviceMode {
        self.mode
    }
}

impl Default for OsAdvisor {
    fn default() -> Self {
        OsAdvisor::new(DEFAULT_ADVICE_MODE)
    }
}

impl Advisor for OsAdvisor {
    fn will_need(&self, runs: &[MemRun]) -> AdviceOutcome {
        adv::will_need(runs, self.mode)
    }

    fn random(&self, run: MemRun) -> bool {
        adv::random(run)
    }
}

/// The process-wide default advisor.
pub fn os_advisor() -> Arc<dyn Advisor> {
    Arc::new(OsAdvisor::default())
}

/// An advisor that records every run it is given, optionally refusing
/// them, and forwards the rest to an inner advisor. For tests and
/// diagnostics (the in-process equivalent of `strace -e madvise`).
#[derive(Debug)]
pub struct RecordingAdvisor {
    inner: Option<Arc<dyn Advisor>>,
    fail: bool,
    will_need: Mutex<Vec<MemRun>>,
    random: Mutex<Vec<MemRun>>,
    calls: AtomicU64,
}

impl RecordingAdvisor {
    /// Records and forwards to `inner` (`None`: records only, as if every
    /// call succeeded).
    pub fn new(inner: Option<Arc<dyn Advisor>>) -> RecordingAdvisor {
        RecordingAdvisor {
            inner,
            fail: false,
            will_need: Mutex::new(Vec::new()),
            random: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
        }
    }

    /// Records, then refuses every call (an injected advice failure).
    pub fn failing() -> RecordingAdvisor {
        RecordingAdvisor {
            fail: true,
            ..RecordingAdvisor::new(None)
        }
    }

    /// Every `MADV_WILLNEED` run seen so far, in call order.
    pub fn will_need_runs(&self) -> Vec<MemRun> {
        self.will_need.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Every `MADV_RANDOM` run seen so far, in call order.
    pub fn random_runs(&self) -> Vec<MemRun> {
        self.random.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Calls to [`Advisor::will_need`] seen so far.
    pub fn will_need_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Forgets what was recorded.
    pub fn clear(&self) {
        if let Ok(mut v) = self.will_need.lock() {
            v.clear();
        }
        if let Ok(mut v) = self.random.lock() {
            v.clear();
        }
        self.calls.store(0, Ordering::Relaxed);
    }
}

impl Advisor for RecordingAdvisor {
    fn will_need(&self, runs: &[MemRun]) -> AdviceOutcome {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut v) = self.will_need.lock() {
            v.extend_from_slice(runs);
        }
        if self.fail {
            let n = runs.len() as u64;
            return AdviceOutcome {
                runs: n,
                syscalls: n,
                failures: n,
            };
        }
        match &self.inner {
            Some(inner) => inner.will_need(runs),
            None => AdviceOutcome {
                runs: runs.len() as u64,
                syscalls: runs.len().div_ceil(ADVICE_BATCH) as u64,
                failures: 0,
            },
        }
    }

    fn random(&self, run: MemRun) -> bool {
        if let Ok(mut v) = self.random.lock() {
            v.push(run);
        }
        !self.fail && self.inner.as_ref().is_none_or(|i| i.random(run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_is_a_power_of_two() {
        let p = page_size();
        assert!(p >= 512 && p.is_power_of_two(), "{p}");
    }

    #[test]
    fn recording_advisor_records_and_injects_failure() {
        let r = RecordingAdvisor::failing();
        let runs = [MemRun {
            addr: 4096,
            len: 8192,
        }];
        let o = r.will_need(&runs);
        assert_eq!(o.failures, 1);
        assert_eq!(r.will_need_runs(), runs.to_vec());
        assert!(!r.random(runs[0]));
        r.clear();
        assert!(r.will_need_runs().is_empty());
        let ok = RecordingAdvisor::new(None);
        assert_eq!(ok.will_need(&runs).failures, 0);
        assert!(ok.random(runs[0]));
    }

    #[test]
    fn a_peek_leaves_the_page_cache_as_it_found_it() {
        use pleio_testkit::skip;
        if NOOP {
            skip!("no page-cache calls in this build");
        }
        let dir = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
        let path = dir.path().join("peek");
        let page = page_size();
        std::fs::write(&path, vec![7u8; 4 * page as usize]).unwrap();
        let f = File::open(&path).unwrap();
        f.sync_all().unwrap();
        let probe = probe_handle(&f).unwrap_or_else(|| f.try_clone().unwrap());
        let cached = |r: Range<u64>| cachestat(&f, r).ok();
        let Some(4) = cached(0..4 * page) else {
            skip!("cachestat does not count the pages just written");
        };
        // A cached page: read, and cached still.
        let mut b = [0u8; 1];
        assert_eq!(peek_cached(&probe, page, &mut b).unwrap(), 1);
        assert_eq!(b[0], 7);
        assert_eq!(cached(0..4 * page), Some(4));
        // A page the peeks bring in: read once its read is done, and gone
        // again after that.
        evict(&f, 0..4 * page).unwrap();
        if cached(0..4 * page) != Some(0) {
            skip!("eviction does not take here");
        }
        let mut read = None;
        for _ in 0..400 {
            match peek_cached(&probe, 2 * page, &mut b) {
                Ok(n) => {
                    read = Some(n);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => panic!("peek at {}: {e}", 2 * page),
            }
        }
        assert_eq!(read, Some(1), "the page never came in");
        assert_eq!(b[0], 7);
        if adv::dontcache_refused() {
            skip!("no RWF_DONTCACHE here: a page a peek brings in stays");
        }
        assert_eq!(cached(2 * page..3 * page), Some(0));
    }

    #[test]
    fn os_advice_on_unmapped_memory_is_counted_not_fatal() {
        // Address 0 is never mapped: the kernel refuses (ENOMEM), we count.
        let runs = [MemRun {
            addr: 0,
            len: page_size() as usize,
        }];
        for mode in [AdviceMode::PerRun, AdviceMode::Batched] {
            let o = OsAdvisor::new(mode).will_need(&runs);
            if NOOP {
                assert_eq!(o, AdviceOutcome::default());
            } else {
                assert_eq!(o.runs, 1);
                assert_eq!(o.failures, 1, "{mode:?}");
            }
        }
    }
}
