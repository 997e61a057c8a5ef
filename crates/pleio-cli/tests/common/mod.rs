//! Helpers shared by the CLI test binaries (each uses a subset).
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
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

/// `nobody` on Debian-like systems.
pub const NOBODY: u32 = 65534;

/// Runs `bin args` as `nobody` (supplementary groups dropped), from `/`,
/// with `envs` added to the environment.
pub fn as_nobody(bin: &Path, args: &[&str], envs: &[(&str, &Path)]) -> Output {
    Command::new(bin)
        .args(args)
        .envs(envs.iter().copied())
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir("/")
        .output()
        .unwrap()
}

/// Like [`as_nobody`], requiring success; returns stdout.
pub fn ok_as_nobody(bin: &Path, args: &[&str], envs: &[(&str, &Path)]) -> String {
    let out = as_nobody(bin, args, envs);
    assert!(
        out.status.success(),
        "pleio {args:?} as nobody: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
