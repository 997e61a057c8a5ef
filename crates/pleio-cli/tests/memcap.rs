//! `--mem-cap` on `bench` and `replay`: each strategy measured inside a
//! memory cgroup smaller than the table (skipped, saying why, where no
//! memory cgroup can be made: not root, no controller).

mod common;

use common::{ok, p, pleio};
use std::path::Path;

/// Why a memory cap cannot be made here, if it cannot.
fn no_cgroup(table: &Path) -> Option<String> {
    let out = pleio(&[
        "bench",
        p(table),
        "--rows",
        "16",
        "--batches",
        "1",
        "--strategies",
        "fault",
        "--cold",
        "none",
        "--mem-cap",
        "32M",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (!out.status.success() && err.contains("needs root and a memory cgroup controller"))
        .then_some(err)
}

#[test]
fn capped_bench_and_replay_stay_within_a_cap_smaller_than_the_table() {
    let dir = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
    let f = dir.path().join("q.gguf");
    // 750k rows of 90 B: a 64 MiB table, twice the cap.
    ok(&["synth", "--rows", "750000", "--seed", "4", "-o", p(&f)]);
    if let Some(why) = no_cgroup(&f) {
        pleio_testkit::skip!("no memory cgroup here: {why}");
    }
    let cap = 32u64 << 20;
    let json = dir.path().join("b.json");
    let table = ok(&[
        "bench",
        p(&f),
        "--rows",
        "16,256",
        "--batches",
        "2",
        "--strategies",
        "fault,pread,pool",
        "--mem-cap",
        "32M",
        "--json",
        p(&json),
    ]);
    assert!(table.contains("32.00 MiB memory cgroup"), "{table}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["schema"], "pleio-report/1");
    assert!(v["table"]["bytes"].as_u64().unwrap() > 2 * cap - (1 << 20));
    let mc = &v["mem_cap"];
    assert_eq!(mc["bytes"], cap);
    let runs = mc["runs"].as_array().unwrap();
    let names: Vec<&str> = runs
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fault", "pread", "pool"]);
    for r in runs {
        assert_eq!(r["outcome"], "finished", "{r}");
        assert_eq!(r["within_cap"], true, "{r}");
        let peak = r["peak_bytes"].as_u64().unwrap();
        assert!(peak > 0 && peak <= cap, "{r}");
        // The child's figures are in the arms: cold and warm at each size.
        let arms: Vec<_> = v["arms"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["strategy"] == r["strategy"])
            .collect();
        assert_eq!(arms.len(), 4, "{r}");
        assert!(arms.iter().all(|a| a["mean_us"].as_f64().unwrap() > 0.0));
    }
    assert!(v["arms"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["strategy"] == "limit"));

    // A token file, not the bundled corpus: tokenizing the corpus alone
    // takes more memory than the cap.
    let tokens = dir.path().join("tokens.txt");
    let ids: Vec<String> = (0..1032u32)
        .map(|i| (i * 7919 % 150_000).to_string())
        .collect();
    std::fs::write(&tokens, ids.join(" ")).unwrap();
    let out = ok(&[
        "replay",
        p(&f),
        "--tokens",
        p(&tokens),
        "--prefill",
        "1024",
        "--decode",
        "8",
        "--cold",
        "--strategy",
        "pread",
        "--mem-cap",
        "32M",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["command"], "replay");
    let run = &j["mem_cap"]["runs"][0];
    assert_eq!(run["outcome"], "finished", "{run}");
    assert!(run["peak_bytes"].as_u64().unwrap() <= cap, "{run}");
    assert_eq!(j["replays"][0]["strategy"], "pread");
    assert_eq!(j["replays"][0]["prefill"]["tokens"], 1024);
    // The floor is measured outside the cap, for the same replay.
    if pleio::io::Reader::probe_uring().is_ok() {
        let p = &j["replays"][0]["prefill"];
        assert!(p["ratio_to_floor"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["floor"]["median_ms"].as_f64().unwrap() > 0.0, "{p}");
        assert!(j["floor"]["queue_depth"].is_u64(), "{j}");
    }
}

/// Issue 14 / 9: capped bench children wrote their report through
/// `File::create` at `$TMPDIR/pleio-capped-{pid}-{i}.json.partial`, a name
/// anyone could predict: a symbolic link planted there made (root) pleio
/// overwrite the link's target. The children now print their report on a
/// pipe; links planted at every old name leave their targets untouched.
#[test]
fn capped_bench_follows_no_link_planted_at_a_predictable_name() {
    let dir = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
    let d = dir.path();
    let f = d.join("q.gguf");
    ok(&["synth", "--rows", "20000", "-o", p(&f)]);
    if let Some(why) = no_cgroup(&f) {
        pleio_testkit::skip!("no memory cgroup here: {why}");
    }
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let victim = d.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pleio"))
        .args(["bench", p(&f), "--rows", "16", "--batches", "1"])
        .args(["--strategies", "fault,pread", "--mem-cap", "64M"])
        .env("TMPDIR", &tmp)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The parent probes the cgroup, opens and evicts the table before its
    // first child runs: the links are in place long before.
    for i in 0..2 {
        let name = tmp.join(format!("pleio-capped-{}-{i}.json.partial", child.id()));
        std::os::unix::fs::symlink(&victim, name).unwrap();
    }
    let status = child.wait().unwrap();
    assert!(status.success());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}
