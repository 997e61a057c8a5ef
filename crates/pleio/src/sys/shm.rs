//! Shared-memory segments for the machine-wide row cache: a file opened
//! without following symlinks, checked to be a regular file, and mapped
//! read-write and shared, seen as an array of 64-bit atomic words (every
//! byte another process may write is read through an atomic, so a torn or
//! racing write is a wrong value the caller validates, never undefined
//! behaviour).

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use super::guard::SharedRegion;
use super::MemRun;

/// A whole file mapped read-write and shared, as 64-bit atomic words.
pub struct SharedWords {
    ptr: NonNull<AtomicU64>,
    words: usize,
    /// The mapping's entry in the `SIGBUS` handler's list (taken out
    /// before the unmap).
    region: Option<SharedRegion>,
}

// SAFETY: the mapping is owned by this value and only ever accessed through
// `&[AtomicU64]`, which is `Send + Sync`.
unsafe impl Send for SharedWords {}
// SAFETY: as above.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Maps the first `words` 64-bit words of `file` read-write and shared.
    /// The caller checked the file is at least that long. A file shrunk
    /// later by someone who may write it raises `SIGBUS` on access, which
    /// pleio's handler turns into zeros and [`SharedWords::lost`] (see
    /// [`SharedRegion`]; Linux x86_64 only: elsewhere it kills).
    pub fn map(file: &File, words: usize) -> io::Result<SharedWords> {
        let len = words
            .checked_mul(8)
            .filter(|&l| l > 0 && l <= isize::MAX as usize)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad segment length"))?;
        if super::NOOP {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "shared-memory row caches are not available in this build",
            ));
        }
        let ptr = super::base::map_shared(file, len, true)?;
        let run = MemRun {
            addr: ptr as usize,
            len,
        };
        let Some(region) = SharedRegion::register(run.addr, len) else {
            // SAFETY: the mapping just made, referenced by nothing.
            let _ = unsafe { super::base::unmap(run) };
            return Err(io::Error::other(
                "too many shared row-cache segments mapped by this process",
            ));
        };
        let ptr = NonNull::new(ptr.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(SharedWords {
            ptr,
            words,
            region: Some(region),
        })
    }

    /// Asks the CPU to bring the cache lines of words `at..at + n` in (a
    /// software prefetch: no load, no fault); words past the end are
    /// ignored.
    #[inline]
    pub fn prefetch(&self, at: usize, n: usize) {
        let n = n.min(self.words.saturating_sub(at));
        super::prefetch_lines(
            self.ptr.as_ptr().wrapping_add(at).cast::<u8>(),
            n * 8,
            usize::MAX,
        );
    }

    /// True once another process shrank the file under the mapping: every
    /// word now reads zero (a private copy), so nothing more is shared.
    pub fn lost(&self) -> bool {
        self.region.as_ref().is_some_and(SharedRegion::lost)
    }

    /// The mapped words.
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is a live mapping of `words * 8` bytes, page-aligned
        // (so aligned for `AtomicU64`), readable and writable, unmapped only
        // in `drop`; any bit pattern is a valid `AtomicU64`, and all access
        // is atomic, so writes by other processes are not data races.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.words) }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // Out of the handler's list first: the range may be reused.
        drop(self.region.take());
        let run = MemRun {
            addr: self.ptr.as_ptr() as usize,
            len: self.words * 8,
        };
        // SAFETY: the whole mapping made in `map`, owned by `self`; no
        // reference into it outlives `self` (`words` borrows `self`).
        let _ = unsafe { super::base::unmap(run) };
    }
}

/// Opens an existing segment read-write, never following a symlink in its
/// last component, without blocking, and only if it is a regular file.
pub fn open_segment(path: &Path) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    regular(f)
}

/// Creates a new segment file (`O_EXCL`, never following a symlink) with
/// permission bits `mode`.
pub fn create_segment(path: &Path, mode: u32) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    regular(f)
}

/// Allocates the first `len` bytes of `f` (a new segment file) now, so no
/// later write finds a hole: on tmpfs that is every page of the segment
/// made and zeroed once, by its creator, instead of on the first write to
/// each slot by whichever process fills it (a page fault that allocates
/// and zeroes: the cold path's largest CPU cost), and a full `/dev/shm` is
/// `ENOSPC` here rather than `SIGBUS` on some later write. A file system
/// without `fallocate` (`EOPNOTSUPP`) is left as it is.
pub fn allocate(f: &File, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let len = libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: fallocate on a descriptor we own, no pointers.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(e);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (f, len);
    Ok(())
}

fn regular(f: File) -> io::Result<File> {
    let ty = f.metadata()?.file_type();
    if !ty.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is {}, not a regular file", super::file_kind(&ty)),
        ));
    }
    Ok(f)
}

/// True unless process `pid` is known not to exist (`kill(pid, 0)` says
/// `ESRCH`); a process we may not signal counts as alive.
pub fn process_alive(pid: u32) -> bool {
    super::adv::process_alive(pid)
}
