//! `pleio replay` end to end: every strategy, with and without lookahead
//! and a cold cache, gathers the same floats (checksum), equal to what
//! `pleio rows` + `pleio gather` give for the same stream; the JSON report
//! has its figures; bad arguments fail cleanly.

mod common;

use common::{disk_dir, ok, pleio};
use std::path::Path;

use pleio::fetch::Strategy;
use serde_json::Value as Json;

fn fails(args: &[&str]) -> String {
    let out = pleio(args);
    assert_eq!(out.status.code(), Some(2), "pleio {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

fn synth(dir: &Path, rows: &str) -> String {
    let f = dir.join(format!("q{rows}.gguf"));
    let f = f.to_str().unwrap().to_string();
    ok(&["synth", "--rows", rows, "--seed", "3", "-o", &f]);
    f
}

fn replay_json(args: &[&str]) -> Json {
    let mut all = vec!["replay"];
    all.extend_from_slice(args);
    all.push("--json");
    let doc: Json = serde_json::from_str(&ok(&all)).unwrap();
    // The shared report schema: one replay, the table in the envelope.
    assert_eq!(doc["schema"], "pleio-report/1");
    assert_eq!(doc["command"], "replay");
    assert!(doc["machine"]["cpus"].as_u64().unwrap() >= 1);
    assert_eq!(doc["file"]["path"], args[0]);
    let replays = doc["replays"].as_array().unwrap();
    assert_eq!(replays.len(), 1);
    let mut j = replays[0].clone();
    j["table"] = doc["table"].clone();
    j["file"] = doc["file"].clone();
    j["floor_sweep"] = doc["floor"].clone();
    j
}

/// FNV-1a over f32 bit patterns, as documented for the replay checksum.
fn fnv(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in bytes.chunks_exact(4) {
        let bits = u32::from_le_bytes(w.try_into().unwrap());
        h = (h ^ u64::from(bits)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[test]
fn corpus_replay_is_identical_across_strategies_and_lookahead() {
    // On the build's disk: the cold replays evict, which a tmpfs cannot.
    let dir = disk_dir();
    let f = synth(dir.path(), "60000");
    let shape = ["--ubatch", "256", "--decode", "12"];
    let mut args = vec![f.as_str(), "--corpus", "--prefill", "1000"];
    args.extend_from_slice(&shape);
    let corpus = replay_json(&args);
    assert!(corpus["stream_tokens"].as_u64().unwrap() > 50_000);
    // The corpus stream's first 1012 tokens as a token file, so every
    // strategy and mode replays the same stream without re-tokenizing.
    let rows: Json = serde_json::from_str(&ok(&["rows", &f, "--corpus", "--json"])).unwrap();
    let head: Vec<String> = rows["tokens"].as_array().unwrap()[..1012]
        .iter()
        .map(|t| t.to_string())
        .collect();
    let toks = dir.path().join("corpus-head.txt");
    std::fs::write(&toks, head.join(" ")).unwrap();
    for &s in Strategy::ALL {
        for extra in [
            &[][..],
            &["--lookahead", "--compute-ms", "1"][..],
            &["--cold"][..],
        ] {
            let mut args = vec![f.as_str(), "--tokens", toks.to_str().unwrap()];
            args.extend_from_slice(&shape);
            args.extend_from_slice(&["--strategy", s.name()]);
            args.extend_from_slice(extra);
            let j = replay_json(&args);
            let what = format!("{s} {extra:?}");
            assert_eq!(j["checksum"], corpus["checksum"], "{what}");
            for key in ["file", "table", "strategy", "prefill", "decode", "ubatches"] {
                assert!(j.get(key).is_some(), "{key} missing: {j}");
            }
            assert_eq!(j["strategy"], s.name());
            assert_eq!(j["table"]["rows"], 60_000);
            let ubs = j["ubatches"].as_array().unwrap();
            assert_eq!(ubs.len(), 4, "1000 tokens in ubatches of 256");
            // Same rows and pages per ubatch as the corpus run.
            for (c, u) in corpus["ubatches"].as_array().unwrap().iter().zip(ubs) {
                for k in [
                    "tokens",
                    "rows",
                    "distinct_rows",
                    "distinct_pages",
                    "reused_rows",
                ] {
                    assert_eq!(c[k], u[k], "{what}: {k}");
                }
            }
            assert_eq!(ubs[3]["tokens"], 1000 - 3 * 256);
            assert_eq!(ubs[0]["rows"], 256 * 16);
            assert_eq!(ubs[0]["reused_rows"], 0);
            for u in ubs {
                let d = u["distinct_rows"].as_u64().unwrap();
                assert!(d > 0 && d <= u["rows"].as_u64().unwrap());
                assert!(u["distinct_pages"].as_u64().unwrap() >= d * 90 / 4096);
            }
            let (p, d) = (&j["prefill"], &j["decode"]);
            assert_eq!(p["tokens"], 1000);
            assert!(p["tokens_per_s"].as_f64().unwrap() > 0.0);
            for k in ["p50", "p90", "p99", "max"] {
                assert!(p["latency_ms"][k].as_f64().unwrap() > 0.0, "{k}");
            }
            assert_eq!(
                (d["tokens"].clone(), d["steps"].clone()),
                (12.into(), 12.into())
            );
            assert_eq!(d["drawn_tokens"], 0);
            assert!(j["peak_rss_bytes"].as_u64().unwrap() > 0);
            if extra.contains(&"--cold") && !pleio::sys::NOOP {
                assert_eq!(j["evictions"].as_array().unwrap().len(), 2);
                if pleio::io::Reader::probe_uring().is_ok() {
                    check_floor(&j, &what);
                }
            } else {
                for phase in [p, d] {
                    for k in ["floor_ms", "floor_tokens_per_s", "ratio_to_floor", "floor"] {
                        assert!(phase[k].is_null(), "{what}: {k} without --cold");
                    }
                }
            }
            if extra.contains(&"--lookahead") {
                assert_eq!(j["lookahead_counters"]["worker_gathers"], 4);
            }
        }
    }
}

/// A cold replay's floor: per phase the floor time, tokens/s and ratio,
/// its bytes no more than the pages the ubatches touch, and the queue
/// depth one of the swept ones.
fn check_floor(j: &Json, what: &str) {
    let depth = &j["floor_sweep"]["queue_depth"];
    assert!(
        pleio_lab::floor::QUEUE_DEPTHS.iter().any(|d| depth == d),
        "{what}: {depth}"
    );
    assert_eq!(
        j["floor_sweep"]["sweep"]["depths"]
            .as_array()
            .unwrap()
            .len(),
        pleio_lab::floor::QUEUE_DEPTHS.len()
    );
    for phase in ["prefill", "decode"] {
        let p = &j[phase];
        for k in ["floor_ms", "floor_tokens_per_s", "ratio_to_floor"] {
            assert!(p[k].as_f64().unwrap() > 0.0, "{what}: {phase} {k}: {p}");
        }
        let f = &p["floor"];
        assert_eq!(f["median_ms"], p["floor_ms"], "{what}");
        assert!(f["samples"].as_u64().unwrap() >= 3, "{what}: {f}");
        assert_eq!(f["steps"], p["steps"], "{what}");
        assert_eq!(f["queue_depth"], *depth, "{what}");
        let (extents, bytes) = (f["extents"].as_u64().unwrap(), f["bytes"].as_u64().unwrap());
        let block = j["floor_sweep"]["block_bytes"].as_u64().unwrap();
        assert!(extents >= 1 && extents * block <= bytes, "{what}: {f}");
        let tokens = p["tokens"].as_f64().unwrap();
        let tps = tokens * 1e3 / p["floor_ms"].as_f64().unwrap();
        assert!((p["floor_tokens_per_s"].as_f64().unwrap() / tps - 1.0).abs() < 1e-9);
        let ratio = p["gather_ms"].as_f64().unwrap() / p["floor_ms"].as_f64().unwrap();
        assert!((p["ratio_to_floor"].as_f64().unwrap() / ratio - 1.0).abs() < 1e-9);
    }
    // Prefill reads each page once: no more bytes than its ubatches' pages.
    let pages: u64 = j["ubatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["distinct_pages"].as_u64().unwrap())
        .sum();
    assert!(j["prefill"]["floor"]["bytes"].as_u64().unwrap() <= pages * pleio::sys::page_size());
}

#[test]
fn replay_checksum_matches_rows_then_gather() {
    let dir = disk_dir();
    let f = synth(dir.path(), "20000");
    // A stream with an EOS reset; 150 tokens: 130 prefill, 20 decode.
    let toks: Vec<String> = (0..150u32)
        .map(|i| if i == 60 { 248_044 } else { (i * 37) % 500 })
        .map(|t| t.to_string())
        .collect();
    let tok_file = dir.path().join("t.txt");
    std::fs::write(&tok_file, toks.join(" ")).unwrap();
    let tok_file = tok_file.to_str().unwrap();
    let j = replay_json(&[&f, "--tokens", tok_file, "--ubatch", "64", "--decode", "20"]);
    assert_eq!(j["prefill"]["tokens"], 130);
    assert_eq!(j["ubatches"].as_array().unwrap().len(), 3);

    let rows: Json =
        serde_json::from_str(&ok(&["rows", &f, "--tokens", tok_file, "--json"])).unwrap();
    let flat: Vec<String> = rows["rows"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.to_string()))
        .collect();
    let rows_file = dir.path().join("rows.txt");
    std::fs::write(&rows_file, flat.join(" ")).unwrap();
    let out = dir.path().join("out.f32");
    ok(&[
        "gather",
        &f,
        "--rows-file",
        rows_file.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len(), 150 * 16 * 160 * 4);
    assert_eq!(j["checksum"], fnv(&bytes));

    // Decode past the end of the stream: 40 more tokens are drawn.
    let j = replay_json(&[
        &f,
        "--tokens",
        tok_file,
        "--prefill",
        "150",
        "--decode",
        "40",
        "--seed",
        "1",
    ]);
    assert_eq!(j["decode"]["drawn_tokens"], 40);
    assert_eq!(j["decode"]["steps"], 40);
}

#[test]
fn bad_arguments_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let f = synth(dir.path(), "5000");
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let e = fails(&["replay", &f, "--tokens", empty.to_str().unwrap()]);
    assert!(e.contains("empty"), "{e}");
    let e = fails(&["replay", &f, "--corpus", "--ubatch", "0"]);
    assert!(e.contains("ubatch"), "{e}");
    let e = fails(&["replay", &f, "--corpus", "--prefill", "99999999"]);
    assert!(e.contains("prefill"), "{e}");
    let e = fails(&["replay", &f, "--corpus", "--compute-ms=-1"]);
    assert!(e.contains("compute"), "{e}");
    let out = pleio(&["replay", &f, "--corpus", "--strategy", "nope"]);
    assert!(!out.status.success());
}

#[test]
fn replay_plot_draws_every_ubatch() {
    let dir = tempfile::tempdir_in(pleio_testkit::disk_dir!()).unwrap();
    let f = synth(dir.path(), "20000");
    let svg = dir.path().join("r.svg");
    let svg_s = svg.to_str().unwrap();
    let out = ok(&[
        "replay",
        &f,
        "--corpus",
        "--prefill",
        "1000",
        "--ubatch",
        "256",
        "--decode",
        "4",
        "--strategy",
        "pread",
        "--plot",
        svg_s,
    ]);
    assert!(out.contains(&format!("chart: {svg_s}")), "{out}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg") && text.contains("pread"), "{text}");
}
