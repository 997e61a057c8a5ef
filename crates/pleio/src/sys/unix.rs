//! Unix implementation of the OS layer.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::os::unix::process::CommandExt;
use std::sync::OnceLock;

use super::MemRun;

/// Forks seen by this process's ancestry line: bumped in the child after
/// every `fork` (a `pthread_atfork` child handler).
static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn after_fork_in_child() {
    // Async-signal-safe: one atomic add.
    FORKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// How many forks made this process from the one that first asked (0
/// there); the handler that counts them is installed by the first call.
pub(super) fn forks() -> Option<u64> {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // SAFETY: installs a child handler that only adds to an atomic;
        // no pointers are passed but the function's.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
        }
    });
    Some(FORKS.load(std::sync::atomic::Ordering::Relaxed))
}

pub(super) fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if n > 0 {
            n as u64
        } else {
            4096
        }
    })
}


pub(super) fn join_cgroup_on_spawn(cmd: &mut std::process::Command, procs: File) -> io::Result<()> {
    let fd = procs.as_raw_fd();
    let hook = move || {
        // Keeps the file (and so `fd`) open for as long as `cmd` lives.
        let _open = &procs;
        // SAFETY: one write(2) of a static one-byte buffer to an open fd.
        // "0" written to cgroup.procs moves the writing process.
        let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        if n == 1 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    // SAFETY: the hook runs in the forked child before exec, where only
    // async-signal-safe work is allowed: it makes one write(2) to an fd
    // opened before the fork and builds an OS error code; it allocates
    // nothing and takes no lock.
    unsafe {
        cmd.pre_exec(hook);
    }
    Ok(())
}

/// A shared mapping of the first `len` bytes of `file`, read-only or
/// read-write.
pub(super) fn map_shared(file: &File, len: usize, write: bool) -> io::Result<*mut u8> {
    let prot = if write {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh shared mapping of a valid fd; the kernel picks the
    // address, so no existing memory is affected.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(ptr.cast())
    }
}

/// # Safety
///
/// As [`super::unmap`].
pub(super) unsafe fn unmap(run: MemRun) -> io::Result<()> {
    // SAFETY: forwarded from the caller.
    if unsafe { libc::munmap(run.addr as *mut libc::c_void, run.len) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(super) fn physical_memory() -> u64 {
    // SAFETY: sysconf only reads system configuration values.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        0
    } else {
        (pages as u64).saturating_mul(page as u64)
    }
}

pub(super) fn open_nonblocking(path: &Path, direct: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    #[cfg(target_os = "linux")]
    let flags = libc::O_NONBLOCK | if direct { libc::O_DIRECT } else { 0 };
    #[cfg(not(target_os = "linux"))]
    let flags = if direct {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "O_DIRECT is Linux-only",
        ));
    } else {
        libc::O_NONBLOCK
    };
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
}

pub(super) fn set_blocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is an open descriptor owned by `file` for the whole
    // call; F_GETFL/F_SETFL read and set its status flags only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
