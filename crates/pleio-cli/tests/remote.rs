//! The CLI and a table in Redis (a throwaway redis-server on loopback,
//! stopped by pid): `publish` (progress, `--json`, `--in-flight`), then
//! `gather`, `rows` and `inspect` on the address give what they give on
//! the file; the commands that read files refuse an address by name.

mod common;

use common::{disk_dir, ok, p, pleio};
use pleio_testkit::redis::Server;
use std::io::Write;
use std::process::{Command, Stdio};

fn fails(args: &[&str]) -> String {
    let out = pleio(args);
    assert_eq!(out.status.code(), Some(2), "pleio {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

/// `pleio rows TABLE --tokens -` with `tokens` on standard input.
fn rows_of(table: &str, tokens: &str) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pleio"))
        .args(["rows", table, "--tokens", "-", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(tokens.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "pleio rows {table}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn publish_then_gather_rows_and_inspect_the_address() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let server = Server::standalone(None).unwrap();
    let dir = disk_dir();
    let file = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "50000", "--seed", "5", "-o", p(&file)]);
    let url = format!("redis://{}/q", server.addr());

    let j: serde_json::Value = serde_json::from_str(&ok(&[
        "publish",
        p(&file),
        &url,
        "--bucket-bytes",
        "16384",
        "--in-flight",
        "3",
        "--json",
    ]))
    .unwrap();
    let pub_ = &j["published"];
    assert!(pub_["buckets"].as_u64().unwrap() > 200, "{j}");
    assert_eq!(pub_["uploaded"], pub_["buckets"], "{j}");

    // gather: the same bytes from the address as from the file.
    let rows = "0,1,49999,17,17,31337";
    let (a, b) = (dir.path().join("a.f32"), dir.path().join("b.f32"));
    ok(&["gather", p(&file), "--rows", rows, "-o", p(&a)]);
    ok(&["gather", &url, "--rows", rows, "-o", p(&b)]);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

    // rows: the same ids (from the manifest's row-id parameters).
    let tokens = "1 2 3 248044 5 6";
    assert_eq!(rows_of(p(&file), tokens), rows_of(&url, tokens));

    // inspect: the manifest.
    let m: serde_json::Value = serde_json::from_str(&ok(&["inspect", &url, "--json"])).unwrap();
    assert_eq!(m["manifest"]["rows"], 50000, "{m}");
    assert_eq!(m["manifest"]["id"], pub_["id"], "{m}");
    let text = ok(&["inspect", &url]);
    assert!(text.contains("a table published to Redis"), "{text}");
    assert!(text.contains("row format   IQ4_NL"), "{text}");

    // Publishing again uploads nothing.
    let again: serde_json::Value = serde_json::from_str(&ok(&[
        "publish",
        p(&file),
        &url,
        "--bucket-bytes",
        "16384",
        "--json",
    ]))
    .unwrap();
    assert_eq!(again["published"]["uploaded"], 0, "{again}");

    // Refused, by name: file commands on an address, a bad --in-flight,
    // an unpublished name, a node that does not answer.
    for extra in [
        &["bench"][..],
        &["residency"],
        &["warm", "--budget", "1M", "--from-text", "-"],
        &["replay", "--corpus"],
        &["cache-sim", "--corpus"],
    ] {
        let e = fails(&[extra, &[url.as_str()]].concat());
        assert!(e.contains("reads table files"), "{extra:?}: {e}");
    }
    let e = fails(&["publish", p(&file), &url, "--in-flight", "0"]);
    assert!(e.contains("--in-flight 0"), "{e}");
    let e = fails(&["inspect", &format!("redis://{}/nope", server.addr())]);
    assert!(e.contains("pleio publish"), "{e}");
    let e = fails(&[
        "gather",
        "redis://127.0.0.1:1/q?connect_timeout_ms=200&retries=0",
        "--rows",
        "1",
        "-o",
        p(&dir.path().join("c.f32")),
    ]);
    assert!(e.contains("127.0.0.1:1"), "{e}");
    assert!(!dir.path().join("c.f32").exists(), "no partial output");
}

#[test]
fn several_processes_publish_at_once() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let server = Server::standalone(None).unwrap();
    let dir = disk_dir();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    ok(&["synth", "--rows", "40000", "--seed", "8", "-o", p(&a)]);
    ok(&["synth", "--rows", "40000", "--seed", "9", "-o", p(&b)]);
    let url = |name: &str| format!("redis://{}/{name}", server.addr());
    // Three processes at once: two upload the same table under one name
    // (the same buckets, written twice), one another table under another.
    let spawn = |file: &std::path::Path, name: &str| {
        Command::new(env!("CARGO_BIN_EXE_pleio"))
            .args([
                "publish",
                p(file),
                &url(name),
                "--bucket-bytes",
                "8192",
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let children = [spawn(&a, "a"), spawn(&a, "a"), spawn(&b, "b")];
    let mut ids = Vec::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        ids.push(j["published"]["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids[0], ids[1], "one table, one id");
    assert_ne!(ids[0], ids[2]);
    // Each name serves its own file's rows, and the table is whole.
    let rows = "0,1,39999,777,20001,31337";
    for (file, name) in [(&a, "a"), (&b, "b")] {
        let x = dir.path().join(format!("{name}-file.f32"));
        let y = dir.path().join(format!("{name}-redis.f32"));
        ok(&["gather", p(file), "--rows", rows, "-o", p(&x)]);
        ok(&["gather", &url(name), "--rows", rows, "-o", p(&y)]);
        assert_eq!(
            std::fs::read(&x).unwrap(),
            std::fs::read(&y).unwrap(),
            "{name}"
        );
    }
    let again: serde_json::Value = serde_json::from_str(&ok(&[
        "publish",
        p(&a),
        &url("a"),
        "--bucket-bytes",
        "8192",
        "--verify",
        "--json",
    ]))
    .unwrap();
    assert_eq!(again["published"]["uploaded"], 0, "{again}");
    assert_eq!(again["published"]["repaired"], 0, "{again}");
}

#[test]
fn bench_measures_the_redis_copy_beside_the_file_and_checks_its_rows() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let server = Server::standalone(None).unwrap();
    let dir = disk_dir();
    let (a, b, small) = (
        dir.path().join("a.gguf"),
        dir.path().join("b.gguf"),
        dir.path().join("small.gguf"),
    );
    ok(&["synth", "--rows", "30000", "--seed", "3", "-o", p(&a)]);
    ok(&["synth", "--rows", "30000", "--seed", "4", "-o", p(&b)]);
    ok(&["synth", "--rows", "20000", "--seed", "3", "-o", p(&small)]);
    let url = |name: &str| format!("redis://{}/{name}", server.addr());
    for (file, name) in [(&a, "a"), (&b, "b"), (&small, "small")] {
        ok(&["publish", p(file), &url(name)]);
    }
    let bench = |name: &str| {
        pleio(&[
            "bench",
            p(&a),
            "--rows",
            "16,300",
            "--batches",
            "2",
            "--strategies",
            "fault",
            "--redis",
            &url(name),
            "--json",
            "-",
        ])
    };

    let out = bench("a");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["redis"], url("a"), "{j}");
    for arm in ["redis", "redis-shared"] {
        for cold in [true, false] {
            for rows in [16, 300] {
                let a = j["arms"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|x| x["strategy"] == arm && x["cold"] == cold && x["rows"] == rows)
                    .unwrap_or_else(|| panic!("no {arm} arm, cold {cold}, {rows} rows: {j}"));
                assert!(a["samples"].as_u64().unwrap() >= 2, "{a}");
                assert!(a["ratio_to_fault"].as_f64().unwrap() > 0.0, "{a}");
                // Nothing read from this machine's device: rows came from Redis.
                assert_eq!(a["major_faults"], 0.0, "{a}");
            }
        }
    }
    let warm_shared = j["arms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["strategy"] == "redis-shared" && x["cold"] == false && x["rows"] == 300)
        .unwrap();
    assert_eq!(warm_shared["cache_misses"], 0.0, "{warm_shared}");

    // Another table of the same geometry: its rows differ, and the run
    // fails on the first batch, naming the arm.
    let out = bench("b");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("redis") && err.contains("fault"), "{err}");

    // Another geometry: refused before anything is measured.
    let out = bench("small");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("20000 rows") && err.contains("30000 rows") && err.contains("pleio publish"),
        "{err}"
    );
    assert!(
        fails(&["bench", p(&a), "--redis", &url("a"), "--mem-cap", "1G"]).contains("--mem-cap")
    );
}
