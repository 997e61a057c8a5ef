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

use crate::layout::{row_part_extents, shard_of, Extent, Layout, Shard};

/// One bit per page of each region of a table (see
/// [`Layout::regions`]); a table of one region (every GGUF table) is
/// checked without looking its row up.
pub(super) struct Residency {
    /// log2 of the page size.
    shift: u32,
    /// Absolute page index of the first region's first byte.
    first_page: u64,
    /// Absolute byte offset of row 0 (one region).
    offset: u64,
    row_bytes: u64,
    /// For a table of several regions: its shards and where each region's
    /// bits are.
    regions: Option<Regions>,
    words: Box<[AtomicU64]>,
}

/// The regions of a table of several: its shards, and per region (its
/// first absolute page, its first bit).
struct Regions {
    shards: Box<[Shard]>,
    bits: Box<[(u64, u64)]>,
}

/// Pages from the one holding `start` to the one holding `end - 1`.
fn page_count(start: u64, end: u64, shift: u32) -> u64 {
    (end.saturating_sub(1) >> shift).saturating_sub(start >> shift) + 1
}

impl Residency {
    /// A bitmap for `n_rows` rows of `row_bytes` at `offset`, pages of
    /// `page` bytes (a power of two; anything else is rounded down to one).
    pub(super) fn new(offset: u64, row_bytes: u64, n_rows: u64, page: u64) -> Residency {
        let shift = 63 - page.max(1).leading_zeros();
        let end = offset.saturating_add(row_bytes.saturating_mul(n_rows));
        let pages = page_count(offset, end, shift);
        Residency {
            shift,
            first_page: offset >> shift,
            offset,
            row_bytes,
            regions: None,
            words: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A bitmap for the rows of `layout`.
    pub(super) fn of(layout: &Layout, page: u64) -> Residency {
        if let Some(r) = layout.single_region() {
            return Residency::new(r.range.start, r.row_bytes, r.rows, page);
        }
        let mut res = Residency::new(0, 0, 0, page);
        let mut bits = 0u64;
        let mut regions = Vec::new();
        for r in layout.regions() {
            regions.push((r.range.start >> res.shift, bits));
            bits = bits.saturating_add(page_count(r.range.start, r.range.end, res.shift));
        }
        res.words = (0..bits.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        res.regions = Some(Regions {
            shards: layout.shards().into(),
            bits: regions.into(),
        });
        res
    }

    /// Calls `f` with the bitmap page indices (first, last) of each part of
    /// `row` (a valid row id) until it returns false; the result is the
    /// last call's.
    #[inline]
    fn each_pages(&self, row: u64, mut f: impl FnMut(u64, u64) -> bool) -> bool {
        let Some(Regions { shards, bits }) = &self.regions else {
            let start = self.offset + row * self.row_bytes;
            let last = start + self.row_bytes.max(1) - 1;
            return f(
                (start >> self.shift) - self.first_page,
                (last >> self.shift) - self.first_page,
            );
        };
        let Some((si, local)) = shard_of(shards, row) else {
            return false;
        };
        for e in row_part_extents(shards, si, local) {
            let Some(e) = e else {
                return false;
            };
            let (a, b) = self.extent_pages(bits[e.region], &e);
            if !f(a, b) {
                return false;
            }
        }
        true
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
        self.each_pages(row, |a, b| self.pages_resident(a, b))
    }

    /// True if the bitmap marks every page of `e`, an extent of a table of
    /// several regions (one [`crate::layout::batch_extents`] found), as
    /// resident: [`Residency::is_resident`] for a row whose extents are
    /// known, with no shard to find.
    #[inline]
    pub(super) fn extent_resident(&self, e: &Extent) -> bool {
        let Some(&at) = self.regions.as_ref().and_then(|r| r.bits.get(e.region)) else {
            return false;
        };
        let (a, b) = self.extent_pages(at, e);
        self.pages_resident(a, b)
    }

    /// The bitmap pages (first, last) of `e`, in the region whose first
    /// absolute page and first bit are `(first, bit)`.
    #[inline]
    fn extent_pages(&self, (first, bit): (u64, u64), e: &Extent) -> (u64, u64) {
        let last = e.offset + e.len.max(1) - 1;
        (
            bit + (e.offset >> self.shift) - first,
            bit + (last >> self.shift) - first,
        )
    }

    /// True if bitmap pages `a..=b` are all set.
    #[inline]
    fn pages_resident(&self, a: u64, b: u64) -> bool {
        self.bit(a) && (a == b || (a + 1..=b).all(|p| self.bit(p)))
    }

    /// Records every page of `row` as resident.
    pub(super) fn mark(&self, row: u64) {
        self.each_pages(row, |a, b| {
            for p in a..=b {
                if let Some(w) = self.words.get((p / 64) as usize) {
                    w.fetch_or(1 << (p % 64), Ordering::Relaxed);
                }
            }
            true
        });
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

    #[test]
    fn regions_are_kept_apart() {
        use crate::layout::ShardPart;
        // Two shards of 10 rows, two parts each (40 + 8 bytes), in two files
        // at unaligned offsets; shard 1's parts share offsets with shard 0's
        // but sit in another file.
        let part = |file, offset, row_bytes| ShardPart {
            tensor: String::new(),
            file,
            offset,
            row_bytes,
        };
        let shards = vec![
            Shard {
                index: 0,
                row_start: 0,
                rows: 10,
                parts: vec![part(0, 4090, 40), part(0, 9000, 8)],
            },
            Shard {
                index: 1,
                row_start: 10,
                rows: 10,
                parts: vec![part(1, 4090, 40), part(1, 9000, 8)],
            },
        ];
        let t = Layout::for_test(shards, 48);
        let r = Residency::of(&t, 4096);
        r.mark(0);
        // Row 0: part 0 straddles pages 0-1, part 1 is on page 2 of file 0.
        assert_eq!(r.count(), 3);
        assert!(r.is_resident(0));
        assert!(!r.is_resident(10), "the same offsets in another file");
        r.mark(19);
        // Row 19: pages 1 and 2 of file 1; row 10 also needs its page 0.
        assert_eq!(r.count(), 5);
        assert!(r.is_resident(19));
        assert!(!r.is_resident(10));
        assert!(!r.is_resident(20), "past the last row");
    }
}
