//! `--layer L` on a checkpoint with two PLE layers (and a GGUF file):
//! inspect lists every layer and marks the one opened, gather reads the
//! layer's rows, rows gives the layer's row ids; a layer without a table
//! is an error naming the layers that have one.

mod common;

use std::fs::File;
use std::path::Path;

use common::{ok, p, pleio};
use pleio::checkpoint::CheckpointTable;
use pleio::ngram::RowMapper;
use pleio_lab::synth_ckpt::read_row_parts;
use serde_json::Value;

/// A BF16 checkpoint with PLE layers 1 and 3 (decoder layers 0 and 2).
fn synth(dir: &Path) {
    ok(&[
        "synth",
        "--format",
        "safetensors",
        "--encoding",
        "bf16",
        "--rows",
        "6000",
        "--shards",
        "8",
        "--files",
        "3",
        "--ple-layers",
        "1,3",
        "-o",
        p(dir),
    ]);
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

#[test]
fn inspect_lists_every_layer_and_marks_the_opened_one() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    synth(&ck);
    let r = json(&ok(&["inspect", p(&ck), "--json"]));
    assert_eq!(r["layer"], 0);
    let layers = r["ple_layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    let (l0, l2) = (&layers[0], &layers[1]);
    assert_eq!(
        (l0["layer"].as_u64(), l2["layer"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(
        (l0["opened"].as_bool(), l2["opened"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(
        l0["prefix"],
        "model.language_model.layers.0.ple.ple_embedding."
    );
    assert_eq!(
        l2["prefix"],
        "model.language_model.layers.2.ple.ple_embedding."
    );
    assert_eq!(
        (l0["shards"].as_u64(), l2["shards"].as_u64()),
        (Some(8), Some(8))
    );
    assert_eq!(l0["encoding"], "bf16");
    assert!(l2["rows"].as_u64() > l0["rows"].as_u64());
    assert_ne!(l0["layer_multipliers"], l2["layer_multipliers"]);
    assert_eq!(r["table"]["rows"], l0["rows"]);

    let r2 = json(&ok(&["inspect", p(&ck), "--layer", "2", "--json"]));
    assert_eq!(r2["layer"], 2);
    assert_eq!(r2["ple_layers"][1]["opened"], true);
    assert_eq!(r2["ple_layers"][0]["opened"], false);
    assert_eq!(r2["table"]["rows"], l2["rows"]);
    assert_eq!(r2["ngram"]["layer_multipliers"], l2["layer_multipliers"]);
    let ck2 = CheckpointTable::open_layer(&ck, Some(2)).unwrap();
    assert_eq!(r2["table"]["rows"].as_u64(), Some(ck2.rows));

    let text = ok(&["inspect", p(&ck), "--layer", "2"]);
    assert!(text.contains("(layer 2 of PLE layers [0, 2])"), "{text}");
    assert!(text.contains("* layer   2"), "{text}");

    let out = pleio(&["inspect", p(&ck), "--layer", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("decoder layer 1") && err.contains("[0, 2]"),
        "{err}"
    );
}

#[test]
fn gather_and_rows_read_the_layer_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    synth(&ck);
    for layer in [0u64, 2] {
        let t = CheckpointTable::open_layer(&ck, Some(layer)).unwrap();
        let rows = [0, 1, t.rows / 2, t.rows - 1];
        let list = rows.map(|r| r.to_string()).join(",");
        let out = tmp.path().join(format!("l{layer}.bin"));
        let l = layer.to_string();
        ok(&[
            "gather",
            p(&ck),
            "--layer",
            &l,
            "--rows",
            &list,
            "--dtype",
            "raw",
            "-o",
            p(&out),
        ]);
        let files: Vec<File> = t.files.iter().map(|f| File::open(f).unwrap()).collect();
        let want: Vec<u8> = rows
            .iter()
            .flat_map(|&r| read_row_parts(&t, &files, r).unwrap().concat())
            .collect();
        assert_eq!(std::fs::read(&out).unwrap(), want, "layer {layer}");
    }
    // The last row of layer 2 is past the end of layer 0's table.
    let t2 = CheckpointTable::open_layer(&ck, Some(2)).unwrap();
    let last = (t2.rows - 1).to_string();
    let out = tmp.path().join("bad.bin");
    let r = pleio(&["gather", p(&ck), "--rows", &last, "-o", p(&out)]);
    assert!(!r.status.success());

    // rows --layer: that layer's hash.
    let tokens = tmp.path().join("tokens.txt");
    std::fs::write(&tokens, "9707 11 1879 248044 100 200 300").unwrap();
    let ids = [9707u32, 11, 1879, 248044, 100, 200, 300];
    let mut per_layer = Vec::new();
    for layer in [None, Some(0u64), Some(2)] {
        let mut args = vec!["rows", p(&ck), "--tokens", p(&tokens), "--json"];
        let l;
        if let Some(x) = layer {
            l = x.to_string();
            args.extend(["--layer", &l]);
        }
        let got = json(&ok(&args));
        let got: Vec<u64> = got["rows"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()))
            .collect();
        let table = pleio::OpenOptions::new().layer(layer).open(&ck).unwrap();
        let mut want = Vec::new();
        table
            .row_ids()
            .unwrap()
            .sequence()
            .map_tokens(&ids, &mut want)
            .unwrap();
        assert_eq!(got, want, "layer {layer:?}");
        assert!(got.iter().all(|&r| r < table.rows()));
        per_layer.push(got);
    }
    assert_eq!(per_layer[0], per_layer[1]);
    assert_ne!(per_layer[1], per_layer[2]);
    let r = pleio(&["rows", p(&ck), "--tokens", p(&tokens), "--layer", "1"]);
    assert_eq!(r.status.code(), Some(2));
}

#[test]
fn gguf_layer_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let q = tmp.path().join("q.gguf");
    ok(&["synth", "--rows", "65536", "--sparse", "-o", p(&q)]);
    // synth's qwen4exp.ple.layers is [1], as the release's.
    ok(&["inspect", p(&q), "--layer", "1", "--json"]);
    ok(&[
        "gather",
        p(&q),
        "--layer",
        "1",
        "--rows",
        "3",
        "-o",
        p(&tmp.path().join("g.bin")),
    ]);
    let r = pleio(&[
        "gather",
        p(&q),
        "--layer",
        "0",
        "--rows",
        "3",
        "-o",
        p(&tmp.path().join("h.bin")),
    ]);
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("decoder layer 0") && err.contains("[1]"),
        "{err}"
    );
    let tokens = tmp.path().join("t.txt");
    std::fs::write(&tokens, "1 2 3").unwrap();
    assert_eq!(
        ok(&["rows", p(&q), "--tokens", p(&tokens), "--json"]),
        ok(&[
            "rows",
            p(&q),
            "--tokens",
            p(&tokens),
            "--json",
            "--layer",
            "1"
        ])
    );
}
