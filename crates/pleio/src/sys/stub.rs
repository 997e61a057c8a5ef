//! No-op OS layer: advises nothing, counts nothing, evicts nothing.
//!
//! Selected on platforms without the needed calls and on Linux by the
//! `noop-os` feature; compiled in every build so it cannot rot. Gathers still
//! work through it, on demand paging alone.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::Path;

use super::{AdviceMode, AdviceOutcome, MemRun};

pub(super) const NOOP: bool = true;

/// Only used where the OS cannot be asked (non-Unix targets).
/// No fork is counted here: [`super::pid`] asks the OS each time.
pub(super) fn forks() -> Option<u64> {
    None
}

pub(super) fn page_size() -> u64 {
    4096
}


pub(super) fn thread_major_faults() -> Option<u64> {
    None
}

pub(super) fn reopen(_file: &File) -> Option<File> {
    None
}

pub(super) fn random_reads(_file: &File) -> bool {
    false
}

pub(super) fn evict(_file: &File, _range: Range<u64>) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "page-cache eviction is not available in this build",
    ))
}

pub(super) fn will_need(_runs: &[MemRun], _mode: AdviceMode) -> AdviceOutcome {
    AdviceOutcome::default()
}

pub(super) fn random(_run: MemRun) -> bool {
    true
}

pub(super) unsafe fn dont_need_shared(_run: MemRun) -> bool {
    false
}

pub(super) fn resident_pages(_run: MemRun, _page: u64, _buf: &mut Vec<u8>) -> Option<u64> {
    None
}

pub(super) fn cachestat(_file: &File, _range: Range<u64>) -> io::Result<u64> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "cachestat is not available in this build",
    ))
}

pub(super) fn read_cached(_file: &File, _offset: u64, _buf: &mut [u8]) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "cache-only reads are not available in this build",
    ))
}

#[cfg(test)]
pub(super) fn dontcache_refused() -> bool {
    true
}

pub(super) fn peek_cached(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    read_cached(file, offset, buf)
}

pub(super) fn owns_or_may_write(_file: &File) -> bool {
    false
}

/// Only used where there are no control groups (non-Unix targets).
pub(super) fn join_cgroup_on_spawn(
    _cmd: &mut std::process::Command,
    _procs: File,
) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "control groups are not available on this platform",
    ))
}

pub(super) fn dio_alignment(_file: &File) -> Option<(u32, u32)> {
    None
}







/// Only used where there is no `mmap` (non-Unix targets).
pub(super) fn map_shared(_file: &File, _len: usize, _write: bool) -> io::Result<*mut u8> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "file mappings are not available on this platform",
    ))
}

/// # Safety
///
/// Nothing to uphold: nothing is ever mapped here.
pub(super) unsafe fn unmap(_run: MemRun) -> io::Result<()> {
    Ok(())
}

pub(super) fn physical_memory() -> u64 {
    0
}

pub(super) fn open_nonblocking(path: &Path, direct: bool) -> io::Result<File> {
    if direct {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "O_DIRECT is not available on this OS",
        ));
    }
    File::open(path)
}

pub(super) fn set_blocking(_file: &File) -> io::Result<()> {
    Ok(())
}

/// Never asked: nothing is shared in this build.
pub(super) fn process_alive(_pid: u32) -> bool {
    true
}
