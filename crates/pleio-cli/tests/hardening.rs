//! The file, config and CLI items of issue 26, each a reproduction that
//! failed before its fix: outputs to pipes and devices, checkpoint outputs
//! that leave nothing behind and replace nothing, a directory lock held by
//! someone else, numbers past what pleio can hold, and a reader that
//! closes standard output early.

mod common;

use common::{ok, p, pleio};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_pleio")
}

/// Runs pleio, requires exit status 2 without a panic, returns stderr.
fn fails(args: &[&str]) -> String {
    let out = pleio(args);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "pleio {args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn synth(dir: &Path, rows: &str) -> PathBuf {
    let f = dir.join(format!("q{rows}.gguf"));
    ok(&["synth", "--rows", rows, "--seed", "3", "-o", p(&f)]);
    f
}

/// Entries of `dir` whose names end with `suffix`.
fn named(dir: &Path, suffix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix))
        .collect()
}

/// Waits (bounded) until `dir` holds an entry ending with `suffix`.
fn wait_for_entry(dir: &Path, suffix: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some(n) = named(dir, suffix).pop() {
            return n;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no {suffix} in {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn gguf_streams_to_stdout_fifos_and_dev_null() {
    // These failed with "Illegal seek" (a pipe) or EINVAL (/dev/null).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let args = ["synth", "--rows", "3000", "--seed", "5", "--sparse"];
    let file = d.join("f.gguf");
    ok(&[&args[..], &["-o", p(&file)]].concat());
    let want = std::fs::read(&file).unwrap();
    let out = Command::new(bin())
        .args(args)
        .args(["-o", "-"])
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == want, "stdout differs from the file");
    ok(&[&args[..], &["-o", "/dev/null"]].concat());
    let fifo = d.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            std::fs::File::open(fifo)
                .unwrap()
                .read_to_end(&mut v)
                .unwrap();
            v
        })
    };
    ok(&[&args[..], &["-o", p(&fifo)]].concat());
    assert!(reader.join().unwrap() == want, "FIFO bytes differ");
}

#[test]
fn checkpoint_synth_replaces_nothing_and_takes_force_for_a_new_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ck = d.join("ck");
    let args = ["synth", "--format", "safetensors", "--rows", "3000"];
    // --force was refused even for a directory that does not exist.
    ok(&[&args[..], &["--force", "-o", p(&ck)]].concat());
    assert!(ck.join("config.json").is_file());
    // An existing directory, empty or not, is never replaced.
    let e = fails(&[&args[..], &["--force", "-o", p(&ck)]].concat());
    assert!(e.contains("exists") && e.contains("never replaces"), "{e}");
    let empty = d.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = fails(&[&args[..], &["-o", p(&empty)]].concat());
    assert!(e.contains("exists"), "{e}");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    assert!(named(d, ".pleio-tmp").is_empty());
}

/// A checkpoint synth big enough to be caught while it runs.
fn slow_checkpoint_synth(dest: &Path) -> std::process::Child {
    Command::new(bin())
        .args(["synth", "--format", "safetensors", "--encoding", "bf16"])
        .args(["--rows", "4M", "-o"])
        .arg(dest)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn checkpoint_synth_leaves_nothing_after_a_signal() {
    // TERM, INT and HUP left `.NAME.partial-PID` directories behind.
    for sig in ["TERM", "INT", "HUP"] {
        let dir = common::disk_dir();
        let dest = dir.path().join("ck");
        let mut child = slow_checkpoint_synth(&dest);
        let temp = wait_for_entry(dir.path(), ".pleio-tmp");
        // The temporary name is not predictable from the pid.
        assert!(!temp.contains(&child.id().to_string()), "{temp}");
        let killed = Command::new("kill")
            .args([format!("-{sig}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = child.wait().unwrap();
        assert!(!status.success(), "{sig}: finished before the signal");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{sig}: left {left:?}");
    }
}

#[test]
fn checkpoint_synth_keeps_a_directory_created_while_it_runs() {
    let dir = common::disk_dir();
    let dest = dir.path().join("ck");
    let child = slow_checkpoint_synth(&dest);
    wait_for_entry(dir.path(), ".pleio-tmp");
    // Another user's empty directory appears at the destination.
    std::fs::create_dir(&dest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("appeared") && err.contains("discarded"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0, "replaced");
    assert!(named(dir.path(), ".pleio-tmp").is_empty());
}

#[test]
fn a_foreign_lock_on_the_output_directory_does_not_hang_writers() {
    // Any user's `flock` on the directory blocked every pleio writer.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // `flock` runs `sleep` as its child: both are put in a group of their
    // own and the group is killed, on a failed assert too (killing only
    // `flock` left the `sleep` holding the test's output pipe for 10
    // minutes).
    let _holder = GroupKill(
        Command::new("flock")
            .arg(d)
            .args(["sleep", "600"])
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    // Let the holder take the lock.
    std::thread::sleep(Duration::from_millis(300));
    let f = synth(d, "2000");
    assert!(f.is_file());
    let ck = d.join("ck");
    ok(&[
        "synth",
        "--format",
        "safetensors",
        "--rows",
        "3000",
        "-o",
        p(&ck),
    ]);
    assert!(ck.join("config.json").is_file());
}

/// A child leading its own process group, whose whole group is killed and
/// reaped on drop.
struct GroupKill(std::process::Child);

impl Drop for GroupKill {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.wait();
    }
}

#[test]
fn corpus_orders_are_bounded_before_building() {
    // --orders 2^64-1 built copies of the corpus until memory ran out.
    let dir = tempfile::tempdir().unwrap();
    let f = synth(dir.path(), "20000");
    for cmd in ["rows", "cache-sim"] {
        let e = fails(&[cmd, p(&f), "--corpus", "--orders", "18446744073709551615"]);
        assert!(
            e.contains("--orders") && e.contains("4194304") && e.contains("at most"),
            "{cmd}: {e}"
        );
    }
    // A few orders still work.
    ok(&["rows", p(&f), "--corpus", "--orders", "3", "--json"]);
}

#[test]
fn a_budget_beyond_memory_is_refused_and_leaves_nothing() {
    // 2^64-1 aborted, leaving a `.pleio-tmp` beside the output.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = synth(d, "20000");
    let out = d.join("rows.bin");
    let e = fails(&[
        "gather",
        p(&f),
        "--rows",
        "1,2,3",
        "--strategy",
        "cached",
        "--budget",
        "18446744073709551615",
        "-o",
        p(&out),
    ]);
    assert!(e.contains("memory"), "{e}");
    assert!(!out.exists());
    assert!(named(d, ".pleio-tmp").is_empty());
}

#[test]
fn a_closed_stdout_ends_quietly() {
    // `pleio inspect q.gguf | head -1` panicked (exit 101).
    let dir = tempfile::tempdir().unwrap();
    let f = synth(dir.path(), "20000");
    let runs: [&[&str]; 3] = [
        &["inspect", p(&f)],
        &["rows", p(&f), "--corpus"],
        &["synth", "--rows", "20000", "-o", "-"],
    ];
    for args in runs {
        let mut child = Command::new(bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read one byte, then close the pipe.
        let mut one = [0u8; 1];
        child.stdout.take().unwrap().read_exact(&mut one).unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            out.status.success() || out.status.code() == Some(141),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
}

#[test]
fn warm_refuses_held_out_ids_past_the_table() {
    // Bad ids were counted as "not covered" without a word.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = synth(d, "20000");
    let profile = d.join("profile.txt");
    std::fs::write(&profile, "1 2 3 2").unwrap();
    let held = d.join("held.txt");
    std::fs::write(&held, "2 99999999 3").unwrap();
    let e = fails(&[
        "warm",
        p(&f),
        "--budget",
        "1M",
        "--from-rows",
        p(&profile),
        "--held-out-rows",
        p(&held),
    ]);
    assert!(e.contains("99999999") && e.contains("held.txt"), "{e}");
    std::fs::write(&held, "2 3").unwrap();
    ok(&[
        "warm",
        p(&f),
        "--budget",
        "1M",
        "--from-rows",
        p(&profile),
        "--held-out-rows",
        p(&held),
    ]);
}

#[test]
fn a_missing_file_is_named_once() {
    // warm, replay and bench printed the path twice ("x: ... on x").
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("nope.gguf");
    let list = dir.path().join("ids.txt");
    std::fs::write(&list, "1").unwrap();
    let f = p(&f);
    let runs: [&[&str]; 4] = [
        &["warm", f, "--budget", "1M", "--from-rows", p(&list)],
        &["replay", f, "--corpus"],
        &["bench", f],
        &["cache-sim", f, "--corpus"],
    ];
    for args in runs {
        let e = fails(args);
        assert_eq!(e.matches("nope.gguf").count(), 1, "{args:?}: {e}");
    }
}

#[test]
fn a_checkpoint_synth_io_error_names_its_cause_once() {
    // Errors that embed their cause and also return it as `source()` were
    // printed with the cause twice ("...: Not a directory (os error 20):
    // Not a directory (os error 20)").
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let file = d.join("plain");
    std::fs::write(&file, "x").unwrap();
    let q = synth(d, "2000");
    let (ck, gguf, rows) = (file.join("ck"), file.join("q.gguf"), file.join("r.bin"));
    let runs: [&[&str]; 3] = [
        &[
            "synth",
            "--format",
            "safetensors",
            "--rows",
            "3000",
            "-o",
            p(&ck),
        ],
        &["synth", "--rows", "2000", "-o", p(&gguf)],
        &["gather", p(&q), "--rows", "1", "-o", p(&rows)],
    ];
    for args in runs {
        let e = fails(args);
        assert_eq!(e.matches("(os error").count(), 1, "{args:?}: {e}");
        assert!(!e.contains("Some("), "{args:?}: {e}");
    }
}
