//! The CLI and a table in Redis (a throwaway redis-server on loopback,
//! stopped by pid): `publish` (progress, `--json`, `--in-flight`), then
//! `gather`, `rows` and `inspect` on the address give what they give on
//! the file, also from processes sharing one machine-wide cache in front
//! of it; the commands that read files refuse an address by name.

mod common;

use common::{disk_dir, ok, p, pleio};
use pleio_testkit::redis::Server;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

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

/// `pleio publish FILE URL --json EXTRA...` (with `--bucket-bytes 8192`
/// unless EXTRA names its own), running.
fn spawn_publish(file: &Path, url: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_pleio"))
        .args(["publish", p(file), url, "--json"])
        .args(if extra.contains(&"--bucket-bytes") {
            &[][..]
        } else {
            &["--bucket-bytes", "8192"][..]
        })
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The `published` object of a `spawn_publish` that must succeed.
fn published(c: Child) -> serde_json::Value {
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["published"].clone()
}

/// The same f32 rows gathered from `file` and from `url` (files in `dir`).
fn same_rows(dir: &Path, file: &Path, url: &str, rows: &str) {
    let tag = url.rsplit('/').next().unwrap();
    let x = dir.join(format!("{tag}-file.f32"));
    let y = dir.join(format!("{tag}-redis.f32"));
    ok(&["gather", p(file), "--rows", rows, "-o", p(&x)]);
    ok(&["gather", url, "--rows", rows, "-o", p(&y)]);
    assert_eq!(
        std::fs::read(&x).unwrap(),
        std::fs::read(&y).unwrap(),
        "{url}"
    );
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
    let children = [
        spawn_publish(&a, &url("a"), &[]),
        spawn_publish(&a, &url("a"), &[]),
        spawn_publish(&b, &url("b"), &[]),
    ];
    let ids: Vec<String> = children
        .into_iter()
        .map(|c| published(c)["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids[0], ids[1], "one table, one id");
    assert_ne!(ids[0], ids[2]);
    // Each name serves its own file's rows, and the table is whole.
    let rows = "0,1,39999,777,20001,31337";
    same_rows(dir.path(), &a, &url("a"), rows);
    same_rows(dir.path(), &b, &url("b"), rows);
    let again = published(spawn_publish(&a, &url("a"), &["--verify"]));
    assert_eq!(again["uploaded"], 0, "{again}");
    assert_eq!(again["repaired"], 0, "{again}");
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

#[test]
fn parts_publish_one_table_together_and_only_the_whole_is_visible() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let server = Server::standalone(None).unwrap();
    let dir = disk_dir();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    ok(&["synth", "--rows", "60000", "--seed", "21", "-o", p(&a)]);
    ok(&["synth", "--rows", "60000", "--seed", "22", "-o", p(&b)]);
    let url = |name: &str| format!("redis://{}/{name}", server.addr());
    let part = |file: &Path, name: &str, k_of_n: &str| {
        spawn_publish(file, &url(name), &["--part", k_of_n])
    };
    let rows = "0,1,59999,777,20001,31337,40000";

    // One part after another: the name appears only with the last part.
    let first = published(part(&a, "seq", "0/2"));
    assert_eq!(first["complete"], false, "{first}");
    assert_eq!(first["part"], "0/2", "{first}");
    let all = first["buckets"].as_u64().unwrap();
    let mine = first["part_buckets"].as_u64().unwrap();
    assert_eq!(first["missing"].as_u64().unwrap(), all - mine, "{first}");
    assert_eq!(first["uploaded"].as_u64().unwrap(), mine, "{first}");
    let err = fails(&[
        "gather",
        &url("seq"),
        "--rows",
        "1",
        "-o",
        p(&dir.path().join("n.f32")),
    ]);
    assert!(err.contains("no table published"), "{err}");
    let last = published(part(&a, "seq", "1/2"));
    assert_eq!(last["complete"], true, "{last}");
    assert_eq!(last["missing"], 0, "{last}");
    assert_eq!(last["uploaded"].as_u64().unwrap() + mine, all, "{last}");
    same_rows(dir.path(), &a, &url("seq"), rows);
    // The whole publish of the same table finds every bucket there and the
    // same fingerprint.
    let whole = published(spawn_publish(&a, &url("seq"), &[]));
    assert_eq!(whole["uploaded"], 0, "{whole}");
    assert_eq!(whole["fingerprint"], last["fingerprint"], "{whole}");
    assert_eq!(whole["part"], serde_json::Value::Null, "{whole}");

    // Three parts of one table and a whole other table, all at once.
    let children = [
        part(&a, "par", "0/3"),
        spawn_publish(&b, &url("other"), &[]),
        part(&a, "par", "1/3"),
        part(&a, "par", "2/3"),
    ];
    let results: Vec<_> = children.into_iter().map(published).collect();
    let parts = [&results[0], &results[2], &results[3]];
    assert!(parts.iter().any(|r| r["complete"] == true), "{results:?}");
    let sum: u64 = parts
        .iter()
        .map(|r| r["part_buckets"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, all, "the parts cover every bucket once: {results:?}");
    same_rows(dir.path(), &a, &url("par"), rows);
    same_rows(dir.path(), &b, &url("other"), rows);

    // A row a bucket: more buckets than one read of the done hash asks
    // for, so the last part and the resume both read it in chunks.
    let tiny = ["--bucket-bytes", "1"];
    let first = published(spawn_publish(
        &a,
        &url("tiny"),
        &[&tiny[..], &["--part", "0/2"]].concat(),
    ));
    assert_eq!(first["buckets"], 60000, "{first}");
    assert_eq!(first["complete"], false, "{first}");
    let last = published(spawn_publish(
        &a,
        &url("tiny"),
        &[&tiny[..], &["--part", "1/2"]].concat(),
    ));
    assert_eq!(last["complete"], true, "{last}");
    let again = published(spawn_publish(&a, &url("tiny"), &tiny));
    assert_eq!(again["uploaded"], 0, "{again}");
    assert_eq!(again["fingerprint"], last["fingerprint"], "{again}");
    same_rows(dir.path(), &a, &url("tiny"), rows);

    let err = fails(&["publish", p(&a), &url("x"), "--part", "3/3"]);
    assert!(err.contains("0 <= K < N"), "{err}");
    let err = fails(&["publish", p(&a), &url("x"), "--part", "1"]);
    assert!(err.contains("give K/N"), "{err}");
}

/// `pleio gather URL --strategy shared --rows-file LIST --stats --json -o
/// OUT` with its segments in `shm`.
fn gather_shared(url: &str, list: &Path, out: &Path, shm: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pleio"));
    c.args([
        "gather",
        url,
        "--strategy",
        "shared",
        "--rows-file",
        p(list),
    ])
    .args(["--stats", "--json", "-o", p(out)])
    .env("PLEIO_SHM_DIR", shm);
    c
}

#[test]
fn processes_sharing_one_cache_in_front_of_redis_get_the_files_rows() {
    if let Some(why) = pleio_testkit::redis::unavailable() {
        pleio_testkit::skip!("{why}");
    }
    let server = Server::standalone(None).unwrap();
    let dir = disk_dir();
    let shm = tempfile::tempdir().unwrap();
    let file = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "40000", "--seed", "9", "-o", p(&file)]);
    let url = format!("redis://{}/q", server.addr());
    ok(&["publish", p(&file), &url, "--bucket-bytes", "8192"]);
    // Four processes at once on one segment, each its own order of an
    // overlapping set of rows (with repeats): each row is claimed by one
    // of them, and the others read it themselves or find it published.
    let ids: Vec<u64> = (0..3000u64).map(|i| i * 7919 % 40000).collect();
    let mut children = Vec::new();
    for k in 0..4 {
        let mut mine = ids.clone();
        mine.rotate_left(k * 700);
        mine.extend_from_slice(&ids[..100]);
        let list = dir.path().join(format!("rows{k}.txt"));
        let text: Vec<String> = mine.iter().map(u64::to_string).collect();
        std::fs::write(&list, text.join(",")).unwrap();
        let from_file = dir.path().join(format!("file{k}.f32"));
        ok(&[
            "gather",
            p(&file),
            "--rows-file",
            p(&list),
            "-o",
            p(&from_file),
        ]);
        let out = dir.path().join(format!("shared{k}.f32"));
        let child = gather_shared(&url, &list, &out, shm.path())
            .env("PLEIO_SHARED_KEEP", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        children.push((child, from_file, out));
    }
    for (child, from_file, out) in children {
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            std::fs::read(&from_file).unwrap(),
            std::fs::read(&out).unwrap()
        );
    }
    // Then every row is in the segment: a fifth process reads nothing.
    let list = dir.path().join("rows0.txt");
    let out = dir.path().join("again.f32");
    let o = gather_shared(&url, &list, &out, shm.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("file0.f32")).unwrap(),
        std::fs::read(&out).unwrap()
    );
    assert_eq!(
        (j["cache_hits"].as_u64(), j["cache_misses"].as_u64()),
        (Some(3000), Some(0)),
        "{j}"
    );
    assert_eq!(j["read_bytes"], 0, "{j}");
}
