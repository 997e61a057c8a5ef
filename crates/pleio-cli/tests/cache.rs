//! The row cache from the command line: `replay --passes --budget` reports
//! each pass with the cache's counters (the second pass all hits, nothing
//! read), `gather --strategy cached --stats`, `bench` with a budget,
//! `cache-sim` agreeing with a real replay's hit rate, and `warm` with its
//! held-out coverage.

mod common;

use common::{disk_dir, ok, p, pleio};
use serde_json::Value as Json;

fn synth(dir: &std::path::Path) -> String {
    let f = dir.join("q.gguf");
    ok(&["synth", "--rows", "200000", "--seed", "5", "-o", p(&f)]);
    p(&f).to_string()
}

fn tokens_file(dir: &std::path::Path, f: &str, n: usize) -> String {
    let rows: Json = serde_json::from_str(&ok(&["rows", f, "--corpus", "--json"])).unwrap();
    let head: Vec<String> = rows["tokens"].as_array().unwrap()[..n]
        .iter()
        .map(|t| t.to_string())
        .collect();
    let toks = dir.join("tokens.txt");
    std::fs::write(&toks, head.join(" ")).unwrap();
    p(&toks).to_string()
}

#[test]
fn replay_passes_report_the_cache_and_the_second_pass_reads_nothing() {
    let dir = disk_dir();
    let f = synth(dir.path());
    let toks = tokens_file(dir.path(), &f, 1500);
    let out = ok(&[
        "replay",
        &f,
        "--tokens",
        &toks,
        "--strategy",
        "cached",
        "--budget",
        "8M",
        "--passes",
        "3",
        "--cold",
        "--ubatch",
        "256",
        "--decode",
        "8",
        "--json",
    ]);
    let j: Json = serde_json::from_str(&out).unwrap();
    let reps = j["replays"].as_array().unwrap();
    assert_eq!(reps.len(), 3);
    let sums: Vec<&Json> = reps.iter().map(|r| &r["checksum"]).collect();
    assert!(sums.iter().all(|s| *s == sums[0]));
    for (k, r) in reps.iter().enumerate() {
        assert_eq!(r["pass"], k + 1);
        assert_eq!(r["cache"]["budget_bytes"], 8 << 20);
        assert_eq!(r["cache"]["policy"], "sieve");
        assert!(r["cache"]["resident_bytes"].as_u64().unwrap() <= 8 << 20);
    }
    // Pass 1 starts cold (one eviction, before its prefill); every row it
    // needs is read once, later passes are all hits.
    assert_eq!(reps[0]["cold"], true);
    assert_eq!(reps[0]["evictions"].as_array().unwrap().len(), 1);
    let p1 = &reps[0]["prefill"];
    assert!(p1["cache_misses"].as_u64().unwrap() > 0);
    assert_eq!(p1["cache_misses"], p1["distinct_rows"]);
    for r in &reps[1..] {
        assert_eq!(r["cold"], false);
        for phase in ["prefill", "decode"] {
            assert_eq!(r[phase]["cache_misses"], 0, "{phase}");
            assert_eq!(r[phase]["gather_read_bytes"], 0, "{phase}");
        }
    }
    // The text report has a line per pass.
    let text = ok(&[
        "replay",
        &f,
        "--tokens",
        &toks,
        "--strategy",
        "cached",
        "--passes",
        "2",
        "--ubatch",
        "512",
        "--decode",
        "4",
    ]);
    assert!(text.contains("| 2 |") && text.contains("100.0%"), "{text}");
}

#[test]
fn cache_sim_agrees_with_a_real_replay() {
    let dir = disk_dir();
    let f = synth(dir.path());
    let toks = tokens_file(dir.path(), &f, 3000);
    let budget = "256K";
    for policy in ["lru", "sieve"] {
        let sim: Json = serde_json::from_str(&ok(&[
            "cache-sim",
            &f,
            "--tokens",
            &toks,
            "--ubatch",
            "256",
            "--decode",
            "8",
            "--budgets",
            budget,
            "--policies",
            policy,
            "--json",
        ]))
        .unwrap();
        let s = &sim["results"][0];
        let real: Json = serde_json::from_str(&ok(&[
            "replay",
            &f,
            "--tokens",
            &toks,
            "--ubatch",
            "256",
            "--decode",
            "8",
            "--strategy",
            "cached",
            "--budget",
            budget,
            "--cache-policy",
            policy,
            "--json",
        ]))
        .unwrap();
        let r = &real["replays"][0];
        let hits = r["prefill"]["cache_hits"].as_u64().unwrap()
            + r["decode"]["cache_hits"].as_u64().unwrap();
        let misses = r["prefill"]["cache_misses"].as_u64().unwrap()
            + r["decode"]["cache_misses"].as_u64().unwrap();
        // One thread, same sizing, shards and order of work: the same hits.
        assert_eq!(
            (s["hits"].as_u64().unwrap(), s["misses"].as_u64().unwrap()),
            (hits, misses),
            "{policy}"
        );
        assert!(
            s["evictions"].as_u64().unwrap() > 0,
            "{policy}: the budget should evict"
        );
    }
}

#[test]
fn gather_and_bench_show_cache_counters() {
    let dir = disk_dir();
    let f = synth(dir.path());
    let o = dir.path().join("rows.f32");
    let out = ok(&[
        "gather",
        &f,
        "--rows",
        "5,6,5,9000",
        "--strategy",
        "cached",
        "--budget",
        "1M",
        "--json",
        "--stats",
        "-o",
        p(&o),
    ]);
    let j: Json = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (j["cache_hits"].as_u64(), j["cache_misses"].as_u64()),
        (Some(0), Some(3))
    );
    assert_eq!(j["cache_budget"], 1 << 20);
    assert!(j["read_bytes"].as_u64().unwrap() > 0);
    let via_fault = dir.path().join("fault.f32");
    ok(&[
        "gather",
        &f,
        "--rows",
        "5,6,5,9000",
        "--strategy",
        "fault",
        "-o",
        p(&via_fault),
    ]);
    assert_eq!(
        std::fs::read(&o).unwrap(),
        std::fs::read(&via_fault).unwrap()
    );
    let bj = dir.path().join("b.json");
    ok(&[
        "bench",
        &f,
        "--rows",
        "64",
        "--batches",
        "2",
        "--strategies",
        "cached",
        "--budget",
        "2M",
        "--json",
        p(&bj),
    ]);
    let b: Json = serde_json::from_slice(&std::fs::read(&bj).unwrap()).unwrap();
    let arm = |cold: bool| {
        b["arms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["strategy"] == "cached" && a["cold"] == cold)
            .unwrap()
            .clone()
    };
    // Cold arms start from an empty cache; warm repeats are all hits.
    assert!(arm(true)["cache_misses"].as_f64().unwrap() > 60.0);
    assert_eq!(arm(true)["cache_hits"], 0.0);
    assert_eq!(arm(false)["cache_misses"], 0.0);
    assert!(arm(false)["cache_bytes"].as_u64().unwrap() <= 2 << 20);
    // A budget that cannot hold one row and its staging is refused.
    let bad = pleio(&[
        "gather",
        &f,
        "--rows",
        "1",
        "--strategy",
        "cached",
        "--budget",
        "1k",
        "-o",
        p(&o),
        "--force",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("at least"));
}

#[test]
fn warm_covers_a_held_out_text() {
    let dir = disk_dir();
    let f = synth(dir.path());
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../corpus/");
    let from = format!("{root}licenses/MIT-anyhow.txt");
    let from2 = format!("{root}licenses/MIT-regex.txt");
    let held = format!("{root}licenses/MIT-serde_json.txt");
    for strategy in ["cached", "auto"] {
        let j: Json = serde_json::from_str(&ok(&[
            "warm",
            &f,
            "--budget",
            "64M",
            "--from-text",
            &from,
            "--from-text",
            &from2,
            "--held-out-text",
            &held,
            "--strategy",
            strategy,
            "--json",
        ]))
        .unwrap();
        assert_eq!(
            j["target"],
            if strategy == "cached" {
                "row cache"
            } else {
                "page cache"
            }
        );
        let warm = j["warm_rows"].as_u64().unwrap();
        assert!(warm > 0 && warm <= j["profile_distinct_rows"].as_u64().unwrap());
        // MIT licences share most of their text: the held-out one's rows
        // are largely covered, never more than all of them.
        let c = j["held_out_coverage"].as_f64().unwrap();
        assert!(c > 0.3 && c <= 1.0, "{strategy}: {c}");
        assert!(j["profile_coverage"].as_f64().unwrap() > 0.99);
    }
    // A row profile works too; no profile is an error.
    let rows = dir.path().join("rows.txt");
    std::fs::write(&rows, "5 5 5 9 9 1").unwrap();
    let j: Json = serde_json::from_str(&ok(&[
        "warm",
        &f,
        "--budget",
        "1M",
        "--from-rows",
        p(&rows),
        "--strategy",
        "cached",
        "--json",
    ]))
    .unwrap();
    assert_eq!(
        (j["warm_rows"].as_u64(), j["rows_read"].as_u64()),
        (Some(3), Some(3))
    );
    let bad = pleio(&["warm", &f, "--budget", "1M"]);
    assert_eq!(bad.status.code(), Some(2));
}
