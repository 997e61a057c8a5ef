//! Fallback OS layer for platforms without the needed calls: reports
//! nothing, so callers take their portable paths.

use std::path::Path;

pub(super) fn page_size() -> u64 {
    4096
}

pub(super) fn free_bytes(_path: &Path) -> Option<u64> {
    None
}
