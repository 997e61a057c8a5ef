//! What `auto` believes is in the page cache: one bit per page of the table,
//! set when pleio itself brought the page in (a buffered read of a cold
//! row, or a page-cache probe), cleared all at once when an eviction is
//! detected or the caller evicted the table ([`Residency::clear`]).
//!
//! A check is a shift and one relaxed atomic load per page a row touches
//! (one, two for a row straddling a page boundary): no system call, so a
//! warm gather costs what a plain mapped gather costs. The bitmap is 1/32768
//! of the table (4 KiB pages): 128 KiB for a 4 GiB table, 1.7 MiB for 54 GiB.
//! It can only be wrong in one direction that matters, "resident" for a page
//! the kernel evicted; `auto` watches its warm path for that (see `auto.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

/// One bit per page of a table's byte range.
pub(super) struct Residency {
    /// log2 of the page size.
    shift: u32,
    /// Absolute page index of the table's first byte.
    first_page: u64,
    /// Absolute byte offset of row 0.
    offset: u64,
    row_bytes: u64,
    words: Box<[AtomicU64]>,
}

impl Residency {
    /// A bitmap for `n_rows` rows of `row_bytes` at `offset`, pages of
    /// `page` bytes (a power of two; anything else is rounded down to one).
    pub(super) fn new(offset: u64, row_bytes: u64, n_rows: u64, page: u64) -> Residency {
        let shift = 63 - page.max(1).leading_zeros();
        let first_page = offset >> shift;
        let end = offset.saturating_add(row_bytes.saturating_mul(n_rows));
        let pages = (end.saturating_sub(1) >> shift).saturating_sub(first_page) + 1;
        let words = (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Residency {
            shift,
            first_page,
            offset,
            row_bytes,
            words,
        }
    }

    /// Bitmap page indices (first, last) of `row` (a valid row id).
    #[inline]
    fn pages(&self, row: u64) -> (u64, u64) {
        let start = self.offset + row * self.row_bytes;
        let last = start + self.row_bytes.max(1) - 1;
        (
            (start >> self.shift) - self.first_page,
            (last >> self.shift) - self.first_page,
        )
    }

    #[inline]
    fn bit(&self, p: u64) -> bool {
        self.words
            .get((p / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (p % 64)) != 0)
    }

    /// True if every page of `row` is believed resident.
    #[inline]
    pub(super) fn is_resident(&self, row: u64) -> bool {
        let (a, b) = self.pages(row);
        self.bit(a) && (a == b || (a + 1..=b).all(|p| self.bit(p)))
    }

    /// Records every page of `row` as resident.
    pub(super) fn mark(&self, row: u64) {
        let (a, b) = self.pages(row);
        for p in a..=b {
            if let Some(w) = self.words.get((p / 64) as usize) {
                w.fetch_or(1 << (p % 64), Ordering::Relaxed);
            }
        }
    }

    /// Forgets everything: every page is believed cold.
    pub(super) fn clear(&self) {
        for w in self.words.iter() {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Pages believed resident.
    pub(super) fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_every_page_a_row_touches() {
        // 100-byte rows from offset 4000 on 4096-byte pages: row 0 straddles
        // pages 0 and 1.
        let r = Residency::new(4000, 100, 1000, 4096);
        assert!(!r.is_resident(0));
        r.mark(0);
        assert!(r.is_resident(0));
        assert_eq!(r.count(), 2);
        // Row 1 lies wholly in page 1 (already marked by row 0).
        assert!(r.is_resident(1));
        // The last row is inside the bitmap.
        r.mark(999);
        assert!(r.is_resident(999));
        assert!(!r.is_resident(500));
        r.clear();
        assert_eq!(r.count(), 0);
        assert!(!r.is_resident(0) && !r.is_resident(999));
    }
}
