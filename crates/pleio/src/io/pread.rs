//! Serial positioned reads on the caller's thread.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use super::{check_staging, read_exact_at, IoError, ReadBackend, ReadPlan, ReadStats};

/// Positioned reads (`pread`) of each span in turn on the caller's thread:
/// queue depth 1, no threads, no mapping. Short reads are continued.
#[derive(Debug, Clone)]
pub struct PreadBackend {
    file: Arc<File>,
}

impl PreadBackend {
    /// Read from an already open file.
    pub fn new(file: Arc<File>) -> PreadBackend {
        PreadBackend { file }
    }

    /// Open `path` read-only.
    pub fn open(path: &Path) -> Result<PreadBackend, IoError> {
        Ok(PreadBackend::new(Arc::new(super::open(path)?)))
    }
}

impl ReadBackend for PreadBackend {
    fn name(&self) -> &'static str {
        "pread"
    }

    fn read(&self, plan: &ReadPlan, staging: &mut [u8]) -> Result<ReadStats, IoError> {
        check_staging(plan, staging)?;
        read_serial(&self.file, plan, staging)
    }
}

/// Read every span of `plan` in order on this thread.
pub(super) fn read_serial(
    file: &File,
    plan: &ReadPlan,
    staging: &mut [u8],
) -> Result<ReadStats, IoError> {
    let mut stats = ReadStats::default();
    for (offset, dst) in super::pieces(plan, staging, usize::MAX) {
        stats.add(read_exact_at(file, dst, offset)?);
    }
    Ok(stats)
}
