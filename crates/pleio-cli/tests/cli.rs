//! The `pleio` command end to end: synth, inspect, gather, and its errors.

mod common;

use common::{ok, p, pleio};

use pleio::quant::{decode_row, GgmlType};

#[test]
fn synth_inspect_gather_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "20000", "--seed", "3", "-o", p(&f)]);

    let info: serde_json::Value = serde_json::from_str(&ok(&["inspect", "--json", p(&f)])).unwrap();
    assert_eq!(info["architecture"], "qwen4exp");
    let t = &info["table"];
    assert_eq!(t["type"], "IQ4_NL");
    assert_eq!(t["rows"], 20000);
    assert_eq!(t["row_bytes"], 90);
    assert_eq!(t["ngram"]["heads_inside_table"], true);
    let offset = t["offset"].as_u64().unwrap() as usize;

    let rows = [0u64, 19999, 7, 7, 12345];
    let list = rows.map(|r| r.to_string()).join(",");
    let out = dir.path().join("rows.f32");
    ok(&["gather", p(&f), "--rows", &list, "-o", p(&out)]);

    // Expected: the library decoder applied to the file's bytes directly.
    let bytes = std::fs::read(&f).unwrap();
    let got: Vec<f32> = std::fs::read(&out)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got.len(), rows.len() * 160);
    for (i, &r) in rows.iter().enumerate() {
        let start = offset + r as usize * 90;
        let mut want = vec![0f32; 160];
        decode_row(GgmlType::IQ4_NL, &bytes[start..start + 90], &mut want).unwrap();
        let got_row = &got[i * 160..(i + 1) * 160];
        assert!(
            got_row
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {r} differs"
        );
    }

    // npy: same floats after a 64-byte-aligned header.
    let npy = dir.path().join("rows.npy");
    ok(&[
        "gather",
        p(&f),
        "--rows",
        &list,
        "--format",
        "npy",
        "-o",
        p(&npy),
    ]);
    let npy_bytes = std::fs::read(&npy).unwrap();
    let raw = std::fs::read(&out).unwrap();
    assert!(npy_bytes.starts_with(b"\x93NUMPY"));
    assert_eq!(&npy_bytes[npy_bytes.len() - raw.len()..], &raw[..]);
    assert_eq!((npy_bytes.len() - raw.len()) % 64, 0);
}

#[test]
fn out_of_range_row_fails_with_status_2_and_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "1000", "-o", p(&f)]);
    let out = dir.path().join("o.f32");
    let r = pleio(&["gather", p(&f), "--rows", "1,1000", "-o", p(&out)]);
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("row 1000") && err.contains("1000 rows"),
        "{err}"
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no partial files"
    );
}

#[test]
fn synth_refuses_to_overwrite_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("q.gguf");
    ok(&["synth", "--rows", "500", "-o", p(&f)]);
    let r = pleio(&["synth", "--rows", "500", "-o", p(&f)]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("--force"));
    ok(&["synth", "--rows", "600", "--force", "-o", p(&f)]);
    let info: serde_json::Value = serde_json::from_str(&ok(&["inspect", "--json", p(&f)])).unwrap();
    assert_eq!(info["table"]["rows"], 600);
}

#[test]
fn sparse_full_size_table_has_real_geometry_and_reads_zero_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("full.gguf");
    ok(&["synth", "--rows", "full", "--sparse", "-o", p(&f)]);
    let info: serde_json::Value = serde_json::from_str(&ok(&["inspect", "--json", p(&f)])).unwrap();
    let t = &info["table"];
    assert_eq!(t["rows"], 320_001_536u64);
    assert_eq!(t["bytes"], 320_001_536u64 * 90);
    let n = &t["ngram"];
    assert_eq!(n["head_vocab_sizes"][0], 20000003);
    assert_eq!(n["head_offsets"][15], 300001275);
    assert_eq!(n["addressed_rows"], 320001446u64);
    assert_eq!(n["padding_rows"], 90);
    assert!(info["shards"][0]["allocated_bytes"].as_u64().unwrap() < 1 << 20);
    let out = dir.path().join("o.f32");
    ok(&["gather", p(&f), "--rows", "320001535,0", "-o", p(&out)]);
    let v = std::fs::read(&out).unwrap();
    assert_eq!(v.len(), 2 * 160 * 4);
    // A zero block has scale 0: every element is 0.0 * kvalue, i.e. +0.0 or
    // -0.0 (IQ4_NL's negative levels), as in ggml.
    assert!(v
        .chunks_exact(4)
        .all(|c| f32::from_le_bytes(c.try_into().unwrap()) == 0.0));
}

#[test]
fn gemma_table_and_named_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("g.gguf");
    ok(&[
        "synth",
        "--arch",
        "gemma4",
        "--rows",
        "64",
        "--layers",
        "2",
        "-o",
        p(&f),
    ]);
    let info: serde_json::Value = serde_json::from_str(&ok(&["inspect", "--json", p(&f)])).unwrap();
    assert_eq!(info["architecture"], "gemma4");
    assert_eq!(info["table"]["type"], "Q5_K");
    assert_eq!(info["table"]["row_elems"], 512);
    let r = pleio(&[
        "gather",
        p(&f),
        "--tensor",
        "nope",
        "--rows",
        "1",
        "-o",
        "/dev/null",
    ]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("nope"));
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("junk.gguf");
    std::fs::write(&f, b"not a gguf file at all").unwrap();
    let r = pleio(&["inspect", p(&f)]);
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("junk.gguf"), "{err}");
    let r = pleio(&[
        "synth",
        "--type",
        "Q4_K",
        "--rows",
        "500",
        "-o",
        p(&dir.path().join("k.gguf")),
    ]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("Q4_K"));
}

#[test]
fn synth_safetensors_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ckpt");
    let out = ok(&[
        "synth",
        "--format",
        "safetensors",
        "--encoding",
        "nvfp4",
        "--rows",
        "40000",
        "--files",
        "3",
        "-o",
        p(&ck),
    ]);
    assert!(out.contains("nvfp4 checkpoint"), "{out}");
    let t = pleio::checkpoint::CheckpointTable::open(&ck).unwrap();
    assert_eq!(t.shards.len(), 128);
    assert_eq!(t.files.len(), 3);
    assert_eq!(t.encoding.name(), "nvfp4");
    assert_eq!(t.rows % 128, 0);
    assert!(t.rows <= 40000 && t.rows > 39000, "{}", t.rows);
    // Never replaces: the same output again fails and leaves it intact.
    let again = pleio(&[
        "synth",
        "--format",
        "safetensors",
        "--rows",
        "40000",
        "-o",
        p(&ck),
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
    pleio::checkpoint::CheckpointTable::open(&ck).unwrap();
    let bad = pleio(&[
        "synth",
        "--format",
        "safetensors",
        "--encoding",
        "q4",
        "-o",
        p(&dir.path().join("x")),
    ]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown --encoding"));
}
