//! Page-cache residency of a table: how much of its byte range is in memory
//! right now, and where.
//!
//! A scan maps the file afresh (read-only, shared, with no advice) and asks
//! the kernel which of its pages are in the page cache, the way the mapping
//! says is true for this process ([`Mapping::page_flags`]): `mincore` for
//! the file's owner, root or a process that may write the file (on a file
//! mapping it reports page-cache residency whether or not this process ever
//! touched the page, and faults nothing in); for anyone else, to whom the
//! kernel reports every page resident, [`READ_PROBES`] pages sampled with
//! cache-only reads, which the kernel answers by reading a missing page in,
//! so the scan waits for those reads and drops the pages again. Either way
//! the scan leaves the cache as it found it; sampled figures are estimates
//! ([`Residency::probed_pages`]).
//!
//! Opening a model does read: parsing the header faults its first pages in,
//! and the kernel reads around them (a whole readahead window, up to
//! megabytes of the table behind the header). [`scan_path`] therefore
//! snapshots every file of the model *before* opening it.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use pleio::gguf::{parse_split_path, split_path, GgufError};
use pleio::layout::{Layout, TableError};
use pleio::map::{Mapping, ResidencyMethod};
use pleio::model::Model;

/// Buckets of the heat strip unless told otherwise.
pub const DEFAULT_BUCKETS: usize = 64;

/// Pages of a file a scan asks when it must read-probe (see the module
/// notes): about 64 per bucket of a table that fills the file, each a
/// one-page device read if the page is not cached (16 MiB at most, dropped
/// again).
pub const READ_PROBES: u64 = 4096;

/// Errors scanning residency.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResidencyError {
    /// Opening or mapping the file failed.
    #[error("mapping {what}: {error}")]
    Io {
        /// The file (path or description).
        what: String,
        /// The OS error.
        error: std::io::Error,
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
    /// This build cannot ask the OS (non-Linux or the `noop-os` feature), or
    /// the kernel refused every way of asking.
    #[error(
        "page-cache residency is not available here (the kernel refused, or not in this build)"
    )]
    Unsupported,
    /// The model could not be opened.
    #[error(transparent)]
    Model(#[from] GgufError),
    /// The table was not found or is not a table.
    #[error(transparent)]
    Table(#[from] TableError),
    /// The checkpoint's table could not be found.
    #[error(transparent)]
    Checkpoint(#[from] pleio::checkpoint::CheckpointError),
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
    /// Of those, pages in the page cache (estimated from the sample when
    /// `probed_pages < pages`).
    pub resident_pages: u64,
    /// Pages whose residency was asked: `pages`, or a sample of them.
    pub probed_pages: u64,
    /// How residency was asked (`mincore`, `cachestat`, `read-probe`, or
    /// `given` for a snapshot built from flags).
    pub method: &'static str,
    /// Fraction of resident pages (0..=1) per bucket: consecutive, equal
    /// (to a page) slices of the range's pages, in file order; of the pages
    /// asked when sampled, NaN for a bucket none of whose pages was asked.
    /// At most the number asked for; fewer when the range has fewer pages.
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

    /// True if every page was asked (the figures are exact).
    pub fn is_exact(&self) -> bool {
        self.probed_pages == self.pages
    }
}

/// Which pages of a whole file were in the page cache at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageSnapshot {
    len: u64,
    page: u64,
    /// One flag per page of the file; `None` for a page not asked.
    resident: Vec<Option<bool>>,
    method: &'static str,
}

impl PageSnapshot {
    /// Snapshots `file` over a fresh mapping: every page, or [`READ_PROBES`]
    /// sampled ones where only read probes tell the truth (see the module
    /// notes). Leaves the page cache as it found it.
    pub fn take(file: &File) -> Result<PageSnapshot, ResidencyError> {
        let map = Mapping::map(file).map_err(|source| ResidencyError::Io {
            what: "the file".to_owned(),
            error: source,
        })?;
        let mut resident = Vec::new();
        if !map.is_empty() {
            map.page_flags(READ_PROBES, &mut resident)
                .ok_or(ResidencyError::Unsupported)?;
        }
        let method = match map.residency_method() {
            // mincore answered for a file cachestat was admitted to.
            ResidencyMethod::Cachestat => "mincore",
            m => m.name(),
        };
        Ok(PageSnapshot {
            len: map.len() as u64,
            page: map.page_size(),
            resident,
            method,
        })
    }

    /// A snapshot from explicit per-page flags (for tests and replays).
    pub fn from_flags(len: u64, page: u64, resident: Vec<bool>) -> Option<PageSnapshot> {
        let page_ok = page > 0 && len.div_ceil(page) == resident.len() as u64;
        page_ok.then_some(PageSnapshot {
            len,
            page,
            resident: resident.into_iter().map(Some).collect(),
            method: "given",
        })
    }

    /// Residency of `range` of the file, in up to `buckets` buckets.
    pub fn residency(
        &self,
        range: Range<u64>,
        buckets: usize,
    ) -> Result<Residency, ResidencyError> {
        if buckets == 0 {
            return Err(ResidencyError::ZeroBuckets);
        }
        if range.start > range.end || range.end > self.len {
            return Err(ResidencyError::OutsideFile {
                start: range.start,
                end: range.end,
                len: self.len,
            });
        }
        let page = self.page;
        let first = range.start / page;
        let pages = if range.is_empty() {
            0
        } else {
            range.end.div_ceil(page) - first
        };
        let flags = &self.resident[first as usize..(first + pages) as usize];
        // (asked, resident) among pages a..b of the range.
        let count = |a: u64, b: u64| {
            flags[a as usize..b as usize]
                .iter()
                .flatten()
                .fold((0u64, 0u64), |(n, r), &f| (n + 1, r + u64::from(f)))
        };

        let n = (buckets as u64).min(pages);
        let mut fractions = Vec::with_capacity(n as usize);
        for i in 0..n {
            // Bucket `i` holds pages `i*P/n .. (i+1)*P/n`: a partition of
            // the pages into slices differing by at most one page.
            let (a, b) = (bucket_start(i, pages, n), bucket_start(i + 1, pages, n));
            let (asked, resident) = count(a, b);
            fractions.push(if asked == 0 {
                f32::NAN
            } else {
                resident as f32 / asked as f32
            });
        }
        let (probed_pages, resident_probed) = count(0, pages);
        let (resident_pages, resident_bytes) = if probed_pages == pages {
            let mut bytes = resident_probed * page;
            if pages > 0 {
                // Clip the first and last pages to the range.
                if flags[0] == Some(true) {
                    bytes -= range.start - first * page;
                }
                if flags[pages as usize - 1] == Some(true) {
                    bytes -= (first + pages) * page - range.end;
                }
            }
            (resident_probed, bytes)
        } else {
            // A sample: scale it to the range.
            let est = |total: u64| {
                (u128::from(resident_probed) * u128::from(total) / u128::from(probed_pages.max(1)))
                    as u64
            };
            (est(pages), est(range.end - range.start))
        };
        Ok(Residency {
            total_bytes: range.end - range.start,
            range,
            page_size: page,
            resident_bytes,
            pages,
            resident_pages,
            probed_pages,
            method: self.method,
            buckets: fractions,
        })
    }
}

/// First page of bucket `i` of `n` over `pages` pages.
fn bucket_start(i: u64, pages: u64, n: u64) -> u64 {
    // u128: `i * pages` overflows u64 for absurd page counts only, but
    // costs nothing to rule out.
    (u128::from(i) * u128::from(pages) / u128::from(n.max(1))) as u64
}

/// Scans `range` of `file` into up to `buckets` buckets (see [`Residency`]).
pub fn scan_file(
    file: &File,
    range: Range<u64>,
    buckets: usize,
) -> Result<Residency, ResidencyError> {
    PageSnapshot::take(file)?.residency(range, buckets)
}

fn open(path: &Path) -> Result<File, ResidencyError> {
    File::open(path).map_err(|source| ResidencyError::Io {
        what: path.display().to_string(),
        error: source,
    })
}

fn in_file(path: &Path) -> impl Fn(ResidencyError) -> ResidencyError + '_ {
    move |e| match e {
        ResidencyError::Io { error: source, .. } => ResidencyError::Io {
            what: path.display().to_string(),
            error: source,
        },
        other => other,
    }
}

/// Scans `table` of an already open `model`: opens the table's shard file
/// afresh by path and scans the table's byte range. Includes whatever
/// opening the model read (see the module notes; [`scan_path`] does not).
pub fn scan_table(
    model: &Model,
    table: &Layout,
    buckets: usize,
) -> Result<Residency, ResidencyError> {
    let path = shard_path(model, table)?;
    scan_file(&open(path)?, table_range(table), buckets).map_err(in_file(path))
}

fn shard_path<'m>(model: &'m Model, table: &Layout) -> Result<&'m Path, ResidencyError> {
    model
        .shards()
        .get(table.shard())
        .map(|s| s.path())
        .ok_or_else(|| ResidencyError::NoShard {
            name: table.name().to_string(),
            shard: table.shard(),
            shards: model.shards().len(),
        })
}

fn table_range(table: &Layout) -> Range<u64> {
    table.offset()..table.offset().saturating_add(table.bytes())
}

/// A table's residency as it was before this call touched anything: takes
/// a snapshot of every file of the model at `path` (each shard of a split
/// set), then opens the model to find `tensor` (the PLE table when `None`)
/// and measures its range in the snapshot of its shard.
///
/// Returns the opened model and the table with the residency.
pub fn scan_path(
    path: &Path,
    tensor: Option<&str>,
    buckets: usize,
) -> Result<(Model, Layout, Residency), ResidencyError> {
    if buckets == 0 {
        return Err(ResidencyError::ZeroBuckets);
    }
    let files: Vec<PathBuf> = match parse_split_path(path) {
        Some(s) => (0..s.count)
            .map(|no| split_path(&s.stem, no, s.count))
            .collect(),
        None => vec![path.to_path_buf()],
    };
    let mut snaps = Vec::with_capacity(files.len());
    for f in &files {
        // A missing sibling (or a directory) is reported by Model::open
        // below, by name.
        let file = File::open(f)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
        if let Some(file) = file {
            snaps.push((f.clone(), PageSnapshot::take(&file).map_err(in_file(f))?));
        }
    }
    let model = Model::open(path)?;
    let table = Layout::of_tensor_or_ple(&model, tensor)?;
    let shard = shard_path(&model, &table)?;
    let snap = match snaps.iter().find(|(p, _)| p == shard) {
        Some((_, s)) => s.clone(),
        // Not a file we could predict (cannot happen for names Model::open
        // derives from the same rule): scan it now.
        None => PageSnapshot::take(&open(shard)?).map_err(in_file(shard))?,
    };
    let r = snap.residency(table_range(&table), buckets)?;
    Ok((model, table, r))
}

/// The residency of a safetensors checkpoint's PLE table: per file the
/// table is in, the range from the table's first to its last byte there
/// ([`crate::bench::table_ranges`]). Finding the table reads headers and
/// the small scale and buffer tensors, not the table's bytes, and maps
/// nothing.
pub fn scan_checkpoint(
    path: &Path,
    buckets: usize,
) -> Result<(Layout, Vec<(PathBuf, Residency)>), ResidencyError> {
    scan_checkpoint_layer(path, None, buckets)
}

/// [`scan_checkpoint`] for the PLE table of decoder layer `layer`
/// (`None`: the lowest PLE layer's).
pub fn scan_checkpoint_layer(
    path: &Path,
    layer: Option<u64>,
    buckets: usize,
) -> Result<(Layout, Vec<(PathBuf, Residency)>), ResidencyError> {
    if buckets == 0 {
        return Err(ResidencyError::ZeroBuckets);
    }
    let ck = pleio::checkpoint::CheckpointTable::open_layer(path, layer)?;
    let table = Layout::of_checkpoint(&ck)?;
    let mut out = Vec::new();
    for (i, range) in crate::bench::table_ranges(&table) {
        let f = &ck.files[i];
        let r = scan_file(&open(f)?, range, buckets).map_err(in_file(f))?;
        out.push((f.clone(), r));
    }
    Ok((table, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pleio::sys;
    use pleio_testkit::skip;
    use std::io::{Read, Seek, SeekFrom, Write};

    /// A file of `pages` pages of data.
    /// A file of `pages` pages on the build's disk (a tmpfs `TMPDIR`
    /// cannot be evicted), or why there is none.
    fn disk_file(pages: u64) -> Result<File, String> {
        let dir = pleio_testkit::disk_dir!();
        pleio_testkit::evictable(&dir)?;
        let mut f = tempfile::tempfile_in(dir).unwrap();
        let page = sys::page_size();
        let data: Vec<u8> = (0..pages * page).map(|i| (i % 253) as u8).collect();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        Ok(f)
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
    fn residency_checks_its_arguments() {
        let snap = PageSnapshot::from_flags(8192, 4096, vec![true, false]).unwrap();
        assert!(matches!(
            snap.residency(0..8193, 4),
            Err(ResidencyError::OutsideFile { .. })
        ));
        assert!(matches!(
            snap.residency(0..8192, 0),
            Err(ResidencyError::ZeroBuckets)
        ));
        let r = snap.residency(5..5, 4).unwrap();
        assert_eq!((r.pages, r.total_bytes, r.buckets.len()), (0, 0, 0));
        assert_eq!(r.fraction(), 0.0);
        assert!(PageSnapshot::from_flags(8193, 4096, vec![true, false]).is_none());
        assert!(PageSnapshot::from_flags(0, 0, vec![]).is_none());
    }

    #[test]
    fn residency_buckets_and_clips_bytes() {
        // 10 pages of 100 bytes, the last one partial (950-byte file);
        // pages 0, 1, 7, 9 resident.
        let flags = [0, 1, 7, 9];
        let resident = (0..10).map(|i| flags.contains(&i)).collect();
        let snap = PageSnapshot::from_flags(950, 100, resident).unwrap();
        // Bytes 50..950: pages 0..10, first page half inside the range.
        let r = snap.residency(50..950, 5).unwrap();
        assert_eq!((r.pages, r.resident_pages), (10, 4));
        assert_eq!(r.resident_bytes, 50 + 100 + 100 + 50);
        assert_eq!(r.buckets, vec![1.0, 0.0, 0.0, 0.5, 0.5]);
        // More buckets than pages: one per page.
        let r = snap.residency(250..450, 64).unwrap();
        assert_eq!(r.buckets, vec![0.0, 0.0, 0.0]);
        assert_eq!(r.resident_bytes, 0);
        // A range inside one resident page.
        let r = snap.residency(120..130, 3).unwrap();
        assert_eq!((r.pages, r.resident_pages, r.resident_bytes), (1, 1, 10));
    }

    /// Evicted: nothing resident, and scanning keeps it so. Read one page in
    /// the middle: exactly that page shows, in the right bucket. Read all:
    /// everything resident, bytes clipped to the range.
    #[test]
    fn scan_sees_eviction_and_reads_and_changes_nothing() {
        if sys::NOOP {
            skip!("the no-op OS layer cannot evict");
        }
        let page = sys::page_size();
        let pages = 64;
        let mut f = match disk_file(pages) {
            Ok(f) => f,
            Err(e) => skip!("{e}"),
        };
        let len = pages * page;
        sys::evict(&f, 0..len).unwrap();
        let cold = scan_file(&f, 0..len, 8).unwrap();
        if cold.resident_pages != 0 {
            // Eviction did not take (e.g. a file system that keeps pages,
            // such as tmpfs): nothing below could be checked.
            skip!("eviction left {} pages", cold.resident_pages);
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
