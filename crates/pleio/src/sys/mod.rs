//! The only place that talks to the OS about memory and files: page size,
//! free space (and, as strategies land, advice, residency and raw reads).
//!
//! One implementation per OS family, chosen at compile time; `stub.rs`
//! compiles everywhere and reports nothing.

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(not(unix), path = "stub.rs")]
mod imp;

use std::path::Path;

/// The OS page size in bytes (4096 on most x86_64 Linux, 16384 on some
/// arm64 machines). Never a literal: always read from the OS.
pub fn page_size() -> u64 {
    imp::page_size()
}

/// Free bytes available to this user on the file system holding `path`,
/// if the OS can tell.
pub fn free_bytes(path: &Path) -> Option<u64> {
    imp::free_bytes(path)
}
