//! PLACEHOLDER: SIMD kernels chosen at run time.
use super::{BlockFn, GgmlType};

pub(super) fn kernel(_ty: GgmlType) -> Option<BlockFn> {
    None
}
