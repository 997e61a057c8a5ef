//! The table file shrinks under a running `pleio gather` or `pleio bench`:
//! the command stops with status 2 and a message naming the file, never
//! dies by `SIGBUS`, and `gather` leaves no output file.
//!
//! The table is evicted first, so the command reads it from the device (a
//! read per row, long enough for the cut to land while it runs), and the
//! run is watched through `/proc/PID/io`: the file is cut as soon as the
//! process has read more than the header (so the model is open and rows
//! are being read).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{disk_dir, ok, p};
use pleio::{sys, Table};

/// Bytes process `pid` has read from storage (`read_bytes` of
/// `/proc/PID/io`; 0 once it is gone).
fn read_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("read_bytes:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Evicts `file` from the page cache (written back first).
fn evict(file: &Path) {
    let f = std::fs::File::open(file).unwrap();
    f.sync_all().unwrap();
    let len = f.metadata().unwrap().len();
    sys::evict(&f, 0..len).unwrap();
}

/// Runs `pleio args`, cuts `file` to `cut` bytes (the table's offset) once
/// the process has read 1 MiB past it, and returns the output and whether
/// the cut came in time (before the process ended).
fn run_and_shrink(args: &[&str], file: &Path, cut: u64) -> (Output, bool) {
    let child = Command::new(env!("CARGO_BIN_EXE_pleio"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut in_time = false;
    while t0.elapsed() < Duration::from_secs(60) {
        if read_bytes(child.id()) > cut + (1 << 20) {
            std::fs::OpenOptions::new()
                .write(true)
                .open(file)
                .unwrap()
                .set_len(cut)
                .unwrap();
            in_time = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let out = child.wait_with_output().unwrap();
    (out, in_time)
}

/// A table on disk, its byte range, and a list of `n` spread row ids.
fn table(dir: &Path, rows: u64, n: u64) -> (std::path::PathBuf, u64, String) {
    let f = dir.join("q.gguf");
    ok(&[
        "synth",
        "--rows",
        &rows.to_string(),
        "--seed",
        "2",
        "-o",
        p(&f),
    ]);
    let t = Table::open(&f).unwrap();
    let step = t.rows() / n;
    let list: Vec<String> = (0..n).map(|k| (k * step + 3).to_string()).collect();
    (f, t.layout().offset(), list.join("\n"))
}

fn check_stopped_cleanly(what: &str, out: &Output, file: &Path) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        None,
        "{what}: killed by a signal: {stderr}"
    );
    assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
    assert!(stderr.contains("pleio: error"), "{what}: {stderr}");
    eprintln!("{what}: {stderr}");
    assert!(stderr.contains(p(file)), "{what}: {stderr}");
}

#[test]
fn gather_on_a_file_shrinking_under_it_exits_2_with_a_message() {
    if !sys::SIGBUS_PROTECTED || sys::NOOP {
        pleio_testkit::skip!("no SIGBUS guard or no eviction in this build");
    }
    let dir = disk_dir();
    let (f, offset, list) = table(dir.path(), 400_000, 20_000);
    let ids = dir.path().join("ids.txt");
    std::fs::write(&ids, list).unwrap();
    let whole = std::fs::read(&f).unwrap();
    for strategy in [
        "fault",
        "advise",
        "auto",
        "pread",
        "uring",
        "uring-direct",
        "pool",
        "cached",
    ] {
        std::fs::write(&f, &whole).unwrap();
        evict(&f);
        let out_file = dir.path().join(format!("{strategy}.f32"));
        let args = [
            "gather",
            p(&f),
            "--rows-file",
            p(&ids),
            "--strategy",
            strategy,
            "-o",
            p(&out_file),
        ];
        let (out, in_time) = run_and_shrink(&args, &f, offset);
        assert!(in_time, "{strategy}: the command read no rows");
        check_stopped_cleanly(strategy, &out, &f);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("offset"), "{strategy}: {stderr}");
        assert!(!out_file.exists(), "{strategy}: output left behind");
    }
}

#[test]
fn bench_on_a_file_shrinking_under_it_exits_2_with_a_message() {
    if !sys::SIGBUS_PROTECTED || sys::NOOP {
        pleio_testkit::skip!("no SIGBUS guard or no eviction in this build");
    }
    let dir = disk_dir();
    let (f, offset, _) = table(dir.path(), 400_000, 1);
    for strategies in ["fault", "advise,auto"] {
        ok(&[
            "synth",
            "--rows",
            "400000",
            "--seed",
            "2",
            "--force",
            "-o",
            p(&f),
        ]);
        evict(&f);
        let args = [
            "bench",
            p(&f),
            "--rows",
            "2000",
            "--batches",
            "3",
            "--strategies",
            strategies,
        ];
        let (out, in_time) = run_and_shrink(&args, &f, offset);
        assert!(in_time, "{strategies}: the command read no rows");
        check_stopped_cleanly(strategies, &out, &f);
    }
}
