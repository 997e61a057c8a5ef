//! Tensor infos: name, type, shape and where the bytes are.

use std::collections::HashSet;

use super::{GgufError, MAX_DIMS};
use crate::quant::GgmlType;

/// One tensor of a GGUF file, validated: its row (`ne[0]`) is a whole
/// number of blocks and its element and byte counts do not overflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Shape `ne`, `dims[0]` the fastest-varying axis.
    pub dims: Vec<u64>,
    /// Offset of the first byte, relative to the data section.
    pub offset: u64,
    /// Elements (product of `dims`; 1 for no dims).
    pub n_elems: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Validates the shape and computes the counts.
    ///
    /// Errors: [`GgufError::TooManyDims`], [`GgufError::RowNotWholeBlocks`],
    /// [`GgufError::DimsOverflow`] (counts must fit `i64`, as in ggml).
    pub fn new(
        name: impl Into<String>,
        ty: GgmlType,
        dims: Vec<u64>,
        offset: u64,
    ) -> Result<TensorInfo, GgufError> {
        let name = name.into();
        if dims.len() > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                n_dims: dims.len() as u64,
                max: MAX_DIMS,
            });
        }
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % ty.block_elems() as u64 != 0 {
            return Err(GgufError::RowNotWholeBlocks {
                tensor: name,
                ne0,
                ty,
                block_elems: ty.block_elems(),
            });
        }
        let limit = i64::MAX as u64;
        // ggml holds every dimension in an int64_t: one above i64::MAX is
        // rejected even when another dimension is 0 (so the product is 0).
        if dims.iter().any(|&d| d > limit) {
            return Err(GgufError::DimsOverflow { tensor: name, dims });
        }
        let counts = (|| {
            let n_rows = dims
                .iter()
                .skip(1)
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
            let n_elems = ne0.checked_mul(n_rows).filter(|&n| n <= limit)?;
            let n_bytes = ty
                .row_bytes(ne0)?
                .checked_mul(n_rows)
                .filter(|&n| n <= limit)?;
            Some((n_elems, n_bytes))
        })();
        let Some((n_elems, n_bytes)) = counts else {
            return Err(GgufError::DimsOverflow { tensor: name, dims });
        };
        Ok(TensorInfo {
            name,
            ty,
            dims,
            offset,
            n_elems,
            n_bytes,
        })
    }

    /// Elements per row (`ne[0]`, 1 for a scalar).
    pub fn row_elems(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        self.ty.row_bytes(self.row_elems()).unwrap_or(0)
    }

    /// Rows: the product of `dims[1..]`.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// Checks that names are unique and that no two tensors share bytes
/// (offsets relative to the data section; empty tensors share nothing).
pub(crate) fn check_disjoint(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut names = HashSet::with_capacity(tensors.len());
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            return Err(GgufError::DuplicateTensor {
                tensor: t.name.clone(),
            });
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    // If any tensor starts inside an earlier one, so does its successor in
    // start order: checking neighbours is enough.
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let a_end = a.offset.saturating_add(a.n_bytes);
        if b.offset < a_end {
            return Err(GgufError::OverlappingTensors {
                first: a.name.clone(),
                first_start: a.offset,
                first_end: a_end,
                second: b.name.clone(),
                second_start: b.offset,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        let t = TensorInfo::new("t", GgmlType::IQ4_NL, vec![160, 1000], 0).unwrap();
        assert_eq!(
            (t.n_elems, t.n_bytes, t.row_bytes(), t.n_rows()),
            (160_000, 90_000, 90, 1000)
        );
        let s = TensorInfo::new("s", GgmlType::F32, vec![], 0).unwrap();
        assert_eq!((s.n_elems, s.n_bytes), (1, 4));
        let z = TensorInfo::new("z", GgmlType::Q8_0, vec![32, 0, 7], 0).unwrap();
        assert_eq!((z.n_elems, z.n_bytes), (0, 0));
    }

    #[test]
    fn rejects_bad_shapes() {
        let e = TensorInfo::new("a", GgmlType::Q4_K, vec![160, 2], 0).unwrap_err();
        assert!(
            matches!(e, GgufError::RowNotWholeBlocks { ne0: 160, .. }),
            "{e}"
        );
        let e = TensorInfo::new("b", GgmlType::F32, vec![1 << 32, 1 << 32], 0).unwrap_err();
        assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
        // Elements fit i64 but bytes do not.
        let e = TensorInfo::new("c", GgmlType::F64, vec![1 << 61], 0).unwrap_err();
        assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
        // A dimension past i64::MAX, hidden by a zero dimension.
        for dims in [vec![0, 1 << 63], vec![1 << 63, 0], vec![32, 0, u64::MAX]] {
            let e = TensorInfo::new("z", GgmlType::F32, dims.clone(), 0).unwrap_err();
            assert!(matches!(e, GgufError::DimsOverflow { .. }), "{dims:?}: {e}");
        }
        let e = TensorInfo::new("d", GgmlType::F32, vec![1; 9], 0).unwrap_err();
        assert!(matches!(e, GgufError::TooManyDims { n_dims: 9, .. }), "{e}");
    }

    #[test]
    fn overlap_and_duplicates() {
        let t = |n: &str, off, len| TensorInfo::new(n, GgmlType::I8, vec![len], off).unwrap();
        let ok = [t("a", 0, 10), t("b", 10, 5), t("e", 3, 0)];
        assert!(check_disjoint(&ok).is_ok());
        let bad = [t("c", 64, 4), t("a", 0, 100), t("e", 50, 0)];
        let e = check_disjoint(&bad).unwrap_err();
        assert!(
            matches!(&e, GgufError::OverlappingTensors { first, second, .. } if first == "a" && second == "c"),
            "{e}"
        );
        let dup = [t("a", 0, 1), t("a", 32, 1)];
        assert!(matches!(
            check_disjoint(&dup),
            Err(GgufError::DuplicateTensor { .. })
        ));
    }
}
