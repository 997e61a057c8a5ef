//! [`Layout`]: where the rows of a table are and how they are stored. It
//! owns no I/O policy; [`crate::Table`] reads through it.
//!
//! A layout is a row -> extents table: the rows are tiled by [`Shard`]s
//! (runs of consecutive rows), each stored in one to three parts
//! ([`ShardPart`]: a file, the offset of the run's first row, the bytes of
//! that part per row). A GGUF tensor is one shard of one part; a checkpoint
//! table is many shards, in several files, of one part (BF16, FP8 per
//! tensor), two (NVFP4, FP8 per row) or three (MLX 4-bit).
//! [`Layout::extents`] gives the `(file, offset, len)` of each part of a
//! row; a row's *stored bytes* are its parts concatenated in part order.

use std::fmt;
use std::ops::Range;

use crate::error::{Error, ErrorKind};
use crate::quant::encoding::Encoding;
use crate::quant::GgmlType;

/// Name of the per-layer-embedding tensor in `qwen4exp` and `gemma4` files.
pub const PLE_TENSOR: &str = "per_layer_token_embd.weight";

/// How a table's rows are stored: a ggml block type (GGUF) or a checkpoint
/// row encoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowFormat {
    /// A ggml type, decoded exactly as ggml's `to_float`.
    Ggml(GgmlType),
    /// A safetensors checkpoint encoding ([`crate::quant::encoding`]).
    Encoded(Encoding),
}

impl RowFormat {
    /// Its name (`iq4_nl`, `q8_0`, ..., `bf16`, `fp8`, `nvfp4`, `mlx4`).
    pub fn name(&self) -> &'static str {
        match self {
            RowFormat::Ggml(t) => t.name(),
            RowFormat::Encoded(e) => e.name(),
        }
    }

    /// The ggml type, for a GGUF table.
    pub fn ggml(&self) -> Option<GgmlType> {
        match self {
            RowFormat::Ggml(t) => Some(*t),
            RowFormat::Encoded(_) => None,
        }
    }
}

impl fmt::Display for RowFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowFormat::Ggml(t) => t.fmt(f),
            RowFormat::Encoded(e) => f.write_str(e.name()),
        }
    }
}

/// One part of a run of rows: the tensor (or manifest field) holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPart {
    /// The tensor's name (or the manifest's field name).
    pub tensor: String,
    /// Index of the file holding it: a GGUF model's shard, or an index into
    /// the checkpoint table's `files`.
    pub file: usize,
    /// Absolute file offset of the run's first row of this part.
    pub offset: u64,
    /// Bytes of this part per row.
    pub row_bytes: u64,
}

/// A run of consecutive rows stored together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Shard number (`shard_{index}`; 0 for a GGUF tensor).
    pub index: usize,
    /// First global row.
    pub row_start: u64,
    /// Rows in the shard.
    pub rows: u64,
    /// Its parts, in the encoding's part order (every shard has as many).
    pub parts: Vec<ShardPart>,
}

/// Bytes of one file that hold one part of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Extent {
    /// Index of the file (see [`ShardPart::file`]).
    pub file: usize,
    /// Absolute offset in that file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Index of the region holding it, in [`Layout::regions`] order
    /// (`shard * parts + part`).
    pub region: usize,
}

/// The one to three extents of a row, in part order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowExtents {
    parts: [Extent; 3],
    count: usize,
}

impl RowExtents {
    /// The extents, in part order.
    pub fn as_slice(&self) -> &[Extent] {
        &self.parts[..self.count]
    }
}

/// The extents of `row` in `shards` (which tile the rows in order and have
/// at most three parts each), or `None` past the last shard or when an
/// offset would not fit in 64 bits (never, for shards checked against
/// their files).
pub(crate) fn extents_in(shards: &[Shard], row: u64) -> Option<RowExtents> {
    let (i, local) = shard_of(shards, row)?;
    let mut out = RowExtents {
        parts: [Extent::default(); 3],
        count: 0,
    };
    for (k, e) in row_part_extents(shards, i, local).enumerate() {
        out.parts[k] = e?;
        out.count += 1;
    }
    Some(out)
}

/// The extent of each part (at most three) of row `local` of shard `si`
/// (as [`shard_of`] gives them), in part order; `None` for a part whose
/// offset would not fit in 64 bits.
#[inline]
pub(crate) fn row_part_extents(
    shards: &[Shard],
    si: usize,
    local: u64,
) -> impl Iterator<Item = Option<Extent>> + '_ {
    let parts = shards.get(si).map_or(&[][..], |s| &s.parts[..]);
    let base = si * parts.len();
    parts
        .iter()
        .take(3)
        .enumerate()
        .map(move |(k, p)| part_extent(p, local, base + k))
}

/// The shard holding `row` and the row's number in it, or `None` past the
/// last shard.
#[inline]
pub(crate) fn shard_of(shards: &[Shard], row: u64) -> Option<(usize, u64)> {
    // Checkpoint shards are of equal rows but the last: shard `row / rows`
    // is the one, found without a search's unpredictable branches. In 32
    // bits where both fit (every released table): a 64-bit division costs
    // several times as much on x86, and this runs once or twice a row.
    let guess = shards
        .first()
        .and_then(|s| match (u32::try_from(row), u32::try_from(s.rows)) {
            (Ok(r), Ok(n)) => r.checked_div(n).map(u64::from),
            _ => row.checked_div(s.rows),
        })
        .and_then(|g| usize::try_from(g).ok())
        .filter(|&g| {
            shards
                .get(g)
                .is_some_and(|s| s.row_start <= row && row - s.row_start < s.rows)
        });
    let i = match guess {
        Some(g) => g,
        None => shards
            .partition_point(|s| s.row_start <= row)
            .checked_sub(1)?,
    };
    let s = &shards[i];
    let local = row.checked_sub(s.row_start).filter(|&l| l < s.rows)?;
    Some((i, local))
}

/// The extent of part `p` of a shard's row `local` (region `region`), or
/// `None` if an offset would not fit in 64 bits.
#[inline]
fn part_extent(p: &ShardPart, local: u64, region: usize) -> Option<Extent> {
    let offset = local
        .checked_mul(p.row_bytes)
        .and_then(|o| o.checked_add(p.offset))
        .filter(|o| o.checked_add(p.row_bytes).is_some())?;
    Some(Extent {
        file: p.file,
        offset,
        len: p.row_bytes,
        region,
    })
}

/// One part of one row of a batch: its [`Extent`], and `slot`, `i * parts
/// + k` for part `k` of the batch's row `rows[i]` (`parts`: the table's
/// parts per row, [`Layout::parts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchExtent {
    /// Where the part's bytes are.
    pub extent: Extent,
    /// `i * parts + k`: part `k` of the batch's row `rows[i]`.
    pub slot: usize,
}

/// The order of a batch's extents ([`batch_extents`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentOrder {
    /// The batch's rows in the order given, each row's parts in part order.
    Rows,
    /// Ascending by file, then offset (then slot): the order a reader
    /// wants, each file's extents together.
    File,
}

/// The read pipeline's one row -> extents function: the extents of every
/// part of every row of `rows` (of `shards`, which tile the rows in order)
/// into `out` (cleared first; its storage reused), in `order`. Rows of
/// equal shards are found by division, others by a binary search; offsets
/// are checked arithmetic. `Err(row)`: the first row past the last shard,
/// or whose bytes would end past 2^64 (`out` then holds the extents before
/// it, unsorted).
pub fn batch_extents(
    shards: &[Shard],
    rows: &[u64],
    order: ExtentOrder,
    out: &mut Vec<BatchExtent>,
) -> Result<(), u64> {
    out.clear();
    let parts = shards.first().map_or(0, |s| s.parts.len());
    if let [Shard {
        rows: n, parts: p, ..
    }] = shards
    {
        if let [p] = &p[..] {
            // One region (every GGUF table): no shard to find.
            out.reserve(rows.len());
            for (i, &row) in rows.iter().enumerate() {
                let offset = Some(row)
                    .filter(|&r| r < *n)
                    .and_then(|r| r.checked_mul(p.row_bytes))
                    .and_then(|o| o.checked_add(p.offset))
                    .filter(|o| o.checked_add(p.row_bytes).is_some())
                    .ok_or(row)?;
                out.push(BatchExtent {
                    extent: Extent {
                        file: p.file,
                        offset,
                        len: p.row_bytes,
                        region: 0,
                    },
                    slot: i,
                });
            }
            if order == ExtentOrder::File && !rows.is_sorted() {
                out.sort_unstable_by_key(|b| (b.extent.offset, b.slot));
            }
            return Ok(());
        }
    }
    out.reserve(rows.len() * parts);
    for (i, &row) in rows.iter().enumerate() {
        // What extents_in gives, pushed part by part (not built as a
        // RowExtents and copied: a third of a warm checkpoint gather).
        let (si, local) = shard_of(shards, row).ok_or(row)?;
        for (k, e) in row_part_extents(shards, si, local).enumerate() {
            out.push(BatchExtent {
                extent: e.ok_or(row)?,
                slot: i * parts + k,
            });
        }
    }
    if order == ExtentOrder::File {
        // A linear pass when already sorted (one region, ascending rows).
        out.sort_unstable_by_key(|b| (b.extent.file, b.extent.offset, b.slot));
    }
    Ok(())
}

/// The bytes of one file holding one part of one shard's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// The file (see [`ShardPart::file`]).
    pub file: usize,
    /// Its absolute byte range.
    pub range: Range<u64>,
    /// Bytes of the part per row.
    pub row_bytes: u64,
    /// First global row of the shard.
    pub row_start: u64,
    /// Rows of the shard.
    pub rows: u64,
    /// Shard index in [`Layout::shards`].
    pub shard: usize,
    /// Part number.
    pub part: usize,
}

/// Where the rows of a table are: `rows` rows of `row_elems` elements,
/// `row_bytes` stored bytes each, as a row -> extents table (see the
/// module documentation).
///
/// Read-only: a layout is only ever derived from a parsed model
/// (`Layout::of_tensor`) or checkpoint (`Layout::of_checkpoint`), its
/// sizes checked when it is made, so it cannot describe bytes outside the
/// files it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    name: String,
    ty: RowFormat,
    row_elems: u64,
    rows: u64,
    row_bytes: u64,
    bytes: u64,
    shards: Vec<Shard>,
}

/// Errors finding or using a table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// No tensor of that name.
    #[error("no tensor named {name:?}{}", if *.ple_hint { " (no per-layer-embedding table in this file: name one with --tensor)" } else { "" })]
    NoSuchTensor {
        /// The name looked up.
        name: String,
        /// True when the default PLE table was looked up.
        ple_hint: bool,
    },
    /// The tensor is not 2-D (trailing dimensions of 1 are accepted).
    #[error("tensor {name:?} has shape {dims:?}; a table must be 2-D")]
    NotTwoDimensional {
        /// Tensor name.
        name: String,
        /// Its dimensions.
        dims: Vec<u64>,
    },
    /// The row length is not a whole number of blocks of the type.
    #[error("tensor {name:?}: a row of {row_elems} elements is not a whole number of {ty} blocks")]
    PartialBlock {
        /// Tensor name.
        name: String,
        /// Elements per row.
        row_elems: u64,
        /// Element type.
        ty: GgmlType,
    },
    /// The rows hold no bytes (`ne[0]` is 0), so there is nothing to gather.
    #[error("tensor {name:?} has rows of 0 elements; a table needs at least one element a row")]
    EmptyRows {
        /// Tensor name.
        name: String,
    },
    /// The table's size or end offset does not fit in 64 bits.
    #[error(
        "tensor {name:?}: {rows} rows of {row_bytes} bytes at offset {offset} overflow 64 bits"
    )]
    TooLarge {
        /// Tensor name.
        name: String,
        /// Rows.
        rows: u64,
        /// Bytes per row.
        row_bytes: u64,
        /// Offset of row 0.
        offset: u64,
    },
    /// A row id past the end of the table.
    #[error("row {row} is out of range: tensor {name:?} has {n_rows} rows (valid ids 0..={last})", last = .n_rows.saturating_sub(1))]
    RowOutOfRange {
        /// Tensor name.
        name: String,
        /// The row asked for.
        row: u64,
        /// Rows in the table.
        n_rows: u64,
    },
    /// A negative row id (from a caller holding ids in a signed type).
    #[error("row {id} is out of range: tensor {name:?} has {n_rows} rows (valid ids 0..={last})", last = .n_rows.saturating_sub(1))]
    NegativeRow {
        /// Tensor name.
        name: String,
        /// The id given.
        id: i64,
        /// Rows in the table.
        n_rows: u64,
    },
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u64 {}
    impl Sealed for i64 {}
    impl Sealed for u32 {}
    impl Sealed for i32 {}
}

/// An integer type callers hold row ids in: `u64` (the engine's own),
/// `i64`, `u32`, `i32` (C's `int32_t`/`int64_t`, NumPy arrays). See
/// [`Table::rows_from`](crate::Table::rows_from); a negative id is out of
/// range.
pub trait RowId: Copy + sealed::Sealed {
    /// True for the signed types: a widened id with its top bit set was
    /// negative.
    const SIGNED: bool = false;

    /// The id as a row number, or the negative value.
    fn to_row(self) -> Result<u64, i64>;

    /// The id's bits widened to 64 (sign-extended for the signed types, so
    /// a negative id has its top bit set and is never a valid row).
    fn to_bits(self) -> u64;

    /// `ids` as row numbers without a copy, when they already are (`u64`).
    fn as_rows(ids: &[Self]) -> Option<&[u64]> {
        let _ = ids;
        None
    }
}

impl RowId for u64 {
    #[inline]
    fn to_row(self) -> Result<u64, i64> {
        Ok(self)
    }

    #[inline]
    fn to_bits(self) -> u64 {
        self
    }

    fn as_rows(ids: &[u64]) -> Option<&[u64]> {
        Some(ids)
    }
}

impl RowId for u32 {
    #[inline]
    fn to_row(self) -> Result<u64, i64> {
        Ok(u64::from(self))
    }

    #[inline]
    fn to_bits(self) -> u64 {
        u64::from(self)
    }
}

impl RowId for i64 {
    const SIGNED: bool = true;

    #[inline]
    fn to_row(self) -> Result<u64, i64> {
        u64::try_from(self).map_err(|_| self)
    }

    #[inline]
    fn to_bits(self) -> u64 {
        self as u64
    }
}

impl RowId for i32 {
    const SIGNED: bool = true;

    #[inline]
    fn to_row(self) -> Result<u64, i64> {
        u64::try_from(self).map_err(|_| i64::from(self))
    }

    #[inline]
    fn to_bits(self) -> u64 {
        i64::from(self) as u64
    }
}

impl Layout {
    /// Builds a layout from a tensor's name, type, dims and absolute
    /// offset, checking that rows are whole blocks, non-empty, and that the
    /// table's end fits in 64 bits.
    pub(crate) fn new(
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        shard: usize,
        offset: u64,
    ) -> Result<Layout, TableError> {
        let two_d = dims.len() >= 2 && dims[2..].iter().all(|&d| d == 1);
        if !two_d {
            return Err(TableError::NotTwoDimensional {
                name: name.to_string(),
                dims: dims.to_vec(),
            });
        }
        let (row_elems, rows) = (dims[0], dims[1]);
        if row_elems == 0 {
            return Err(TableError::EmptyRows {
                name: name.to_string(),
            });
        }
        let row_bytes = ty.row_bytes(row_elems).ok_or(TableError::PartialBlock {
            name: name.to_string(),
            row_elems,
            ty,
        })?;
        let bytes = rows
            .checked_mul(row_bytes)
            .filter(|b| offset.checked_add(*b).is_some())
            .ok_or(TableError::TooLarge {
                name: name.to_string(),
                rows,
                row_bytes,
                offset,
            })?;
        Ok(Layout {
            name: name.to_string(),
            ty: RowFormat::Ggml(ty),
            row_elems,
            rows,
            row_bytes,
            bytes,
            shards: vec![Shard {
                index: 0,
                row_start: 0,
                rows,
                parts: vec![ShardPart {
                    tensor: name.to_string(),
                    file: shard,
                    offset,
                    row_bytes,
                }],
            }],
        })
    }

    /// A checkpoint-style layout of `shards` (for unit tests).
    #[cfg(test)]
    pub(crate) fn for_test(shards: Vec<Shard>, row_bytes: u64) -> Layout {
        let rows = shards.iter().map(|s| s.rows).sum();
        Layout {
            name: "t".into(),
            ty: RowFormat::Encoded(Encoding::Bf16),
            row_elems: row_bytes / 2,
            rows,
            row_bytes,
            bytes: rows * row_bytes,
            shards,
        }
    }

    /// A layout of checkpoint `shards` (found and checked against their
    /// files by the checkpoint reader) named `name`, of `encoding`.
    pub(crate) fn encoded(
        name: String,
        encoding: Encoding,
        row_elems: u64,
        rows: u64,
        row_bytes: u64,
        shards: Vec<Shard>,
    ) -> Result<Layout, TableError> {
        if row_elems == 0 || row_bytes == 0 {
            return Err(TableError::EmptyRows { name });
        }
        let bytes = rows.checked_mul(row_bytes).ok_or(TableError::TooLarge {
            name: name.clone(),
            rows,
            row_bytes,
            offset: 0,
        })?;
        Ok(Layout {
            name,
            ty: RowFormat::Encoded(encoding),
            row_elems,
            rows,
            row_bytes,
            bytes,
            shards,
        })
    }

    /// Tensor name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the rows are stored (a ggml type, or a checkpoint encoding).
    pub fn ty(&self) -> RowFormat {
        self.ty
    }

    /// Elements per row (`ne[0]`, at least 1).
    pub fn row_elems(&self) -> u64 {
        self.row_elems
    }

    /// Number of rows (`ne[1]`).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Stored bytes per row (all parts together).
    pub fn row_bytes(&self) -> u64 {
        self.row_bytes
    }

    /// Index of the file holding row 0 (for a GGUF table, the shard file
    /// holding the tensor).
    pub fn shard(&self) -> usize {
        self.shards[0].parts[0].file
    }

    /// Absolute byte offset of row 0 (its first part) in that file.
    pub fn offset(&self) -> u64 {
        self.shards[0].parts[0].offset
    }

    /// Total stored bytes of the table (checked at construction).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Absolute byte range of the first region ([`Layout::regions`]): the
    /// whole table when it is one region (every GGUF table, see
    /// [`Layout::single_region`]).
    pub fn byte_range(&self) -> Range<u64> {
        let p = &self.shards[0].parts[0];
        p.offset..p.offset + self.shards[0].rows * p.row_bytes
    }

    /// The shards tiling the rows, in row order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Parts of each row (1 to 3).
    pub fn parts(&self) -> usize {
        self.shards[0].parts.len()
    }

    /// Every region (one part of one shard's rows in one file), shard by
    /// shard, parts in order: region `shard * parts + part`.
    pub fn regions(&self) -> impl Iterator<Item = Region> + '_ {
        self.shards.iter().enumerate().flat_map(|(i, s)| {
            s.parts.iter().enumerate().map(move |(k, p)| Region {
                file: p.file,
                // Checked at construction: inside the file.
                range: p.offset..p.offset + s.rows * p.row_bytes,
                row_bytes: p.row_bytes,
                row_start: s.row_start,
                rows: s.rows,
                shard: i,
                part: k,
            })
        })
    }

    /// The one region, when the table is one run of whole rows in one file
    /// (every GGUF table): row `r` is `row_bytes` bytes at `offset + r *
    /// row_bytes`.
    pub fn single_region(&self) -> Option<Region> {
        (self.shards.len() == 1 && self.shards[0].parts.len() == 1)
            .then(|| self.regions().next())
            .flatten()
    }

    /// The extents of `row`, or an error naming the row and the limit.
    pub fn extents(&self, row: u64) -> Result<RowExtents, TableError> {
        extents_in(&self.shards, row)
            .filter(|_| row < self.rows)
            .ok_or_else(|| TableError::RowOutOfRange {
                name: self.name.clone(),
                row,
                n_rows: self.rows,
            })
    }

    /// The extents of every part of every row of `rows` into `out`, in
    /// `order` ([`batch_extents`]: the read pipeline's one row -> extents
    /// function), or an error naming the first row outside the table.
    pub fn batch_extents(
        &self,
        rows: &[u64],
        order: ExtentOrder,
        out: &mut Vec<BatchExtent>,
    ) -> Result<(), TableError> {
        batch_extents(&self.shards, rows, order, out).map_err(|row| {
            out.clear();
            TableError::RowOutOfRange {
                name: self.name.clone(),
                row,
                n_rows: self.rows,
            }
        })
    }

    /// Absolute byte offset of `row` (its first part) in its file, or an
    /// error naming the row and the limit.
    pub fn row_offset(&self, row: u64) -> Result<u64, TableError> {
        self.extents(row).map(|e| e.as_slice()[0].offset)
    }

    /// Copies `ids` into `rows` (cleared first), widened to row numbers,
    /// then checks the copy: the first id that is negative or not below
    /// [`Layout::rows`] is an error naming it and the row count. Each id is
    /// read exactly once, so ids that another thread changes meanwhile
    /// cannot pass the check and then be read again as something else:
    /// `rows` holds exactly what was checked.
    pub fn rows_from<I: RowId>(&self, ids: &[I], rows: &mut Vec<u64>) -> Result<(), TableError> {
        rows.clear();
        // One copy (a plain widening loop, vectorized), then a check of the
        // copy: never a check of `ids` followed by a second read of them.
        rows.extend(ids.iter().map(|&id| id.to_bits()));
        let n = self.rows;
        if let Some(&bad) = rows.iter().find(|&&r| r >= n) {
            rows.clear();
            let id = bad as i64;
            if I::SIGNED && id < 0 {
                return Err(TableError::NegativeRow {
                    name: self.name.clone(),
                    id,
                    n_rows: n,
                });
            }
            return self.row_offset(bad).map(|_| ());
        }
        Ok(())
    }

    /// Checks every id of `rows` before any I/O happens.
    pub fn check_rows(&self, rows: &[u64]) -> Result<(), TableError> {
        match rows.iter().find(|&&r| r >= self.rows) {
            Some(&row) => self.row_offset(row).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Page geometry of the rows for a given page size. For a table of
    /// several regions, the sums over its regions (`straddling_rows` then
    /// counts row parts, and a page two regions share counts twice).
    pub fn page_geometry(&self, page: u64) -> PageGeometry {
        if let Some(r) = self.single_region() {
            return PageGeometry::of(r.range.start, r.row_bytes, r.rows, page);
        }
        let mut g = PageGeometry {
            page: page.max(1),
            rows_per_page: page.max(1) / self.row_bytes.max(1),
            straddling_rows: 0,
            pages: 0,
        };
        for r in self.regions() {
            let one = PageGeometry::of(r.range.start, r.row_bytes, r.rows, page);
            g.straddling_rows += one.straddling_rows;
            g.pages += one.pages;
        }
        g
    }
}

/// How a table's rows fall on pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageGeometry {
    /// Page size used.
    pub page: u64,
    /// Whole rows per page (`page / row_bytes`; 0 for rows larger than a page).
    pub rows_per_page: u64,
    /// Rows whose bytes span more than one page.
    pub straddling_rows: u64,
    /// Distinct pages the table touches.
    pub pages: u64,
}

impl PageGeometry {
    /// Geometry of `n_rows` rows of `row_bytes` starting at byte `offset`.
    ///
    /// Runs in time proportional to one period of the row/page pattern, not
    /// to the row count.
    pub fn of(offset: u64, row_bytes: u64, n_rows: u64, page: u64) -> PageGeometry {
        let page = page.max(1);
        let straddles = |r: u64| {
            let start = offset + r * row_bytes;
            row_bytes > 0 && start / page != (start + row_bytes - 1) / page
        };
        // Row start positions modulo the page repeat every `period` rows.
        let period = if row_bytes == 0 {
            1
        } else {
            page / gcd(row_bytes % page, page).max(1)
        };
        let per_period = (0..period.min(n_rows)).filter(|&r| straddles(r)).count() as u64;
        let full = n_rows / period;
        let rest = (full * period..n_rows).filter(|&r| straddles(r)).count() as u64;
        let pages = if n_rows == 0 || row_bytes == 0 {
            0
        } else {
            (offset + n_rows * row_bytes - 1) / page - offset / page + 1
        };
        PageGeometry {
            page,
            rows_per_page: page / row_bytes.max(1),
            straddling_rows: full * per_period + rest,
            pages,
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl From<TableError> for Error {
    fn from(e: TableError) -> Error {
        let (kind, row) = match &e {
            TableError::RowOutOfRange { row, .. } => (ErrorKind::RowOutOfRange, Some(*row)),
            TableError::NegativeRow { .. } => (ErrorKind::RowOutOfRange, None),
            _ => (ErrorKind::NoTable, None),
        };
        let tensor = match &e {
            TableError::NoSuchTensor { name, .. }
            | TableError::NotTwoDimensional { name, .. }
            | TableError::PartialBlock { name, .. }
            | TableError::EmptyRows { name }
            | TableError::TooLarge { name, .. }
            | TableError::RowOutOfRange { name, .. }
            | TableError::NegativeRow { name, .. } => Some(name.clone()),
        };
        Error::new(kind, e)
            .at(row, None, None)
            .of_tensor(tensor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_find_the_shard_whether_shards_are_equal_or_not() {
        let shard = |index: usize, row_start: u64, rows: u64| Shard {
            index,
            row_start,
            rows,
            parts: vec![ShardPart {
                tensor: format!("s{index}"),
                file: index % 2,
                offset: 1000 * index as u64,
                row_bytes: 4,
            }],
        };
        let at = |shards: &[Shard], row| extents_in(shards, row).map(|e| e.as_slice()[0]);
        // Equal shards but the last (found by division), and unequal ones
        // (by search): every row in its shard, nothing past the end.
        for shards in [
            vec![shard(0, 0, 10), shard(1, 10, 10), shard(2, 20, 3)],
            vec![shard(0, 0, 10), shard(1, 10, 15), shard(2, 25, 5)],
            vec![shard(0, 0, 2), shard(1, 2, 1), shard(2, 3, 40)],
        ] {
            let end = shards.iter().map(|s| s.row_start + s.rows).max().unwrap();
            for row in 0..end {
                let i = shards
                    .iter()
                    .position(|s| row < s.row_start + s.rows)
                    .unwrap();
                let e = at(&shards, row).unwrap();
                let local = row - shards[i].row_start;
                assert_eq!(
                    (e.file, e.offset, e.region),
                    (i % 2, 1000 * i as u64 + 4 * local, i)
                );
            }
            assert_eq!(at(&shards, end), None);
            assert_eq!(at(&shards, u64::MAX), None);
        }
    }

    #[test]
    fn batch_extents_are_each_rows_extents_in_either_order() {
        let part = |file: usize, offset: u64, row_bytes: u64| ShardPart {
            tensor: String::new(),
            file,
            offset,
            row_bytes,
        };
        let shard = |index: usize, row_start: u64, rows: u64, parts| Shard {
            index,
            row_start,
            rows,
            parts,
        };
        // One region (its own path), equal shards of two parts over two
        // files, and unequal shards of three parts.
        let tables = [
            vec![shard(0, 0, 500, vec![part(3, 64, 90)])],
            vec![
                shard(0, 0, 200, vec![part(0, 0, 80), part(1, 7, 8)]),
                shard(1, 200, 200, vec![part(1, 9000, 80), part(0, 50_000, 8)]),
                shard(2, 400, 100, vec![part(0, 90_000, 80), part(1, 70_000, 8)]),
            ],
            vec![
                shard(0, 0, 7, vec![part(0, 0, 4), part(0, 100, 2), part(1, 0, 1)]),
                shard(1, 7, 493, vec![part(1, 50, 4), part(0, 200, 2), part(1, 9, 1)]),
            ],
        ];
        let rows = [499u64, 3, 3, 0, 250, 7, 6, 201, 199, 400];
        for shards in &tables {
            let parts = shards[0].parts.len();
            let mut want = Vec::new();
            for (i, &r) in rows.iter().enumerate() {
                let e = extents_in(shards, r).unwrap();
                want.extend(e.as_slice().iter().enumerate().map(|(k, &extent)| {
                    BatchExtent {
                        extent,
                        slot: i * parts + k,
                    }
                }));
            }
            let mut got = Vec::new();
            batch_extents(shards, &rows, ExtentOrder::Rows, &mut got).unwrap();
            assert_eq!(got, want);
            batch_extents(shards, &rows, ExtentOrder::File, &mut got).unwrap();
            want.sort_unstable_by_key(|b| (b.extent.file, b.extent.offset, b.slot));
            assert_eq!(got, want);
            // Past the end, or past 2^64: the row is named.
            assert_eq!(batch_extents(shards, &[1, 500, 2], ExtentOrder::File, &mut got), Err(500));
        }
        let huge = [shard(0, 0, u64::MAX, vec![part(0, u64::MAX - 100, 90)])];
        let mut got = Vec::new();
        // Row 0 ends 10 bytes short of 2^64, row 1 past it.
        assert_eq!(batch_extents(&huge, &[0, 1], ExtentOrder::Rows, &mut got), Err(1));
        assert!(extents_in(&huge, 0).is_some());
        assert_eq!(extents_in(&huge, 1), None);
    }

    fn brute(offset: u64, row_bytes: u64, n_rows: u64, page: u64) -> u64 {
        (0..n_rows)
            .filter(|r| {
                let s = offset + r * row_bytes;
                s / page != (s + row_bytes - 1) / page
            })
            .count() as u64
    }

    #[test]
    fn straddling_rows_match_brute_force() {
        for &(off, rb, n, page) in &[
            (0, 90, 10_000, 4096),
            (96, 90, 12_345, 4096),
            (4000, 7392, 300, 4096),
            (32, 170, 5000, 16384),
            (0, 128, 1000, 4096),
            (7, 1, 9000, 4096),
        ] {
            let g = PageGeometry::of(off, rb, n, page);
            assert_eq!(
                g.straddling_rows,
                brute(off, rb, n, page),
                "{off} {rb} {n} {page}"
            );
        }
    }

    #[test]
    fn ple_geometry() {
        let g = PageGeometry::of(0, 90, 320_001_536, 4096);
        assert_eq!(g.rows_per_page, 45);
        // The pattern repeats every 2048 rows (4096 / gcd(90, 4096)).
        let period = brute(0, 90, 2048, 4096);
        assert_eq!(
            g.straddling_rows,
            period * (320_001_536 / 2048) + brute(0, 90, 320_001_536 % 2048, 4096)
        );
        assert_eq!(g.pages, (320_001_536u64 * 90).div_ceil(4096));
    }

    #[test]
    fn rows_are_bounds_checked() {
        let t = Layout::new("t", GgmlType::IQ4_NL, &[160, 10], 0, 64).unwrap();
        assert_eq!(t.row_offset(9), Ok(64 + 9 * 90));
        let e = t.check_rows(&[1, 10, 3]).unwrap_err();
        assert!(e.to_string().contains("row 10"), "{e}");
        assert!(e.to_string().contains("10 rows"), "{e}");
        assert!(Layout::new("t", GgmlType::IQ4_NL, &[160], 0, 0).is_err());
        assert!(Layout::new("t", GgmlType::IQ4_NL, &[100, 3], 0, 0).is_err());
        assert!(Layout::new("t", GgmlType::IQ4_NL, &[160, 3, 1], 0, 0).is_ok());
        assert!(matches!(
            Layout::new("t", GgmlType::F32, &[0, 3], 0, 0),
            Err(TableError::EmptyRows { .. })
        ));
        assert!(matches!(
            Layout::new("t", GgmlType::F32, &[1 << 20, 1 << 50], 0, 0),
            Err(TableError::TooLarge { .. })
        ));
        assert!(matches!(
            Layout::new("t", GgmlType::F32, &[1, 2], 0, u64::MAX - 4),
            Err(TableError::TooLarge { .. })
        ));
    }
}
