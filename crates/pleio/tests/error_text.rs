//! Error text: an error whose message already includes its cause does not
//! also return that cause from `source()`, so printing the chain (as
//! `anyhow`'s `{:#}` and most CLIs do) shows each cause once.

use std::error::Error;
use std::io;
use std::path::PathBuf;

use pleio::fetch::GatherError;
use pleio::gguf::GgufError;
use pleio::io::IoError;
use pleio::model::Model;

/// The error and its sources joined by ": ", as `anyhow` prints `{:#}`.
fn chain(e: &dyn Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}

/// Checks `needle` appears exactly once in the printed chain of `e`.
fn once(e: &dyn Error, needle: &str) {
    let text = chain(e);
    assert_eq!(text.matches(needle).count(), 1, "{text}");
}

fn os_error() -> io::Error {
    io::Error::from_raw_os_error(5) // EIO
}

#[test]
fn wrapped_causes_print_once() {
    let eio = os_error().to_string();
    let read = IoError::Read {
        path: PathBuf::from("/x/model.gguf"),
        offset: 4096,
        len: 90,
        error: os_error(),
    };
    once(&read, &eio);
    let open = IoError::Open {
        path: PathBuf::from("/x/model.gguf"),
        error: os_error(),
    };
    once(&open, &eio);
    let gather = GatherError::Read {
        backend: "pread",
        path: PathBuf::from("/x/model.gguf"),
        error: IoError::UnexpectedEof {
            path: PathBuf::from("/x/model.gguf"),
            offset: 100_000,
            end: 1_800_960,
        },
    };
    once(&gather, "ends at offset 100000");
    once(&gather, "/x/model.gguf");
    let gguf = GgufError::InFile {
        path: PathBuf::from("/x/model.gguf"),
        error: Box::new(GgufError::Io {
            path: None,
            error: os_error(),
        }),
    };
    once(&gguf, &eio);
    once(&gguf, "/x/model.gguf");
}

#[test]
fn a_directory_is_named_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let e = Model::open(dir.path()).unwrap_err();
    let text = chain(&e);
    assert!(text.contains("is a directory"), "{text}");
    assert!(!text.contains("No such device"), "{text}");
    once(&e, "is a directory");
}
