//! io_uring is Linux-only: elsewhere the backend always reports itself
//! unavailable, so callers take their fallback.

use std::io;
use std::path::Path;

use super::{IoError, ReadBackend, ReadPlan, ReadStats};

/// Settings of a [`UringBackend`] (see the Linux implementation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringConfig {
    /// Reads in flight at once.
    pub queue_depth: u32,
    /// Read with `O_DIRECT`.
    pub direct: bool,
    /// Spans longer than this are split.
    pub max_read_bytes: usize,
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            queue_depth: 64,
            direct: false,
            max_read_bytes: 1 << 20,
        }
    }
}

/// One read of [`UringBackend::read_into`] (see the Linux implementation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// File offset.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Bytes that must arrive.
    pub want: usize,
}

/// Uninhabited on this OS: [`UringBackend::open`] always fails.
#[derive(Debug)]
pub enum UringBackend {}

fn unavailable() -> IoError {
    IoError::UringUnavailable(io::Error::new(
        io::ErrorKind::Unsupported,
        "io_uring is Linux-only",
    ))
}

impl UringBackend {
    /// Always [`IoError::UringUnavailable`] on this OS.
    pub fn open(_path: &Path, _cfg: UringConfig) -> Result<UringBackend, IoError> {
        Err(unavailable())
    }

    /// Always [`IoError::UringUnavailable`] on this OS.
    pub fn probe() -> Result<(), IoError> {
        Err(unavailable())
    }

    /// Never called (no value exists).
    pub fn config(&self) -> UringConfig {
        match *self {}
    }

    /// Never called (no value exists).
    pub fn alignment(&self) -> usize {
        match *self {}
    }

    /// Never called (no value exists).
    pub fn file(&self) -> &std::fs::File {
        match *self {}
    }

    /// Never called (no value exists).
    pub fn read_into(&self, _extents: &[Extent], _dst: &mut [u8]) -> Result<ReadStats, IoError> {
        match *self {}
    }

    /// Never called (no value exists).
    pub fn file_len(&self) -> Result<u64, IoError> {
        match *self {}
    }

    /// Never called (no value exists).
    pub fn read_extents(&self, _extents: &[std::ops::Range<u64>]) -> Result<ReadStats, IoError> {
        match *self {}
    }

    /// Never called (no value exists).
    pub fn read_extents_of(
        &self,
        _files: &[UringBackend],
        _extents: &[(usize, std::ops::Range<u64>)],
    ) -> Result<ReadStats, IoError> {
        match *self {}
    }
}

impl ReadBackend for UringBackend {
    fn name(&self) -> &'static str {
        match *self {}
    }

    fn read(&self, _plan: &ReadPlan, _staging: &mut [u8]) -> Result<ReadStats, IoError> {
        match *self {}
    }
}
