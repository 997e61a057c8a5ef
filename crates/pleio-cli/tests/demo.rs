//! `pleio demo` end to end on a small table (the README's first command with
//! `--size 64M`) and on a small checkpoint, so CI runs the demo's whole
//! code path.

use std::path::Path;
use std::process::Command;

/// What a demo run left: its stdout, its JSON report and the names of the
/// files in its directory.
struct Demo {
    stdout: String,
    json: serde_json::Value,
    left: Vec<String>,
}

/// Runs `pleio demo ARGS --clean --dir DIR --json DIR/demo.json` (on disk
/// under the target directory: eviction needs a real file system) and
/// checks it succeeded, printed a row for every strategy and `limit`, and
/// gathered the same floats in every replay; `None` where this file system
/// cannot evict (the run says so).
fn run_demo(args: &[&str], check: impl FnOnce(&Path, &str)) -> Option<Demo> {
    let dir = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
    let json = dir.path().join("demo.json");
    let out = Command::new(env!("CARGO_BIN_EXE_pleio"))
        .arg("demo")
        .args(args)
        .args(["--clean", "--dir"])
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("still resident") {
        // The caller returns at once: this is the test's skip.
        pleio_testkit::skip_case!("this file system cannot evict: {stderr}");
        return None;
    }
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for name in [
        "fault", "advise", "pread", "uring", "pool", "auto", "cached", "limit",
    ] {
        assert!(
            stdout.lines().any(|l| l.starts_with(name)),
            "no {name} row:\n{stdout}"
        );
    }
    check(dir.path(), &stdout);
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let replays = json["replays"].as_array().unwrap();
    assert_eq!(
        replays.len(),
        2 * pleio::Strategy::ALL.len(),
        "cold and warm per strategy"
    );
    let sums: std::collections::HashSet<_> =
        replays.iter().map(|r| r["checksum"].clone()).collect();
    assert_eq!(
        sums.len(),
        1,
        "every replay gathered the same floats: {sums:?}"
    );
    let left = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    Some(Demo { stdout, json, left })
}

#[test]
fn demo_runs_on_a_small_table_and_reports_every_strategy() {
    let args = ["--size", "64M", "--batches", "2", "--tokens", "1024"];
    let Some(Demo {
        stdout,
        json: j,
        left,
    }) = run_demo(&[&args[..], &["--decode", "8"]].concat(), |dir, stdout| {
        let svgs = ["demo-latency.svg", "demo-ubatches.svg"];
        for svg in svgs {
            let p = dir.join(svg);
            assert!(stdout.contains(&p.display().to_string()), "{stdout}");
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(text.contains("<svg") && text.contains("auto"), "{svg}");
        }
    })
    else {
        return;
    };
    assert!(stdout.contains("best: `"), "{stdout}");
    // --clean removed the table; the charts stay.
    assert!(!left.iter().any(|f| f.ends_with(".gguf")), "{left:?}");
    assert!(left.iter().any(|f| f == "demo-latency.svg"), "{left:?}");
    assert_eq!(j["command"], "demo");
    assert!(j["machine"]["cpus"].as_u64().unwrap() >= 1);
    assert_eq!(j["table"]["type"], "IQ4_NL");
    let replays = j["replays"].as_array().unwrap();
    // The budgeted row says its budget.
    let cached = replays.iter().find(|r| r["strategy"] == "cached").unwrap();
    assert_eq!(cached["cache_budget_bytes"], 64 << 20);
    assert!(j["arms"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["strategy"] == "limit"));
    // The replay's floor, once, and each cold replay's ratio to it.
    let depth = &j["floor"]["queue_depth"];
    assert!(
        pleio_lab::floor::QUEUE_DEPTHS.iter().any(|d| depth == d),
        "{depth}"
    );
    for phase in ["prefill", "decode"] {
        let f = &j["replay_floor"][phase];
        assert!(f["median_ms"].as_f64().unwrap() > 0.0, "{f}");
        assert_eq!(f["queue_depth"], *depth);
        let key = format!("{phase}_tokens_per_s");
        assert!(j["replay_floor"][&key].as_f64().unwrap() > 0.0);
    }
    for r in replays {
        for key in ["prefill_ratio_to_floor", "decode_ratio_to_floor"] {
            assert_eq!(r[key].is_number(), r["cold"] == true, "{key}: {r}");
        }
    }
    assert!(j["noisy"].is_array());
    let floor_line = stdout.lines().find(|l| l.starts_with("limit ")).unwrap();
    let prefill_floor = floor_line.split_whitespace().nth(1).unwrap();
    assert!(prefill_floor.parse::<f64>().unwrap() > 0.0, "{floor_line}");
}

#[test]
fn demo_runs_on_a_checkpoint() {
    // MLX 4-bit: three parts a row (words, scales, biases), four files.
    let args = [
        "--format",
        "safetensors",
        "--encoding",
        "mlx4",
        "--size",
        "16M",
        "--batches",
        "2",
        "--tokens",
        "512",
        "--decode",
        "4",
        "--budget",
        "1M",
    ];
    let Some(Demo { json: j, left, .. }) = run_demo(&args, |_, _| {}) else {
        return;
    };
    assert_eq!(j["table"]["type"], "mlx4");
    assert!(j["replay_floor"]["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
    // --clean removed the checkpoint directory.
    assert!(
        !left.iter().any(|f| f.starts_with("demo-qwen4exp")),
        "{left:?}"
    );
}
