//! Page-cache residency of a table: how much of its byte range is in memory
//! right now, and where.
//!
//! A scan maps the file afresh (read-only, shared, with no advice) and asks
//! the kernel with `mincore` which of its pages are in the page cache. On a
//! file mapping `mincore` reports page-cache residency whether or not this
//! process ever touched the page, and it never faults anything in: the scan
//! reads no byte of the table and leaves the cache as it found it.

use std::fs::File;
use std::ops::Range;

use crate::map::Mapping;
use crate::model::Model;
use crate::table::Table;

/// Buckets of the heat strip unless told otherwise.
pub const DEFAULT_BUCKETS: usize = 64;

/// Errors scanning residency.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResidencyError {
    /// Opening or mapping the file failed.
    #[error("mapping {what}: {source}")]
    Io {
        /// The file (path or description).
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The byte range does not lie inside the file.
    #[error("byte range {start}..{end} is outside the file of {len} bytes")]
    OutsideFile {
        /// Range start.
        start: u64,
        /// Range end (exclusive).
        end: u64,
        /// File length.
        len: u64,
    },
    /// The table's shard is not part of the model.
    #[error("table {name:?} names shard {shard}, but the model has {shards} shard(s)")]
    NoShard {
        /// Table name.
        name: String,
        /// Shard index asked for.
        shard: usize,
        /// Shards in the model.
        shards: usize,
    },
    /// Zero buckets asked for.
    #[error("the number of buckets must be at least 1")]
    ZeroBuckets,
    /// This build cannot ask the OS (`mincore` unavailable: non-Linux or the
    /// `noop-os` feature), or the kernel refused.
    #[error("page-cache residency is not available here (mincore refused or not in this build)")]
    Unsupported,
}

/// What part of a byte range of a file is in the page cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Residency {
    /// File byte range scanned.
    pub range: Range<u64>,
    /// Page size used.
    pub page_size: u64,
    /// Bytes of the range (`range.end - range.start`).
    pub total_bytes: u64,
    /// Bytes of the range on resident pages (partial first and last pages
    /// counted for their part inside the range).
    pub resident_bytes: u64,
    /// Pages the range touches.
    pub pages: u64,
    /// Of those, pages in the page cache.
    pub resident_pages: u64,
    /// Fraction of resident pages (0..=1) per bucket: consecutive, equal
    /// (to a page) slices of the range's pages, in file order. At most the
    /// number asked for; fewer when the range has fewer pages.
    pub buckets: Vec<f32>,
}

impl Residency {
    /// Resident fraction of the range's pages (0 for an empty range).
    pub fn fraction(&self) -> f64 {
        if self.pages == 0 {
            0.0
        } else {
            self.resident_pages as f64 / self.pages as f64
        }
    }
}

/// Scans `range` of `file` into `buckets` buckets (see [`Residency`]).
///
/// Maps `file` afresh for the scan and unmaps it after; reads no byte of it.
pub fn scan_file(
    file: &File,
    range: Range<u64>,
    buckets: usize,
) -> Result<Residency, ResidencyError> {
    if buckets == 0 {
        return Err(ResidencyError::ZeroBuckets);
    }
    let map = Mapping::map(file).map_err(|source| ResidencyError::Io {
        what: "the file".to_owned(),
        source,
    })?;
    let len = map.len() as u64;
    if range.start > range.end || range.end > len {
        return Err(ResidencyError::OutsideFile {
            start: range.start,
            end: range.end,
            len,
        });
    }
    let page = map.page_size();
    let first = range.start / page;
    let pages = if range.is_empty() {
        0
    } else {
        range.end.div_ceil(page) - first
    };
    // Byte range of pages `a..b` (relative to `first`) inside the file.
    let span = |a: u64, b: u64| (first + a) * page..((first + b) * page).min(len);
    let count = |a: u64, b: u64| {
        map.resident_pages(span(a, b))
            .ok_or(ResidencyError::Unsupported)
    };

    let n = (buckets as u64).min(pages);
    let mut fractions = Vec::with_capacity(n as usize);
    let mut resident_pages = 0;
    for i in 0..n {
        // Bucket `i` holds pages `i*P/n .. (i+1)*P/n`: a partition of the
        // pages into slices differing by at most one page.
        let (a, b) = (bucket_start(i, pages, n), bucket_start(i + 1, pages, n));
        let r = count(a, b)?;
        resident_pages += r;
        fractions.push(r as f32 / (b - a) as f32);
    }
    let mut resident_bytes = resident_pages * page;
    if pages > 0 {
        // Clip the first and last pages to the range (and the file end).
        if count(0, 1)? == 1 {
            resident_bytes -= range.start - first * page;
        }
        if count(pages - 1, pages)? == 1 {
            resident_bytes -= (first + pages) * page - range.end;
        }
    }
    Ok(Residency {
        total_bytes: range.end - range.start,
        range,
        page_size: page,
        resident_bytes,
        pages,
        resident_pages,
        buckets: fractions,
    })
}

/// First page of bucket `i` of `n` over `pages` pages.
fn bucket_start(i: u64, pages: u64, n: u64) -> u64 {
    // u128: `i * pages` overflows u64 for absurd page counts only, but
    // costs nothing to rule out.
    (u128::from(i) * u128::from(pages) / u128::from(n.max(1))) as u64
}

/// Scans `table` of `model`: opens the table's shard file afresh by path and
/// scans the table's byte range (see [`scan_file`]).
pub fn scan_table(
    model: &Model,
    table: &Table,
    buckets: usize,
) -> Result<Residency, ResidencyError> {
    let shard = model
        .shards()
        .get(table.shard)
        .ok_or_else(|| ResidencyError::NoShard {
            name: table.name.clone(),
            shard: table.shard,
            shards: model.shards().len(),
        })?;
    let path = shard.path();
    let file = File::open(path).map_err(|source| ResidencyError::Io {
        what: path.display().to_string(),
        source,
    })?;
    let range = table.offset..table.offset.saturating_add(table.bytes());
    scan_file(&file, range, buckets).map_err(|e| match e {
        ResidencyError::Io { source, .. } => ResidencyError::Io {
            what: path.display().to_string(),
            source,
        },
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys;
    use std::io::{Read, Seek, SeekFrom, Write};

    /// A file of `pages` pages of data.
    fn disk_file(pages: u64) -> File {
        let mut f = tempfile::tempfile().unwrap();
        let page = sys::page_size();
        let data: Vec<u8> = (0..pages * page).map(|i| (i % 253) as u8).collect();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        f
    }

    #[test]
    fn buckets_partition_the_pages() {
        for (pages, n) in [(10, 3), (64, 64), (1000, 64), (7, 1), (5, 5)] {
            let mut total = 0;
            for i in 0..n {
                let (a, b) = (bucket_start(i, pages, n), bucket_start(i + 1, pages, n));
                assert!(b > a, "empty bucket {i} of {n} over {pages}");
                assert!(b - a <= pages.div_ceil(n));
                total += b - a;
            }
            assert_eq!(total, pages);
            assert_eq!(bucket_start(n, pages, n), pages);
        }
    }

    #[test]
    fn scan_checks_its_arguments() {
        let f = disk_file(2);
        let len = 2 * sys::page_size();
        assert!(matches!(
            scan_file(&f, 0..len + 1, 4),
            Err(ResidencyError::OutsideFile { .. })
        ));
        assert!(matches!(
            scan_file(&f, 0..len, 0),
            Err(ResidencyError::ZeroBuckets)
        ));
        if !sys::NOOP {
            let r = scan_file(&f, 5..5, 4).unwrap();
            assert_eq!((r.pages, r.total_bytes, r.buckets.len()), (0, 0, 0));
            assert_eq!(r.fraction(), 0.0);
        }
    }

    /// Evicted: nothing resident, and scanning keeps it so. Read one page in
    /// the middle: exactly that page shows, in the right bucket. Read all:
    /// everything resident, bytes clipped to the range.
    #[test]
    fn scan_sees_eviction_and_reads_and_changes_nothing() {
        if sys::NOOP {
            return;
        }
        let page = sys::page_size();
        let pages = 64;
        let mut f = disk_file(pages);
        let len = pages * page;
        sys::evict(&f, 0..len).unwrap();
        let cold = scan_file(&f, 0..len, 8).unwrap();
        if cold.resident_pages != 0 {
            // Eviction did not take (e.g. a file system that keeps pages,
            // such as tmpfs): nothing below could be checked.
            eprintln!("skipped: eviction left {} pages", cold.resident_pages);
            return;
        }
        assert_eq!(cold.buckets, vec![0.0; 8]);
        assert_eq!(
            scan_file(&f, 0..len, 8).unwrap().resident_pages,
            0,
            "scanning faulted pages in"
        );

        // A byte of page 42, in bucket 5 (pages 40..48): readahead may
        // bring in later pages, never earlier ones.
        let mut one = vec![0u8; 1];
        f.seek(SeekFrom::Start(42 * page + 7)).unwrap();
        f.read_exact(&mut one).unwrap();
        let r = scan_file(&f, 0..len, 8).unwrap();
        assert!(r.resident_pages >= 1, "{r:?}");
        assert!(r.buckets[5] > 0.0, "{r:?}");
        assert!(r.buckets[..5].iter().all(|&b| b == 0.0), "{r:?}");

        f.seek(SeekFrom::Start(0)).unwrap();
        let mut all = Vec::new();
        f.read_to_end(&mut all).unwrap();
        let inner = page / 2..len - page / 2;
        let hot = scan_file(&f, inner.clone(), 8).unwrap();
        assert_eq!(hot.pages, pages);
        assert_eq!(hot.resident_pages, pages);
        assert_eq!(hot.resident_bytes, inner.end - inner.start);
        assert_eq!(hot.buckets, vec![1.0; 8]);
        assert_eq!(hot.fraction(), 1.0);
    }
}
