//! The machine-wide row cache from the command line: `gather --strategy
//! shared` into a kept segment, `pleio cache ls` / `stats` (text and JSON)
//! showing it and its counters, a second process hitting it, `cache rm`,
//! `warm --strategy shared` leaving a filled segment behind.
//! Segments go to a private directory (`PLEIO_SHM_DIR`).

mod common;

use std::path::Path;
use std::process::Command;

use common::{disk_dir, ok, ok_as_nobody, p};
use serde_json::Value as Json;

/// Runs `pleio` with segments in `shm`, kept when it exits.
fn run(shm: &Path, args: &[&str]) -> String {
    run_keep(shm, true, args)
}

fn run_keep(shm: &Path, keep: bool, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pleio"))
        .args(args)
        .env("PLEIO_SHM_DIR", shm)
        .env("PLEIO_SHARED_KEEP", if keep { "1" } else { "0" })
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pleio {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn cache_ls_stats_and_rm_follow_a_kept_segment() {
    if pleio::sys::NOOP {
        pleio_testkit::skip!("no shared memory in this build");
    }
    let dir = disk_dir();
    let shm = tempfile::tempdir().unwrap();
    let f = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "20000", "--seed", "6", "-o", p(&f)]);
    let f = p(&f);
    let none = run(shm.path(), &["cache", "ls"]);
    assert!(none.contains("no shared row caches"), "{none}");
    let o = dir.path().join("rows.f32");
    let gather = |o: &Path| {
        let out = run(
            shm.path(),
            &[
                "gather",
                f,
                "--rows",
                "5,6,5,9000",
                "--strategy",
                "shared",
                "--budget",
                "1M",
                "--json",
                "--stats",
                "-o",
                p(o),
            ],
        );
        serde_json::from_str::<Json>(&out).unwrap()
    };
    let j = gather(&o);
    assert_eq!(
        (j["cache_hits"].as_u64(), j["cache_misses"].as_u64()),
        (Some(0), Some(3))
    );
    // A second process finds the rows the first read.
    let o2 = dir.path().join("rows2.f32");
    let j = gather(&o2);
    assert_eq!(
        (j["cache_hits"].as_u64(), j["cache_misses"].as_u64()),
        (Some(3), Some(0))
    );
    let via_pread = dir.path().join("pread.f32");
    ok(&[
        "gather",
        f,
        "--rows",
        "5,6,5,9000",
        "--strategy",
        "pread",
        "-o",
        p(&via_pread),
    ]);
    let want = std::fs::read(&via_pread).unwrap();
    assert_eq!(std::fs::read(&o).unwrap(), want);
    assert_eq!(std::fs::read(&o2).unwrap(), want);
    let ls: Json = serde_json::from_str(&run(shm.path(), &["cache", "stats", "--json"])).unwrap();
    let segs = ls["segments"].as_array().unwrap();
    assert_eq!(segs.len(), 1, "{ls}");
    let s = &segs[0];
    assert_eq!(
        (
            s["hits"].as_u64(),
            s["misses"].as_u64(),
            s["resident_rows"].as_u64()
        ),
        (Some(3), Some(3), Some(3))
    );
    assert!(s["bytes"].as_u64().unwrap() <= 1 << 20);
    assert!(s["bytes_read"].as_u64().unwrap() > 0);
    assert!(s["table"].as_str().unwrap().contains("q.gguf"));
    assert_eq!(s["attached_pids"].as_array().unwrap().len(), 0);
    let text = run(shm.path(), &["cache", "stats"]);
    assert!(text.contains("3 hits, 3 misses"), "{text}");
    let rm = run(shm.path(), &["cache", "rm"]);
    assert!(rm.contains("removed"), "{rm}");
    let none = run(shm.path(), &["cache", "ls"]);
    assert!(none.contains("no shared row caches"), "{none}");
    // `warm` fills the machine-wide cache and leaves it for others.
    let ids = dir.path().join("ids.txt");
    std::fs::write(&ids, "7 8 9 7 10 11").unwrap();
    run_keep(
        shm.path(),
        false,
        &[
            "warm",
            f,
            "--strategy",
            "shared",
            "--budget",
            "1M",
            "--from-rows",
            p(&ids),
        ],
    );
    let ls: Json = serde_json::from_str(&run(shm.path(), &["cache", "ls", "--json"])).unwrap();
    let s = &ls["segments"][0];
    assert_eq!(
        (s["resident_rows"].as_u64(), s["misses"].as_u64()),
        (Some(5), Some(5)),
        "{ls}"
    );
    // A segment of another build's layout (its version word rewritten)
    // is listed as unreadable and removed by `cache rm` all the same.
    let seg = s["path"].as_str().unwrap().to_string();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        f.write_all_at(&2u64.to_le_bytes(), 8).unwrap();
    }
    let ls = run(shm.path(), &["cache", "ls"]);
    assert!(
        ls.contains("cannot read") && ls.contains("layout version 2"),
        "{ls}"
    );
    let rm = run(shm.path(), &["cache", "rm"]);
    assert!(
        rm.contains("removed") && rm.contains("(layout version 2)"),
        "{rm}"
    );
    assert!(!Path::new(&seg).exists());
}

#[test]
fn only_readers_of_the_table_may_attach() {
    use std::os::unix::fs::PermissionsExt;
    if pleio::sys::NOOP {
        pleio_testkit::skip!("no shared memory in this build");
    }
    if !nix_root() {
        pleio_testkit::skip!("needs root, to run pleio as nobody");
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_pleio"));
    // Directories nobody may traverse; the segments' directory as /dev/shm
    // is (sticky, world-writable).
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shm = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shm.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let f = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "5000", "--seed", "7", "-o", p(&f)]);
    let f = p(&f);
    let env = [
        ("PLEIO_SHM_DIR", shm.path()),
        ("PLEIO_SHARED_KEEP", Path::new("1")),
    ];
    let gather = [
        "gather",
        f,
        "--rows",
        "1,2,3",
        "--strategy",
        "shared",
        "--json",
        "--stats",
        "-o",
        "/dev/null",
    ];
    // A table others may read: root's segment is theirs to use too.
    std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    run(shm.path(), &gather);
    let j: Json = serde_json::from_str(&ok_as_nobody(bin, &gather, &env)).unwrap();
    assert_eq!(j["cache_hits"].as_u64(), Some(3), "{j}");
    run(shm.path(), &["cache", "rm"]);
    // A table only root may read: root's segment is root's alone.
    std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    run(shm.path(), &gather);
    let ls: Json = serde_json::from_str(&run(shm.path(), &["cache", "ls", "--json"])).unwrap();
    let seg = ls["segments"][0]["path"].as_str().unwrap().to_string();
    let mode = std::fs::metadata(&seg).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = common::as_nobody(bin, &["cache", "stats", &seg], &env);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&seg) && err.contains("ermission denied"),
        "{err}"
    );
    let out = common::as_nobody(bin, &gather, &env);
    assert!(!out.status.success(), "nobody cannot read the table at all");
    run(shm.path(), &["cache", "rm"]);
}

/// True when running as root.
fn nix_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid() == 0
}

/// Runs `pleio args` in the memory cgroup `cap`, segments in `shm` (kept).
fn capped(cap: &pleio_lab::cgroup::MemCap, shm: &Path, args: &[&str]) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pleio"));
    cmd.args(args)
        .env("PLEIO_SHM_DIR", shm)
        .env("PLEIO_SHARED_KEEP", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cap.confine(&mut cmd).unwrap();
    cmd.spawn().unwrap()
}

/// Waits for `c`, requires success, returns its stdout as JSON.
fn json_of(c: std::process::Child, what: &str) -> Json {
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn four_processes_share_one_budget_under_a_memory_cgroup() {
    let dir = disk_dir();
    let f = dir.path().join("q.gguf");
    // 3M rows of 90 B (270 MB): more rows than a 256 MiB segment holds.
    ok(&["synth", "--rows", "3000000", "--seed", "8", "-o", p(&f)]);
    let budget = 256u64 << 20;
    let cap_bytes = budget + 4 * (64 << 20);
    let cap = match pleio_lab::cgroup::MemCap::new(cap_bytes) {
        Ok(c) => c,
        Err(e) => pleio_testkit::skip!("no memory cgroup here: {e}"),
    };
    // The segment on tmpfs, as /dev/shm: its pages are charged to the
    // group of the process that first writes them, and cannot be reclaimed.
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    // Fill the segment to its budget: a profile of more rows than it holds.
    let profile = dir.path().join("rows.txt");
    let ids: Vec<String> = (0..2_400_000u32).map(|r| r.to_string()).collect();
    std::fs::write(&profile, ids.join("\n")).unwrap();
    let warm = capped(
        &cap,
        shm.path(),
        &[
            "warm",
            p(&f),
            "--strategy",
            "shared",
            "--budget",
            "256M",
            "--from-rows",
            p(&profile),
            "--json",
        ],
    );
    let w = json_of(warm, "warm");
    // The corpus's tokens, made outside the group (the tokenizer is the
    // replay tool's memory, not the cache's).
    let rows: Json = serde_json::from_str(&ok(&["rows", p(&f), "--corpus", "--json"])).unwrap();
    let tokens = dir.path().join("tokens.json");
    std::fs::write(
        &tokens,
        serde_json::json!({"tokens": rows["tokens"]}).to_string(),
    )
    .unwrap();
    // Four replays of the corpus at once, in the same group, on one budget.
    let kids: Vec<_> = (0..4)
        .map(|k| {
            let seed = k.to_string();
            capped(
                &cap,
                shm.path(),
                &[
                    "replay",
                    p(&f),
                    "--tokens",
                    p(&tokens),
                    "--strategy",
                    "shared",
                    "--budget",
                    "256M",
                    "--seed",
                    &seed,
                    "--json",
                ],
            )
        })
        .collect();
    let reports: Vec<Json> = kids.into_iter().map(|c| json_of(c, "replay")).collect();
    let usage = cap.usage().unwrap();
    let stats: Json =
        serde_json::from_str(&run(shm.path(), &["cache", "stats", "--json"])).unwrap();
    let seg = &stats["segments"][0];
    let detail = format!("{usage:?}\nwarm: {w}\nsegment: {seg}");
    assert_eq!(stats["segments"].as_array().unwrap().len(), 1, "{detail}");
    // The budget is the machine's, and it was used whole.
    assert!(seg["bytes"].as_u64().unwrap() <= budget, "{detail}");
    let slots = seg["slots"].as_u64().unwrap();
    assert_eq!(
        w["warm_rows"], slots,
        "the warm filled every slot: {detail}"
    );
    // Replays evict and re-fill; a few slots are between rows at the end.
    assert!(
        seg["resident_rows"].as_u64().unwrap() >= slots * 95 / 100,
        "{detail}"
    );
    assert!(seg["evictions"].as_u64().unwrap() > 0, "{detail}");
    assert_eq!(seg["uncached"], 0, "{detail}");
    for r in &reports {
        assert_eq!(r["replays"].as_array().map(Vec::len), Some(1), "{r}");
    }
    // Nothing OOM-killed, and the kernel never had to reclaim for the cap.
    assert_eq!(usage.oom_kills, 0, "{detail}");
    assert_eq!(usage.limit_hits, 0, "{detail}");
    if let Some(peak) = usage.peak_bytes {
        assert!(peak <= cap_bytes, "{detail}");
        eprintln!(
            "peak {peak} B of a {cap_bytes} B cap ({} B over the budget for 4 processes)",
            peak.saturating_sub(budget)
        );
    }
    run(shm.path(), &["cache", "rm"]);
    cap.remove().unwrap();
}
