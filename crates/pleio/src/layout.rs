//! [`Layout`]: where the rows of one 2-D tensor of an open model are
//! (shard, byte offset, row bytes, row count) and their type. It owns no
//! I/O policy; [`crate::Table`] reads through it.

use crate::model::{Model, ModelTensor};
use crate::quant::GgmlType;

/// Name of the per-layer-embedding tensor in `qwen4exp` and `gemma4` files.
pub const PLE_TENSOR: &str = "per_layer_token_embd.weight";

/// Geometry of one 2-D tensor of an open model: `rows` rows of
/// `row_elems` elements, `row_bytes` each, from byte `offset` of one shard.
///
/// Read-only: a layout is only ever derived from a parsed model
/// ([`Layout::of_tensor`]), its sizes checked when it is made, so it cannot
/// describe bytes outside the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    name: String,
    ty: GgmlType,
    row_elems: u64,
    rows: u64,
    row_bytes: u64,
    bytes: u64,
    shard: usize,
    offset: u64,
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
/// [`Layout::rows_from`]; a negative id is out of range.
pub trait RowId: Copy + sealed::Sealed {
    /// The id as a row number, or the negative value.
    fn to_row(self) -> Result<u64, i64>;

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

    fn as_rows(ids: &[u64]) -> Option<&[u64]> {
        Some(ids)
    }
}

impl RowId for u32 {
    #[inline]
    fn to_row(self) -> Result<u64, i64> {
        Ok(u64::from(self))
    }
}

impl RowId for i64 {
    #[inline]
    fn to_row(self) -> Result<u64, i64> {
        u64::try_from(self).map_err(|_| self)
    }
}

impl RowId for i32 {
    #[inline]
    fn to_row(self) -> Result<u64, i64> {
        u64::try_from(self).map_err(|_| i64::from(self))
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
            ty,
            row_elems,
            rows,
            row_bytes,
            bytes,
            shard,
            offset,
        })
    }

    /// The layout of the tensor `name` of `model`.
    pub fn of_tensor(model: &Model, name: &str) -> Result<Layout, TableError> {
        let t = model.tensor(name).ok_or_else(|| TableError::NoSuchTensor {
            name: name.to_string(),
            ple_hint: false,
        })?;
        Layout::of(t)
    }

    /// The layout of the model's per-layer-embedding table
    /// ([`PLE_TENSOR`]).
    pub fn of_ple(model: &Model) -> Result<Layout, TableError> {
        let t = model
            .tensor(PLE_TENSOR)
            .ok_or_else(|| TableError::NoSuchTensor {
                name: PLE_TENSOR.to_string(),
                ple_hint: true,
            })?;
        Layout::of(t)
    }

    /// [`Layout::of_tensor`] when a name is given, else [`Layout::of_ple`]
    /// (for tools whose `--tensor` is optional).
    pub fn of_tensor_or_ple(model: &Model, tensor: Option<&str>) -> Result<Layout, TableError> {
        match tensor {
            Some(name) => Layout::of_tensor(model, name),
            None => Layout::of_ple(model),
        }
    }

    fn of(t: &ModelTensor) -> Result<Layout, TableError> {
        Layout::new(
            &t.info.name,
            t.info.ty,
            &t.info.dims,
            t.shard,
            t.file_offset,
        )
    }

    /// Tensor name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Element type.
    pub fn ty(&self) -> GgmlType {
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

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        self.row_bytes
    }

    /// Index of the shard file holding the tensor.
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// Absolute byte offset of row 0 in that shard file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Total bytes of the table (checked at construction).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Absolute byte range of the table in its shard file.
    pub fn byte_range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.bytes
    }

    /// Absolute byte offset of `row` in its shard file, or an error naming
    /// the row and the limit.
    pub fn row_offset(&self, row: u64) -> Result<u64, TableError> {
        if row < self.rows {
            // row < rows, so row * row_bytes < bytes and offset + bytes fits.
            Ok(self.offset + row * self.row_bytes)
        } else {
            Err(TableError::RowOutOfRange {
                name: self.name.clone(),
                row,
                n_rows: self.rows,
            })
        }
    }

    /// Checks `ids` and widens them to row numbers in `rows` (cleared
    /// first): the first id that is negative or not below [`Layout::rows`]
    /// is an error naming it and the row count.
    pub fn rows_from<I: RowId>(&self, ids: &[I], rows: &mut Vec<u64>) -> Result<(), TableError> {
        rows.clear();
        let n = self.rows;
        // Two tight passes (check, then widen) rather than one branchy one.
        if let Some(&bad) = ids.iter().find(|id| !matches!(id.to_row(), Ok(r) if r < n)) {
            return match bad.to_row() {
                Ok(row) => self.row_offset(row).map(|_| ()),
                Err(id) => Err(TableError::NegativeRow {
                    name: self.name.clone(),
                    id,
                    n_rows: n,
                }),
            };
        }
        rows.extend(ids.iter().map(|id| id.to_row().unwrap_or(0)));
        Ok(())
    }

    /// Checks every id of `rows` before any I/O happens.
    pub fn check_rows(&self, rows: &[u64]) -> Result<(), TableError> {
        match rows.iter().find(|&&r| r >= self.rows) {
            Some(&row) => self.row_offset(row).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Page geometry of the rows for a given page size.
    pub fn page_geometry(&self, page: u64) -> PageGeometry {
        PageGeometry::of(self.offset, self.row_bytes, self.rows, page)
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

#[cfg(test)]
mod tests {
    use super::*;

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
