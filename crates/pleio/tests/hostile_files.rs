//! Hostile files beside a checkpoint: a `config.json` whose numbers claim
//! more than the tensors hold, and an `index.json` naming a FIFO. Each is
//! a typed error naming the key or file, never an abort, a panic or a
//! hang.

use std::path::Path;

use pleio::checkpoint::{CheckpointError, CheckpointTable};
use pleio::Table;
use pleio_lab::synth_ckpt::{write_checkpoint, CkptEncoding, CkptSpec};
use serde_json::Value;

/// A 4-shard BF16 checkpoint in `tmp/ck`, returned.
fn small_checkpoint(tmp: &Path) -> std::path::PathBuf {
    let dir = tmp.join("ck");
    let spec = CkptSpec {
        shards: 4,
        ..CkptSpec::new(CkptEncoding::Bf16, 2000, 2, 5)
    };
    write_checkpoint(&spec, &dir, &mut |_| {}).unwrap();
    dir
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

fn text_config(v: &mut Value) -> &mut Value {
    if v.get("text_config").is_some() {
        &mut v["text_config"]
    } else {
        v
    }
}

#[test]
fn huge_split_ngram_parts_is_a_missing_shard() {
    // 1e9 aborted the process (a 1e9-entry allocation); 2^60 panicked
    // (capacity overflow).
    for parts in [1_000_000_000u64, 1 << 60, u64::MAX] {
        let tmp = tempfile::tempdir().unwrap();
        let ck = small_checkpoint(tmp.path());
        edit_config(&ck, |v| {
            text_config(v)["split_ngram_parts"] = parts.into();
        });
        let e = CheckpointTable::open(&ck).expect_err("must be refused");
        assert!(
            matches!(&e, CheckpointError::MissingShard { index: 4, expected, .. }
                if expected.ends_with("shard_4.weight")),
            "{parts}: {e}"
        );
        let e = Table::open(&ck).expect_err("must be refused");
        assert!(e.to_string().contains("shard_4.weight"), "{e}");
    }
}

#[test]
fn config_numbers_beyond_the_tensors_are_refused_before_deriving() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = small_checkpoint(tmp.path());
    // A base near 2^40 with many PLE layers would walk 2^18 primes of
    // 2^40; the tensors hold far fewer rows, so nothing is derived.
    edit_config(&ck, |v| {
        let t = text_config(v);
        t["ngram_vocab_size_base"] = ((1u64 << 40) - 1).into();
    });
    let e = CheckpointTable::open(&ck).expect_err("must be refused");
    assert!(matches!(&e, CheckpointError::Config { .. }), "{e}");
    assert!(e.to_string().contains("ngram_vocab_size_base"), "{e}");
}

#[test]
fn an_index_naming_a_fifo_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = small_checkpoint(tmp.path());
    let fifo = ck.join("fifo.safetensors");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let idx = ck.join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&idx).unwrap()).unwrap();
    for (_, f) in v["weight_map"].as_object_mut().unwrap().iter_mut() {
        *f = "fifo.safetensors".into();
    }
    std::fs::write(&idx, v.to_string()).unwrap();
    let e = Table::open(&ck).expect_err("must be refused");
    let text = e.to_string();
    assert!(
        text.contains("FIFO") && text.contains("fifo.safetensors"),
        "{text}"
    );
    // The index itself as a FIFO.
    std::fs::remove_file(&idx).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(&idx)
        .status()
        .unwrap()
        .success());
    let e = Table::open(&idx).expect_err("must be refused");
    assert!(e.to_string().contains("FIFO"), "{e}");
}

#[test]
fn a_header_starting_with_a_byte_order_mark_says_so() {
    // The message read "first byte Some(239)".
    let mut f = 3u64.to_le_bytes().to_vec();
    f.extend_from_slice(&[0xEF, 0xBB, 0xBF]);
    let e = pleio::safetensors::SafetensorsFile::parse(&f).unwrap_err();
    let text = e.to_string();
    assert!(!text.contains("Some("), "{text}");
    assert!(
        text.contains("0xEF") && text.contains("byte-order mark"),
        "{text}"
    );
    let mut f = 2u64.to_le_bytes().to_vec();
    f.extend_from_slice(b"[]");
    let text = pleio::safetensors::SafetensorsFile::parse(&f)
        .unwrap_err()
        .to_string();
    assert!(text.contains("0x5B '['"), "{text}");
}
