//! io_uring is Linux-only: elsewhere the ring always reports itself
//! unavailable, so a reader asked for [`Engine::Uring`](super::Engine::Uring)
//! fails to open with [`IoError::UringUnavailable`] and callers take their
//! fallback.

use std::io;

use super::{IoError, Op, ReadStats, Ready};

/// Uninhabited on this OS: [`Ring::new`] always fails.
#[derive(Debug)]
pub(super) enum Ring {}

/// Never made (no ring exists).
pub(super) struct Guard<'a>(&'a Ring);

fn unavailable() -> IoError {
    IoError::UringUnavailable(io::Error::new(
        io::ErrorKind::Unsupported,
        "io_uring is Linux-only",
    ))
}

impl Ring {
    /// Always [`IoError::UringUnavailable`] on this OS.
    pub(super) fn new(_queue_depth: u32) -> Result<Ring, IoError> {
        Err(unavailable())
    }

    /// Always [`IoError::UringUnavailable`] on this OS.
    pub(super) fn probe() -> Result<(), IoError> {
        Err(unavailable())
    }

    /// Never called (no value exists).
    pub(super) fn lock(&self) -> Result<Guard<'_>, IoError> {
        match *self {}
    }

    /// Never called (no value exists).
    pub(super) fn run(
        &self,
        _ring: &mut Guard<'_>,
        _ops: &mut [Op<'_>],
        _ready: Ready<'_>,
    ) -> Result<ReadStats, IoError> {
        match *self {}
    }
}
