//! Status codes and `pleio_last_error`: how a C caller learns what failed.
//!
//! Every function returns a [`pleio_status`] as an `int` (0 = success).
//! A failure also stores one line of text in a thread-local buffer that
//! `pleio_last_error()` returns; it names the path, tensor, row and offset
//! at fault where the engine knows them (see `pleio::Error`).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};

use pleio::ErrorKind;

/// Status codes returned by every `int` function of the C API.
///
/// 0 is success; on any other code `pleio_last_error()` says what failed,
/// and nothing was written to the caller's output.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum pleio_status {
    /// Success.
    PLEIO_OK = 0,
    /// A bad argument: a NULL pointer where one is required, an enum value
    /// out of range, a misaligned or overlapping buffer, a path or name that
    /// is not valid text, a negative token.
    PLEIO_ERR_ARGUMENT = 1,
    /// The file (or a shard of its split set) does not exist.
    PLEIO_ERR_NOT_FOUND = 2,
    /// Reading the file failed; the message names the path and offset.
    PLEIO_ERR_IO = 3,
    /// The file is not a valid GGUF model file.
    PLEIO_ERR_INVALID_FILE = 4,
    /// The file has no such table (no per-layer-embedding tensor, no tensor
    /// of the name given, or not a 2-D table).
    PLEIO_ERR_NO_TABLE = 5,
    /// The table's element type or the model's architecture is not
    /// supported.
    PLEIO_ERR_UNSUPPORTED = 6,
    /// A row id is negative or past the end of the table; the message names
    /// the id and the number of rows.
    PLEIO_ERR_ROW_OUT_OF_RANGE = 7,
    /// The output buffer is smaller than the request needs (`out_bytes`,
    /// `rows_cap`); the message gives both sizes.
    PLEIO_ERR_OUTPUT_SIZE = 8,
    /// The handle is NULL, closed, freed, or not a handle of that kind.
    PLEIO_ERR_HANDLE = 9,
    /// A read backend or the prefetch worker could not be set up.
    PLEIO_ERR_SETUP = 10,
    /// The row-id parameters in the file are missing or wrong, or a token
    /// maps outside the table.
    PLEIO_ERR_ROW_IDS = 11,
    /// A bug in pleio (a Rust panic, caught at the boundary); the message
    /// says where. The handle stays usable.
    PLEIO_ERR_INTERNAL = 12,
    /// `pleio_close_timeout`: calls on the handle were still running when
    /// the timeout passed; the handle stays open (close it again later).
    PLEIO_ERR_BUSY = 13,
    /// A table published to Redis could not be read: a node that does not
    /// answer or refuses the credentials, a timeout, or a row whose check
    /// does not match (the message names the node, key and row).
    PLEIO_ERR_REMOTE = 14,
}

/// Shorter spelling for this crate.
pub use pleio_status as Status;

impl Status {
    /// The engine error kind's code.
    pub fn of_kind(kind: ErrorKind) -> Status {
        match kind {
            ErrorKind::NotFound => Status::PLEIO_ERR_NOT_FOUND,
            ErrorKind::Io => Status::PLEIO_ERR_IO,
            ErrorKind::InvalidFile => Status::PLEIO_ERR_INVALID_FILE,
            ErrorKind::NoTable => Status::PLEIO_ERR_NO_TABLE,
            ErrorKind::Unsupported => Status::PLEIO_ERR_UNSUPPORTED,
            ErrorKind::RowOutOfRange => Status::PLEIO_ERR_ROW_OUT_OF_RANGE,
            ErrorKind::OutputSize => Status::PLEIO_ERR_OUTPUT_SIZE,
            ErrorKind::Setup => Status::PLEIO_ERR_SETUP,
            ErrorKind::RowIds => Status::PLEIO_ERR_ROW_IDS,
            ErrorKind::Remote => Status::PLEIO_ERR_REMOTE,
            // A kind added to the engine later: still an error, never OK.
            _ => Status::PLEIO_ERR_INTERNAL,
        }
    }
}

/// A failed call: its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The code returned.
    pub status: Status,
    /// The text `pleio_last_error` returns.
    pub message: String,
}

impl Failure {
    /// A failure with `status` and `message`.
    pub fn new(status: Status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    /// A bad argument.
    pub fn argument(message: impl Into<String>) -> Failure {
        Failure::new(Status::PLEIO_ERR_ARGUMENT, message)
    }
}

impl From<pleio::Error> for Failure {
    fn from(e: pleio::Error) -> Failure {
        Failure::new(Status::of_kind(e.kind()), e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `f` as this thread's last error and returns its code.
pub fn fail(f: Failure) -> c_int {
    // A NUL inside the message would cut it short in C: show it instead.
    let text = CString::new(f.message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    f.status as c_int
}

/// The code of `r`, recording a failure's message.
pub fn finish(r: Result<(), Failure>) -> c_int {
    match r {
        Ok(()) => Status::PLEIO_OK as c_int,
        Err(f) => fail(f),
    }
}

/// This thread's last error message (empty if no call failed on it yet).
/// The pointer stays valid until the next failing call on this thread or
/// the thread's exit.
pub fn last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text() -> String {
        LAST_ERROR.with(|e| e.borrow().to_string_lossy().into_owned())
    }

    #[test]
    fn messages_are_per_thread_and_nul_safe() {
        assert_eq!(text(), "");
        let code = fail(Failure::argument("bad\0arg"));
        assert_eq!(code, Status::PLEIO_ERR_ARGUMENT as c_int);
        assert_eq!(text(), "bad\\0arg");
        std::thread::spawn(|| assert_eq!(text(), ""))
            .join()
            .unwrap();
        assert_eq!(finish(Ok(())), 0);
        assert_eq!(text(), "bad\\0arg", "success leaves the last error alone");
    }
}
