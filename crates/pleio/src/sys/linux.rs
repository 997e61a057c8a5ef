//! Linux page advice, fault counters and cache eviction.

use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::{AdviceMode, AdviceOutcome, MemRun, ADVICE_BATCH};

pub(super) const NOOP: bool = false;

pub(super) fn thread_major_faults() -> Option<u64> {
    let mut ru = MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `ru` is writable memory of the right type; getrusage fills it
    // on success and has no other effect.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage returned 0, so `ru` is initialized.
    let ru = unsafe { ru.assume_init() };
    u64::try_from(ru.ru_majflt).ok()
}

pub(super) fn evict(file: &File, range: Range<u64>) -> io::Result<()> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, "range too large");
    let off = i64::try_from(range.start).map_err(|_| bad())?;
    let len = i64::try_from(range.end.saturating_sub(range.start)).map_err(|_| bad())?;
    // SAFETY: posix_fadvise only drops clean page-cache pages of a valid fd;
    // it touches no memory of this process.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), off, len, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

pub(super) fn random_reads(file: &File) -> bool {
    // SAFETY: posix_fadvise only sets the readahead policy of this open file
    // description; it touches no memory of this process.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) == 0 }
}

pub(super) fn reopen(file: &File) -> Option<File> {
    // The descriptor's magic link: the same file, even one unreachable by
    // name, with the open-time permission check against its inode.
    File::open(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

fn madvise(run: MemRun, advice: libc::c_int) -> bool {
    // SAFETY: only MADV_WILLNEED and MADV_RANDOM are passed here: they start
    // readahead or change the readahead hint, never memory contents or which
    // pages are mapped. The kernel validates the range (EINVAL / ENOMEM).
    unsafe { libc::madvise(run.addr as *mut libc::c_void, run.len, advice) == 0 }
}

pub(super) fn random(run: MemRun) -> bool {
    madvise(run, libc::MADV_RANDOM)
}

pub(super) unsafe fn dont_need_shared(run: MemRun) -> bool {
    // SAFETY: the caller guarantees `run` is inside a read-only shared file
    // mapping, where MADV_DONTNEED only drops page-table entries.
    unsafe { libc::madvise(run.addr as *mut libc::c_void, run.len, libc::MADV_DONTNEED) == 0 }
}

pub(super) fn resident_pages(run: MemRun, page: u64, buf: &mut Vec<u8>) -> Option<u64> {
    let n = (run.len as u64).div_ceil(page.max(1)) as usize;
    buf.clear();
    buf.resize(n, 0);
    // SAFETY: `buf` has one writable byte per page of `run`; mincore only
    // writes there and fails (ENOMEM) on unmapped addresses.
    let rc = unsafe { libc::mincore(run.addr as *mut libc::c_void, run.len, buf.as_mut_ptr()) };
    (rc == 0).then(|| buf.iter().filter(|&&b| b & 1 != 0).count() as u64)
}

/// False once `process_madvise` turned out to be missing or refused.
static BATCH_OK: AtomicBool = AtomicBool::new(true);

/// A pidfd of this process, opened once.
fn self_pidfd() -> Option<RawFd> {
    static PIDFD: OnceLock<Option<OwnedFd>> = OnceLock::new();
    PIDFD
        .get_or_init(|| {
            // SAFETY: pidfd_open(getpid(), 0) creates a new fd and touches
            // no memory.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
            let fd = RawFd::try_from(fd).ok().filter(|&fd| fd >= 0)?;
            // SAFETY: `fd` was just returned by the kernel and is owned by
            // nobody else.
            Some(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .as_ref()
        .map(|fd| fd.as_raw_fd())
}

/// One `process_madvise(MADV_WILLNEED)` over `runs` (at most
/// [`ADVICE_BATCH`]): `Ok(bytes advised)` or the error.
fn process_willneed(fd: RawFd, runs: &[MemRun]) -> Result<usize, i32> {
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut iov = [empty; ADVICE_BATCH];
    let n = runs.len().min(ADVICE_BATCH);
    for (v, r) in iov.iter_mut().zip(&runs[..n]) {
        v.iov_base = r.addr as *mut libc::c_void;
        v.iov_len = r.len;
    }
    // SAFETY: `iov` holds `n` valid iovecs that outlive the call; the kernel
    // only reads them. MADV_WILLNEED starts readahead and never changes
    // memory contents or mappings; bad ranges are refused with an errno.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_process_madvise,
            fd,
            iov.as_ptr(),
            n,
            libc::MADV_WILLNEED,
            0u32,
        )
    };
    usize::try_from(ret).map_err(|_| io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

pub(super) fn will_need(runs: &[MemRun], mode: AdviceMode) -> AdviceOutcome {
    let mut out = AdviceOutcome {
        runs: runs.len() as u64,
        ..AdviceOutcome::default()
    };
    let mut rest = runs;
    if mode == AdviceMode::Batched {
        while !rest.is_empty() && BATCH_OK.load(Ordering::Relaxed) {
            let Some(fd) = self_pidfd() else {
                BATCH_OK.store(false, Ordering::Relaxed);
                break;
            };
            let batch = &rest[..rest.len().min(ADVICE_BATCH)];
            let total: usize = batch.iter().map(|r| r.len).sum();
            out.syscalls += 1;
            match process_willneed(fd, batch) {
                Ok(done) if done >= total => rest = &rest[batch.len()..],
                Ok(done) => {
                    // Stopped at the run holding byte `done`: it failed.
                    let mut acc = 0;
                    let k = batch
                        .iter()
                        .take_while(|r| {
                            acc += r.len;
                            acc <= done
                        })
                        .count();
                    out.failures += 1;
                    rest = &rest[(k + 1).min(rest.len())..];
                }
                Err(libc::EINTR | libc::EAGAIN) => {
                    // Interrupted: this batch run by run, then carry on.
                    per_run(batch, &mut out);
                    rest = &rest[batch.len()..];
                }
                Err(libc::ENOSYS | libc::EPERM | libc::EBADF | libc::ESRCH | libc::EINVAL) => {
                    // The call itself is unavailable: advise run by run.
                    BATCH_OK.store(false, Ordering::Relaxed);
                }
                Err(_) => {
                    // The first run was refused (e.g. ENOMEM): skip it.
                    out.failures += 1;
                    rest = &rest[1..];
                }
            }
        }
    }
    per_run(rest, &mut out);
    out
}

fn per_run(runs: &[MemRun], out: &mut AdviceOutcome) {
    for &r in runs {
        out.syscalls += 1;
        if !madvise(r, libc::MADV_WILLNEED) {
            out.failures += 1;
        }
    }
}

pub(super) fn dio_alignment(file: &File) -> Option<(u32, u32)> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open, the path is a valid empty C string used with
    // AT_EMPTY_PATH, and `stx` is a valid, writable statx buffer.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    (rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0)
        .then_some((stx.stx_dio_offset_align, stx.stx_dio_mem_align))
}








/// `cachestat(2)`'s number (Linux 6.5+; one number for every architecture
/// with the common syscall table).
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64",
    target_arch = "powerpc64",
    target_arch = "s390x",
    target_arch = "loongarch64"
))]
const SYS_CACHESTAT: Option<libc::c_long> = Some(451);
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64",
    target_arch = "powerpc64",
    target_arch = "s390x",
    target_arch = "loongarch64"
)))]
const SYS_CACHESTAT: Option<libc::c_long> = None;

pub(super) fn cachestat(file: &File, range: Range<u64>) -> io::Result<u64> {
    #[repr(C)]
    struct CachestatRange {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Cachestat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let Some(nr) = SYS_CACHESTAT else {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    };
    if range.is_empty() {
        return Ok(0);
    }
    let r = CachestatRange {
        off: range.start,
        len: range.end - range.start,
    };
    let mut cs = Cachestat::default();
    // SAFETY: cachestat reads `r` and writes `cs`, both live, correctly
    // laid out (the kernel's struct cachestat_range and struct cachestat)
    // and outliving the call; it touches no other memory.
    let rc = unsafe {
        libc::syscall(
            nr,
            file.as_raw_fd(),
            &r as *const CachestatRange,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    if rc == 0 {
        Ok(cs.nr_cache)
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(super) fn read_cached(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    preadv2(file, offset, buf, libc::RWF_NOWAIT)
}

/// Set once the kernel or file system refuses `RWF_DONTCACHE` (before Linux
/// 6.14, or a file system without uncached buffered reads).
static DONTCACHE_REFUSED: AtomicBool = AtomicBool::new(false);

/// True once `RWF_DONTCACHE` was refused here.
#[cfg(test)]
pub(super) fn dontcache_refused() -> bool {
    DONTCACHE_REFUSED.load(Ordering::Relaxed)
}

pub(super) fn peek_cached(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    if !DONTCACHE_REFUSED.load(Ordering::Relaxed) {
        match preadv2(file, offset, buf, libc::RWF_NOWAIT | libc::RWF_DONTCACHE) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) => {
                DONTCACHE_REFUSED.store(true, Ordering::Relaxed);
            }
            r => return r,
        }
    }
    read_cached(file, offset, buf)
}

/// `preadv2` of `buf.len()` bytes at `offset` with `flags`, retried on
/// `EINTR`.
fn preadv2(file: &File, offset: u64, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    let off = i64::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    loop {
        // SAFETY: `iov` describes `buf`, writable and live for the call;
        // preadv2 writes at most `buf.len()` bytes there.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, off, flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

pub(super) fn may_write(file: &File) -> bool {
    let empty = c"";
    // SAFETY: faccessat2 on our own fd with an empty, NUL-terminated path
    // (AT_EMPTY_PATH: the fd itself) only checks permissions.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            file.as_raw_fd(),
            empty.as_ptr(),
            libc::W_OK,
            libc::AT_EACCESS | libc::AT_EMPTY_PATH,
        )
    };
    if rc == 0 {
        return true;
    }
    if io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
        return false;
    }
    // No faccessat2 (Linux < 5.8): the mode bits, ignoring read-only mounts.
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = file.metadata() else {
        return false;
    };
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    (m.uid() == uid && m.mode() & 0o200 != 0)
        || (m.gid() == gid && m.mode() & 0o020 != 0)
        || m.mode() & 0o002 != 0
}

pub(super) fn owns_or_may_write(file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    // uid 0 stands for CAP_FOWNER, which the kernel's owner test accepts.
    uid == 0 || file.metadata().is_ok_and(|m| m.uid() == uid) || may_write(file)
}

pub(super) fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that the
    // process exists (and whether we may signal it).
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}
