//! Test support for pleio's own tests (a dev-dependency, never published).
//!
//! - **Counted skips.** A test that cannot run here (no io_uring, no
//!   eviction on this file system, not root, ...) calls [`skip!`] with its
//!   reason instead of returning early in silence. The macro prints
//!   `SKIPPED: <package> <binary>::<test>: <reason>` on the process's standard error,
//!   past the test harness's capture, so `cargo test` shows it even for a
//!   test that passed, and appends the same line to the file named by
//!   `PLEIO_SKIP_LOG` when that variable is set. `scripts/test.sh` (what
//!   `.ci/run` calls around `cargo test --workspace --release`) sets it and
//!   lists every skip at the end. [`skip_case!`] records a skipped case of a
//!   test that goes on with its other cases.
//! - **Scratch directories on disk.** Eviction from the page cache does
//!   nothing on a tmpfs (the default `/tmp` on Fedora, Arch and Debian 13),
//!   and some kernels refuse `O_DIRECT` there, so such a test must not use
//!   `TMPDIR`. [`disk_dir!`] names a scratch directory in the cargo target
//!   directory, and [`evictable`] says why not when that, too, is a RAM
//!   file system.
//! - **Throwaway Redis servers.** [`redis`] starts standalone servers and
//!   Redis Clusters on 127.0.0.1 from the `redis-server` and `redis-cli` in
//!   `PATH`, each killed on drop; [`redis::unavailable`] says why not.

pub mod redis;

use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable naming the file that skips are appended to.
pub const SKIP_LOG_ENV: &str = "PLEIO_SKIP_LOG";

/// The line a skip prints, without the trailing newline.
pub fn skip_line(package: &str, module: &str, reason: &dyn Display) -> String {
    // libtest names each test's thread after the test's path inside its
    // binary ("module::test"); the crate segment of the caller's module
    // path names the binary (the library or the integration test file).
    let binary = module.split("::").next().unwrap_or(module);
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let reason = reason.to_string().replace('\n', " ");
    format!("SKIPPED: {package} {binary}::{test}: {reason}")
}

/// Records a skip: prints the `SKIPPED:` line on standard error (written to
/// the stream itself, which the test harness does not capture) and appends
/// it to `$PLEIO_SKIP_LOG` when set. Use [`skip!`] or [`skip_case!`].
pub fn record(package: &str, module: &str, reason: &dyn Display) {
    let line = skip_line(package, module, reason);
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        // One write per line, in append mode: lines of tests running in
        // parallel (threads or processes) do not interleave.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = appended {
            let _ = writeln!(err, "pleio-testkit: cannot append to {path:?}: {e}");
        }
    }
}

/// Skips the rest of the running test: records `format!(...)` as the
/// reason (see [`record`]) and returns from the test function.
#[macro_export]
macro_rules! skip {
    ($($reason:tt)+) => {{
        $crate::record(env!("CARGO_PKG_NAME"), module_path!(), &format_args!($($reason)+));
        return;
    }};
}

/// Records a skipped case of a test that goes on with its other cases
/// (e.g. one I/O backend of several): like [`skip!`] without the return.
#[macro_export]
macro_rules! skip_case {
    ($($reason:tt)+) => {
        $crate::record(env!("CARGO_PKG_NAME"), module_path!(), &format_args!($($reason)+))
    };
}

/// A directory for scratch files on a disk, as a `PathBuf`:
/// `CARGO_TARGET_TMPDIR` in integration tests, a directory beside the test
/// executable in unit tests (both in the cargo target directory, which
/// unlike `TMPDIR` is rarely a tmpfs), or `/var/tmp` when the target
/// directory is on a RAM file system and `/var/tmp` is not. Tests make their
/// own temporary files in it; those that evict check it with [`evictable`]
/// (or notice that eviction did not take) and skip with the reason.
#[macro_export]
macro_rules! disk_dir {
    () => {
        $crate::disk_dir_in(option_env!("CARGO_TARGET_TMPDIR"))
    };
}

/// [`disk_dir!`] with the target's scratch directory given (`None` in unit
/// tests, where cargo sets none: the test executable's directory then).
/// Panics if the directory cannot be made (the target directory is not
/// writable: no test could run).
pub fn disk_dir_in(target_tmpdir: Option<&str>) -> PathBuf {
    let base = match target_tmpdir {
        Some(d) => PathBuf::from(d),
        None => std::env::current_exe()
            .expect("the test executable's path")
            .parent()
            .expect("the test executable's directory")
            .join("pleio-testkit-tmp"),
    };
    if let Err(e) = std::fs::create_dir_all(&base) {
        panic!("cannot create {}: {e}", base.display());
    }
    let var_tmp = Path::new("/var/tmp");
    if evictable(&base).is_err() && var_tmp.is_dir() && evictable(var_tmp).is_ok() {
        return var_tmp.to_path_buf();
    }
    base
}

/// `Ok` if files under `dir` can be evicted from the page cache (a disk
/// file system), `Err` naming the RAM file system otherwise.
pub fn evictable(dir: &Path) -> Result<(), String> {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    let st = rustix::fs::statfs(dir).map_err(|e| format!("statfs {}: {e}", dir.display()))?;
    // f_type's integer type differs between targets.
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    let kind = st.f_type as u64;
    match kind {
        TMPFS_MAGIC => Err(format!(
            "{} is on a tmpfs, whose pages cannot be evicted",
            dir.display()
        )),
        RAMFS_MAGIC => Err(format!(
            "{} is on a ramfs, whose pages cannot be evicted",
            dir.display()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_package_binary_test_and_reason() {
        let line = skip_line("pleio", "lookahead::inner", &"no io_uring\nhere");
        assert_eq!(
            line,
            "SKIPPED: pleio lookahead::tests::the_line_names_package_binary_test_and_reason: no io_uring here"
        );
    }

    #[test]
    fn a_skip_returns_and_is_appended_to_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips");
        // The variable is process-wide: only this test sets it (and so its
        // lines stay out of the suite's own log).
        std::env::set_var(SKIP_LOG_ENV, &log);
        fn skipper(skip: bool, reached: &std::cell::Cell<bool>) {
            if skip {
                skip!("self-test of skip! {}, not a skip", 42);
            }
            reached.set(true);
        }
        let reached = std::cell::Cell::new(false);
        skipper(true, &reached);
        assert!(!reached.get(), "skip! did not return");
        skipper(false, &reached);
        assert!(reached.get());
        skip_case!("self-test of skip_case!, not a skip");
        std::env::remove_var(SKIP_LOG_ENV);
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let me = "SKIPPED: pleio-testkit pleio_testkit::tests::a_skip_returns_and_is_appended_to_the_log: ";
        assert_eq!(lines[0], format!("{me}self-test of skip! 42, not a skip"));
        assert_eq!(lines[1], format!("{me}self-test of skip_case!, not a skip"));
    }

    #[test]
    fn ram_file_systems_are_not_evictable() {
        // Every mount point whose visible (last) mount /proc/mounts lists
        // as a tmpfs is refused, naming it; every ext4 one is accepted.
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut top = std::collections::BTreeMap::new();
        for l in mounts.lines() {
            let f: Vec<_> = l.split(' ').collect();
            if f.len() > 2 {
                top.insert(f[1].to_string(), f[2].to_string());
            }
        }
        for (dir, kind) in &top {
            if rustix::fs::statfs(dir.as_str()).is_err() {
                continue;
            }
            match kind.as_str() {
                "tmpfs" => {
                    let e = evictable(Path::new(dir)).unwrap_err();
                    assert!(e.contains("tmpfs") && e.contains(dir.as_str()), "{e}");
                }
                "ext4" | "xfs" | "btrfs" => evictable(Path::new(dir)).unwrap(),
                _ => {}
            }
        }
        let d = disk_dir_in(None);
        assert!(d.is_dir(), "{}", d.display());
        assert!(
            d.ends_with("pleio-testkit-tmp")
                || (d == Path::new("/var/tmp") && evictable(&d).is_ok()),
            "{}",
            d.display()
        );
        assert_eq!(disk_dir!(), d);
    }
}
