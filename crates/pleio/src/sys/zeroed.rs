//! Fixed-length arrays that start zeroed and cost resident memory only
//! where they are written: the row cache's slot data and bookkeeping.
//!
//! A large array comes from an anonymous private mapping, whose pages the
//! kernel supplies zeroed on first touch and takes back on drop. Not from
//! the heap: there `calloc` may reuse freed memory and clear it page by
//! page (so an untouched cache is resident at once, as happens in a Python
//! host where glibc has raised its mmap threshold), and a freed block may
//! stay in the process. Small arrays, and every array in a build without
//! mappings (`noop-os`, non-Unix), are plain `Vec`s.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Element types for which all-zero bytes are a valid value.
///
/// # Safety
///
/// Implement only for types whose every bit pattern of zeros is a valid
/// value and which have no drop glue.
pub(crate) unsafe trait ZeroValid: Copy + Send + Sync + 'static {}

// SAFETY: integers: zero bytes are the value 0, and they have no drop glue.
unsafe impl ZeroValid for u8 {}
// SAFETY: as above.
unsafe impl ZeroValid for u32 {}
// SAFETY: as above.
unsafe impl ZeroValid for u64 {}

/// Arrays of at least this many bytes are mapped, smaller ones allocated.
/// Low on purpose: a cache of 64 shards has a few hundred KiB of
/// bookkeeping per shard, tens of MiB in all, that must stay untouched too.
const MAP_FROM: usize = 64 << 10;

/// A zeroed array of `len` elements, fixed in length (see the module docs).
pub(crate) struct Zeroed<T: ZeroValid> {
    inner: Inner<T>,
}

enum Inner<T> {
    Heap(Vec<T>),
    Mapped { ptr: NonNull<T>, len: usize, bytes: usize },
}

// SAFETY: a `Mapped` array is owned memory like a `Vec`'s (nothing else
// refers to the mapping), so it moves and shares across threads exactly
// when its elements do.
unsafe impl<T: ZeroValid> Send for Zeroed<T> {}
// SAFETY: as above; shared access only reads through `&[T]`.
unsafe impl<T: ZeroValid> Sync for Zeroed<T> {}

impl<T: ZeroValid> Zeroed<T> {
    /// `len` zeroed elements. Falls back to the heap when the mapping
    /// fails or the build has none.
    pub(crate) fn new(len: usize) -> Zeroed<T> {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        if bytes >= MAP_FROM && !super::NOOP {
            if let Some(ptr) = map_anonymous(bytes) {
                return Zeroed {
                    inner: Inner::Mapped {
                        ptr: ptr.cast(),
                        len,
                        bytes,
                    },
                };
            }
        }
        Zeroed {
            inner: Inner::Heap(vec![zero(); len]),
        }
    }
}

/// The zero value of `T`.
fn zero<T: ZeroValid>() -> T {
    // SAFETY: `ZeroValid` promises all-zero bytes are a valid `T`.
    unsafe { std::mem::zeroed() }
}

#[cfg(unix)]
fn map_anonymous(bytes: usize) -> Option<NonNull<u8>> {
    // SAFETY: a fresh private anonymous mapping; the kernel picks the
    // address, so no existing memory is affected. Its pages read as zero.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        None
    } else {
        NonNull::new(ptr.cast())
    }
}

#[cfg(not(unix))]
fn map_anonymous(_bytes: usize) -> Option<NonNull<u8>> {
    None
}

impl<T: ZeroValid> Drop for Zeroed<T> {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Inner::Mapped { ptr, bytes, .. } = self.inner {
            // SAFETY: the mapping was made by `map_anonymous` with this
            // length and is owned by this array alone; no reference into it
            // outlives `self`. An error would leave the pages mapped (a
            // leak, not unsafety), so it is ignored.
            unsafe {
                libc::munmap(ptr.as_ptr().cast(), bytes);
            }
        }
    }
}

impl<T: ZeroValid> Deref for Zeroed<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.inner {
            Inner::Heap(v) => v,
            // SAFETY: `ptr` points to `len` initialized (zeroed or written)
            // elements, page-aligned, owned by `self` for the borrow.
            Inner::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: ZeroValid> DerefMut for Zeroed<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.inner {
            Inner::Heap(v) => v,
            // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
            Inner::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: ZeroValid> Clone for Zeroed<T> {
    fn clone(&self) -> Zeroed<T> {
        let mut c = Zeroed::new(self.len());
        c.copy_from_slice(self);
        c
    }
}

impl<T: ZeroValid + std::fmt::Debug> std::fmt::Debug for Zeroed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Zeroed({} elements)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_arrays_start_zeroed_and_keep_what_is_written() {
        for len in [0usize, 3, 1000, (MAP_FROM / 8) + 5] {
            let mut a: Zeroed<u64> = Zeroed::new(len);
            assert_eq!(a.len(), len);
            assert!(a.iter().all(|&x| x == 0));
            if len > 0 {
                a[len - 1] = 7;
                a[0] = 9;
                assert_eq!((a[0], a[len - 1]), (9, if len > 1 { 7 } else { 9 }));
            }
        }
    }

    #[test]
    fn a_large_array_is_mapped_not_heap() {
        let a: Zeroed<u8> = Zeroed::new(MAP_FROM);
        assert_eq!(matches!(a.inner, Inner::Mapped { .. }), !super::super::NOOP);
    }
}
