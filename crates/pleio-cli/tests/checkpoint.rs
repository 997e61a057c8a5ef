//! The same commands on safetensors checkpoints (a directory, its index or
//! one file as the table): inspect, gather (every strategy and dtype, raw
//! and npy), rows, replay, bench and residency.

mod common;

use std::fs::File;
use std::path::Path;

use common::{disk_dir, ok, p, pleio};
use pleio::checkpoint::CheckpointTable;
use pleio::quant::convert::{f32_to_bf16, f32_to_f16};
use pleio::quant::encoding::EncodingDecoder;
use pleio::safetensors::SafetensorsFile;
use pleio_lab::synth_ckpt::read_row_parts;
use serde_json::Value;

/// Writes a checkpoint of `enc` (about 40000 rows, 128 shards) into `dir`.
fn synth(dir: &Path, enc: &str, files: &str) {
    ok(&[
        "synth",
        "--format",
        "safetensors",
        "--encoding",
        enc,
        "--rows",
        "40000",
        "--files",
        files,
        "-o",
        p(dir),
    ]);
}

/// `rows` of the checkpoint in `dtype`, by plain reads of each row's parts
/// and the encoding's scalar reference decoder.
fn reference(ck: &CheckpointTable, rows: &[u64], dtype: &str) -> Vec<u8> {
    let files: Vec<File> = ck.files.iter().map(|f| File::open(f).unwrap()).collect();
    let n = ck.row_elems as usize;
    let dec = EncodingDecoder::scalar(ck.encoding, n).unwrap();
    let mut out = Vec::new();
    for &r in rows {
        let parts = read_row_parts(ck, &files, r).unwrap();
        if dtype == "raw" {
            out.extend(parts.concat());
            continue;
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let mut y = vec![0f32; n];
        dec.decode_f32(&refs, &mut y).unwrap();
        for x in y {
            match dtype {
                "f32" => out.extend(x.to_le_bytes()),
                "bf16" => out.extend(f32_to_bf16(x).to_le_bytes()),
                "f16" => out.extend(f32_to_f16(x).to_le_bytes()),
                other => panic!("{other}"),
            }
        }
    }
    out
}

#[test]
fn inspect_and_gather_every_strategy_and_dtype() {
    let dir = disk_dir();
    for (enc, files) in [("mlx4", "3"), ("fp8", "2")] {
        let ck_dir = dir.path().join(enc);
        synth(&ck_dir, enc, files);
        let ck = CheckpointTable::open(&ck_dir).unwrap();

        let info: Value = serde_json::from_str(&ok(&["inspect", "--json", p(&ck_dir)])).unwrap();
        let t = &info["table"];
        assert_eq!(t["encoding"], enc);
        assert_eq!(t["rows"], ck.rows);
        assert_eq!(t["row_bytes"], ck.row_bytes());
        assert_eq!(t["parts"], ck.shards[0].parts.len());
        assert_eq!(info["files"].as_array().unwrap().len(), ck.files.len());
        let shards = info["shards"].as_array().unwrap();
        assert_eq!(shards.len(), 128);
        for (s, want) in shards.iter().zip(&ck.shards) {
            for (part, w) in s["parts"].as_array().unwrap().iter().zip(&want.parts) {
                assert_eq!(part["offset"], w.offset);
                assert_eq!(part["file"], w.file);
                assert_eq!(part["tensor"], w.tensor.as_str());
            }
        }
        let text = ok(&["inspect", p(&ck_dir)]);
        assert!(text.contains(&format!("encoding      {enc}")), "{text}");
        assert!(text.contains("more (--full lists every shard)"), "{text}");

        // Both sides of a shard boundary, the ends, duplicates.
        let rps = ck.shards[0].rows;
        let rows = [0, rps - 1, rps, ck.rows - 1, 777, 777, 3 * rps + 5];
        let list = rows.map(|r| r.to_string()).join(",");
        let index = ck_dir.join("model.safetensors.index.json");
        for dtype in ["f32", "bf16", "f16", "raw"] {
            let want = reference(&ck, &rows, dtype);
            for s in pleio::Strategy::ALL.iter().map(|s| s.name()) {
                for table in [&ck_dir, &index] {
                    let out = dir.path().join(format!("{enc}-{s}-{dtype}.bin"));
                    ok(&[
                        "gather",
                        p(table),
                        "--rows",
                        &list,
                        "--strategy",
                        s,
                        "--dtype",
                        dtype,
                        "--force",
                        "-o",
                        p(&out),
                    ]);
                    assert!(
                        std::fs::read(&out).unwrap() == want,
                        "{enc} {s} {dtype} {}",
                        table.display()
                    );
                }
            }
        }
        // `cached` (its misses read with O_DIRECT from every file, every
        // part of a row) equals `pread` byte for byte, with a budget so
        // small the batch evicts as it goes, and with `--stats`.
        let gather = |strategy: &str, extra: &[&str]| {
            let out = dir.path().join(format!("{enc}-{strategy}-vs.bin"));
            let mut args = vec![
                "gather",
                p(&ck_dir),
                "--rows",
                &list,
                "--dtype",
                "raw",
                "--strategy",
                strategy,
                "--force",
                "-o",
                p(&out),
            ];
            args.extend_from_slice(extra);
            let text = ok(&args);
            (std::fs::read(&out).unwrap(), text)
        };
        let (pread, _) = gather("pread", &[]);
        for budget in ["64K", "8M"] {
            let (cached, text) = gather("cached", &["--budget", budget, "--json", "--stats"]);
            assert!(
                cached == pread,
                "{enc} cached --budget {budget} differs from pread"
            );
            let j: Value = serde_json::from_str(&text).unwrap();
            // Six distinct rows, each read once (777 twice in the list).
            assert_eq!(j["cache_misses"], 6, "{enc} {budget}: {j}");
            assert_eq!(j["cache_hits"], 0, "{enc} {budget}: {j}");
        }
        // npy: the dtype's descr, the same bytes after the header.
        let npy = dir.path().join(format!("{enc}.npy"));
        ok(&[
            "gather",
            p(&ck_dir),
            "--rows",
            &list,
            "--dtype",
            "bf16",
            "--format",
            "npy",
            "-o",
            p(&npy),
        ]);
        let bytes = std::fs::read(&npy).unwrap();
        let end = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
        assert_eq!(end % 64, 0);
        let header = String::from_utf8_lossy(&bytes[..end]).to_string();
        assert!(header.contains("'descr': '<u2'"), "{header}");
        assert!(
            header.contains(&format!("({}, 160)", rows.len())),
            "{header}"
        );
        assert_eq!(&bytes[end..], reference(&ck, &rows, "bf16"));

        // A bad id: an error naming it, no output.
        let out = dir.path().join("never.bin");
        let r = pleio(&[
            "gather",
            p(&ck_dir),
            "--rows",
            &ck.rows.to_string(),
            "-o",
            p(&out),
        ]);
        assert!(!r.status.success());
        assert!(String::from_utf8_lossy(&r.stderr).contains(&ck.rows.to_string()));
        assert!(!out.exists());
        // --tensor is for GGUF files.
        let r = pleio(&[
            "gather",
            p(&ck_dir),
            "--rows",
            "1",
            "--tensor",
            "x",
            "-o",
            p(&out),
        ]);
        assert!(!r.status.success());
        assert!(!out.exists());
    }
}

#[test]
fn rows_of_a_checkpoint_equal_rows_of_a_gguf_with_the_same_constants() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "full", "--sparse", "-o", p(&gguf)]);
    let ck = dir.path().join("ck");
    ok(&[
        "synth",
        "--format",
        "safetensors",
        "--encoding",
        "fp8",
        "--rows",
        "full",
        "--sparse",
        "--files",
        "5",
        "-o",
        p(&ck),
    ]);
    let from_gguf = ok(&["rows", p(&gguf), "--corpus", "--json"]);
    let from_ck = ok(&["rows", p(&ck), "--corpus", "--json"]);
    let (a, b): (Value, Value) = (
        serde_json::from_str(&from_gguf).unwrap(),
        serde_json::from_str(&from_ck).unwrap(),
    );
    assert!(a["rows"].as_array().unwrap().len() > 1000);
    assert_eq!(a, b);
}

#[test]
fn replay_bench_and_residency_run_on_a_checkpoint() {
    let dir = disk_dir();
    let ck = dir.path().join("ck");
    synth(&ck, "nvfp4", "3");
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "fn main() { println!(\"hello, checkpoint\"); }\n").unwrap();

    let j: Value = serde_json::from_str(&ok(&[
        "replay",
        p(&ck),
        "--text",
        p(&text),
        "--decode",
        "4",
        "--cold",
        "--json",
    ]))
    .unwrap();
    assert_eq!(j["table"]["type"], "nvfp4");
    // The floor reads every part of every row from whichever of the three
    // files holds it.
    let uring = pleio::io::Reader::probe_uring().is_ok();
    if uring {
        for r in j["replays"].as_array().unwrap() {
            let prefill = &r["prefill"];
            assert!(prefill["floor_tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(prefill["ratio_to_floor"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    assert!(
        j["replays"].as_array().is_some_and(|r| !r.is_empty()),
        "{j}"
    );

    let out = dir.path().join("bench.json");
    ok(&[
        "bench",
        p(&ck),
        "--rows",
        "16",
        "--batches",
        "2",
        "--strategies",
        "auto,uring-direct",
        "--json",
        p(&out),
    ]);
    let j: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let arms = j["arms"].as_array().unwrap();
    assert!(arms
        .iter()
        .any(|a| a["strategy"] == "auto" && a["cold"] == true));
    // A limit arm over the shards' two parts in three files, and every
    // cold arm's ratio to it.
    if uring {
        let limit = arms
            .iter()
            .find(|a| a["strategy"] == "limit")
            .expect("a limit arm");
        assert!(limit["median_us"].as_f64().unwrap() > 0.0, "{limit}");
        assert!(arms
            .iter()
            .filter(|a| a["cold"] == true)
            .all(|a| a["ratio_to_limit"].as_f64().is_some_and(|r| r > 0.0)));
    }

    let j: Value = serde_json::from_str(&ok(&["residency", p(&ck), "--json"])).unwrap();
    let files = j["files"].as_array().unwrap();
    assert_eq!(files.len(), 3);
    for f in files {
        assert!(f["pages"].as_u64().unwrap() > 0, "{f}");
    }

    // `warm` prewarms a checkpoint into a row cache and into the page cache.
    let profile = dir.path().join("profile.txt");
    let ids: Vec<String> = (0..400).map(|k| (k * 31).to_string()).collect();
    std::fs::write(&profile, ids.join("\n")).unwrap();
    for strategy in ["cached", "auto"] {
        let j: Value = serde_json::from_str(&ok(&[
            "warm",
            p(&ck),
            "--strategy",
            strategy,
            "--budget",
            "1M",
            "--from-rows",
            p(&profile),
            "--json",
        ]))
        .unwrap();
        assert!(j["rows_read"].as_u64().unwrap() > 0, "{strategy}: {j}");
    }
}

#[test]
fn synth_writes_an_nvfp4_global_scale_per_shard_or_per_table() {
    let dir = disk_dir();
    let mut values = Vec::new();
    for (name, at) in [("shard", "shard"), ("table", "table")] {
        let ck = dir.path().join(name);
        ok(&[
            "synth",
            "--format",
            "safetensors",
            "--encoding",
            "nvfp4",
            "--rows",
            "5000",
            "--nvfp4-scale-2",
            at,
            "-o",
            p(&ck),
        ]);
        let ct = CheckpointTable::open(&ck).unwrap();
        let table_level = ct
            .files
            .iter()
            .flat_map(|f| SafetensorsFile::open(f).unwrap().tensors().to_vec())
            .filter(|t| t.name.ends_with("weight_scale_2"))
            .map(|t| t.name.ends_with("ngram_embedding.weight_scale_2"))
            .collect::<Vec<_>>();
        match at {
            "shard" => assert!(table_level.len() == 128 && !table_level.contains(&true)),
            _ => assert_eq!(table_level, [true]),
        }
        let j: Value = serde_json::from_str(&ok(&["inspect", "--json", p(&ck)])).unwrap();
        assert_eq!(
            j["table"]["scale"]["nvfp4_weight_scale_2"].as_f64(),
            Some(f64::from(1.0f32 / 2688.0)),
            "{j}"
        );
        let t = pleio::Table::open(&ck).unwrap();
        let ids: Vec<u64> = (0..t.rows()).step_by(7).collect();
        let mut out = vec![0f32; ids.len() * t.row_elems()];
        t.gather(&ids, &mut out).unwrap();
        values.push(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
    assert!(values[0] == values[1], "the two layouts decode alike");
    // One spelling of the global scale is refused for other encodings;
    // an unknown place is named.
    for (enc, at, says) in [
        ("fp8", "table", "is for --encoding nvfp4"),
        ("nvfp4", "layer", "unknown --nvfp4-scale-2"),
    ] {
        let out = pleio(&[
            "synth",
            "--format",
            "safetensors",
            "--encoding",
            enc,
            "--nvfp4-scale-2",
            at,
            "-o",
            p(&dir.path().join("x")),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{err}");
        assert!(!dir.path().join("x").exists());
    }
}
