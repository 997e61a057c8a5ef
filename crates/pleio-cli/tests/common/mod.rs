//! Helpers shared by the CLI test binaries (each uses a subset).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs the `pleio` binary under test.
pub fn pleio(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pleio"))
        .args(args)
        .output()
        .expect("run pleio")
}

/// Runs `pleio`, requires success, returns stdout.
pub fn ok(args: &[&str]) -> String {
    let out = pleio(args);
    assert!(
        out.status.success(),
        "pleio {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A path as a `&str` argument.
pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A directory on the build's disk (eviction does nothing on tmpfs; see
/// `pleio_testkit::disk_dir!`).
pub fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap()
}
