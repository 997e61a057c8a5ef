//! Read-only shared mappings of model files.
//!
//! The only place (with `sys` and the io_uring fetcher) that holds `unsafe`:
//! a [`Mapping`] owns an `mmap` of a whole file and hands out `&[u8]`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// A whole file mapped read-only and shared.
///
/// Reading through the slice faults pages in from the page cache. If the
/// file is truncated by someone else while mapped, reads past the new end
/// raise SIGBUS; pleio checks every range against the length seen at map
/// time and never writes through the mapping.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is read-only and owned; sharing `&[u8]` views of it
// across threads is as safe as sharing any immutable slice.
unsafe impl Send for Mapping {}
// SAFETY: as above, no interior mutability is exposed.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps all of `file` read-only. An empty file gives an empty mapping.
    pub fn map(file: &File) -> io::Result<Mapping> {
        let len = file.metadata()?.len();
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large to map"))?;
        if len == 0 {
            return Ok(Mapping {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
            });
        }
        // SAFETY: a fresh read-only shared mapping of a valid fd; the kernel
        // picks the address, so no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The mapped bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` readable bytes for the life of
        // `self` (or dangling with `len == 0`), and nothing writes to it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Length of the mapping in bytes (the file length at map time).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: unmapping exactly the region this value mapped; no
            // slice borrowed from it can outlive `self`.
            unsafe {
                libc::munmap(self.ptr.cast(), self.len);
            }
        }
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping").field("len", &self.len).finish()
    }
}
