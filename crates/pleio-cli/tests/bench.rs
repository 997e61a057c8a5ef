//! `pleio bench` end to end on a small synthetic table: the JSON schema,
//! every strategy and the `limit` arm present, the bit-for-bit check passed.

mod common;

use common::{ok, p, pleio};

const STRATEGIES: [&str; 7] = [
    "fault",
    "advise",
    "pread",
    "uring",
    "uring-direct",
    "pool",
    "auto",
];

#[test]
fn bench_writes_every_arm_as_json() {
    // On the real disk (not a tmpfs /tmp), so eviction works.
    let dir = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
    let f = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "30000", "--seed", "5", "-o", p(&f)]);
    let json = dir.path().join("bench.json");
    let table = ok(&[
        "bench",
        p(&f),
        "--rows",
        "16,100",
        "--batches",
        "2",
        "--json",
        p(&json),
    ]);
    assert!(table.contains("| auto | 16 | warm |"), "{table}");
    assert!(table.contains("| limit | 100 | cold |"), "{table}");

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["table"]["rows"], 30000);
    assert_eq!(v["table"]["type"], "IQ4_NL");
    assert!(v["machine"]["kernel"].is_string());
    assert_eq!(v["schema"], "pleio-report/1");
    assert_eq!(v["command"], "bench");
    // what made the report: its command line, commit, time and load
    let run = &v["run"];
    assert_eq!(run["argv"][1], "bench", "{run}");
    assert_eq!(run["argv"][2], p(&f), "{run}");
    assert!(!run["commit"].as_str().unwrap().is_empty(), "{run}");
    assert!(
        run["started_unix"].as_u64().unwrap() > 1_600_000_000,
        "{run}"
    );
    assert!(run["seconds"].as_f64().unwrap() > 0.0, "{run}");
    for k in ["load_start", "load_end"] {
        // three averages where /proc/loadavg exists (every Linux)
        assert_eq!(run[k].as_array().map(|a| a.len()), Some(3), "{run}");
    }
    assert_eq!(v["file"]["path"], p(&f));
    assert_eq!(
        v["file"]["bytes"].as_u64().unwrap(),
        std::fs::metadata(&f).unwrap().len()
    );
    let arms = v["arms"].as_array().unwrap();
    // Per size: every strategy, limit and qd1-page cold, every strategy
    // and limit-warm warm.
    let n = pleio::Strategy::ALL.len();
    assert_eq!(arms.len(), 2 * (n + 2 + n + 1));
    assert_eq!(v["dtype"], "f32");
    for a in arms {
        for key in [
            "strategy",
            "rows",
            "cold",
            "mean_us",
            "median_us",
            "p99_us",
            "bytes_read",
            "major_faults",
            "ratio_to_fault",
            "ratio_to_limit",
        ] {
            assert!(a.get(key).is_some(), "{key} missing in {a}");
        }
        assert!(a["mean_us"].as_f64().unwrap() > 0.0, "{a}");
        assert!(a["samples"].as_u64().unwrap() > 0, "{a}");
        // Every arm has a floor: `limit` cold, `limit-warm` warm.
        assert!(a["ratio_to_limit"].is_number(), "{a}");
        assert!(
            a["min_us"].as_f64().unwrap() <= a["median_us"].as_f64().unwrap(),
            "{a}"
        );
    }
    for rows in [16, 100] {
        assert!(
            arms.iter()
                .any(|a| a["strategy"] == "limit-warm" && a["rows"] == rows && a["cold"] == false),
            "no limit-warm arm at {rows} rows"
        );
    }
    for s in STRATEGIES.iter().chain(&["limit"]) {
        for rows in [16, 100] {
            assert!(
                arms.iter()
                    .any(|a| a["strategy"] == *s && a["rows"] == rows && a["cold"] == true),
                "no cold {s} arm at {rows} rows"
            );
        }
    }
    // The floor: a swept queue depth; per batch size a median of at least
    // 30 reads (2 batches read 15 times each), one request per extent.
    let depth = &v["floor"]["queue_depth"];
    assert!(
        pleio_lab::floor::QUEUE_DEPTHS.iter().any(|d| depth == d),
        "{depth}"
    );
    assert_eq!(
        v["floor"]["sweep"]["depths"].as_array().unwrap().len(),
        pleio_lab::floor::QUEUE_DEPTHS.len()
    );
    for limit in arms.iter().filter(|a| a["strategy"] == "limit") {
        assert_eq!(limit["samples"], 30, "{limit}");
        let requests = limit["read_requests"].as_f64().unwrap();
        let pages = limit["distinct_pages"].as_f64().unwrap();
        assert!(requests >= 1.0 && requests <= pages, "{limit}");
        // Extents trimmed to O_DIRECT blocks: never more than the pages.
        let bytes = limit["bytes_read"].as_f64().unwrap();
        assert!(bytes <= pages * 4096.0, "{limit}");
    }
    let fault = arms
        .iter()
        .find(|a| a["strategy"] == "fault" && a["cold"] == true)
        .unwrap();
    assert_eq!(fault["ratio_to_fault"], 1.0);
    // Cold fault gathers read from the device and take major faults.
    assert!(fault["major_faults"].as_f64().unwrap() >= 1.0, "{fault}");
    assert!(fault["bytes_read"].as_f64().unwrap() > 0.0, "{fault}");
}

#[test]
fn bench_warm_only_and_bad_options() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "5000", "--seed", "2", "-o", p(&f)]);
    let table = ok(&[
        "bench",
        p(&f),
        "--rows",
        "8",
        "--batches",
        "1",
        "--cold",
        "none",
        "--strategies",
        "auto,uring",
    ]);
    // fault is added for the ratios; no cold arm, no limit.
    assert!(table.contains("| fault | 8 | warm |"), "{table}");
    assert!(table.contains("| auto | 8 | warm |"), "{table}");
    assert!(
        !table.contains(" | 8 | cold |") && !table.contains("| limit |"),
        "{table}"
    );
    let bad = pleio(&["bench", p(&f), "--strategies", "nope"]);
    assert!(!bad.status.success());
    let zero = pleio(&["bench", p(&f), "--batches", "0"]);
    assert_eq!(zero.status.code(), Some(2));
}

#[test]
fn bench_plot_writes_cold_and_warm_charts() {
    let dir = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
    let f = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "20000", "--seed", "2", "-o", p(&f)]);
    let svg = dir.path().join("lat.svg");
    let out = ok(&[
        "bench",
        p(&f),
        "--rows",
        "16,64",
        "--batches",
        "2",
        "--strategies",
        "pread,pool",
        "--plot",
        p(&svg),
    ]);
    let warm = dir.path().join("lat-warm.svg");
    for (chart, names) in [
        (&svg, &["fault", "pread", "pool", "limit"][..]),
        (&warm, &["fault", "pread", "pool"][..]),
    ] {
        assert!(out.contains(&format!("chart: {}", p(chart))), "{out}");
        let text = std::fs::read_to_string(chart).unwrap();
        assert!(text.contains("<svg"));
        for n in names {
            assert!(text.contains(n), "{n} missing in {}", p(chart));
        }
    }
}
