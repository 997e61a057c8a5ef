//! mlx-vlm's `ple-store.json` as a table source: a manifest of the byte
//! ranges of a synthetic checkpoint's shards, written beside (not inside)
//! the checkpoint, opens through `Table::open` and gives the very rows the
//! checkpoint directory gives, through every strategy and output type; a
//! manifest that lies about its ranges is a typed error naming the shard.

use std::path::Path;

use pleio::checkpoint::TableSource;
use pleio::ngram::RowMapper;
use pleio::{Dtype, ErrorKind, Strategy, Table};
use pleio_lab::synth_ckpt::{write_checkpoint, CkptEncoding, CkptSpec};
use serde_json::{json, Value};

/// The manifest of `t` (opened from a checkpoint directory), its file
/// names relative to `source_root`.
fn manifest_of(t: &Table, source_root: &str) -> Value {
    let ck = t.checkpoint().expect("a checkpoint table");
    let fields = ["weight", "scales", "biases"];
    let shards: Vec<Value> = t
        .layout()
        .shards()
        .iter()
        .map(|s| {
            let mut v = json!({"row_start": s.row_start, "row_count": s.rows});
            for (p, field) in s.parts.iter().zip(fields) {
                let (dtype, width) = match (ck.encoding.name(), field) {
                    ("mlx4", "weight") => ("uint32", p.row_bytes / 4),
                    (_, _) => ("bfloat16", p.row_bytes / 2),
                };
                let file = ck.files[p.file].file_name().unwrap().to_str().unwrap();
                v[field] = json!({"file": file, "offset": p.offset, "dtype": dtype,
                                  "shape": [s.rows, width]});
            }
            v
        })
        .collect();
    let quantization = match ck.encoding.name() {
        "mlx4" => json!({"bits": 4, "group_size": 32, "mode": "affine"}),
        _ => Value::Null,
    };
    json!({"version": 2, "layout": "safetensors_ranges", "source_root": source_root,
           "row_width": 160, "row_count": t.rows(), "quantization": quantization,
           "shards": shards})
}

fn write(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

fn gather(t: &Table, s: Strategy, d: Dtype, ids: &[u64]) -> Vec<u8> {
    let mut out = vec![0u8; t.out_bytes(d, ids.len()).unwrap()];
    t.gather_as_with(s, d, ids, &mut out).unwrap();
    out
}

#[test]
fn a_manifest_gives_the_checkpoints_rows() {
    for enc in [CkptEncoding::Mlx4, CkptEncoding::Bf16] {
        let dir = tempfile::tempdir().unwrap();
        let ck_dir = dir.path().join("ck");
        let spec = CkptSpec {
            shards: 8,
            ..CkptSpec::new(enc, 5000, 3, 9)
        };
        write_checkpoint(&spec, &ck_dir, &mut |_| {}).unwrap();
        let from_dir = Table::open(&ck_dir).unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap();
        let manifest = store.join("ple-store.json");
        write(&manifest, &manifest_of(&from_dir, "../ck"));

        let t = Table::open(&manifest).unwrap();
        assert_eq!(t.checkpoint().unwrap().source, TableSource::PleStore);
        assert_eq!(
            (t.rows(), t.row_bytes()),
            (from_dir.rows(), from_dir.row_bytes())
        );
        assert_eq!(t.layout().parts(), from_dir.layout().parts());
        let n = t.rows();
        let ids: Vec<u64> = (0..400)
            .map(|i| (i * 7919) % n)
            .chain([0, n - 1, 3, 3])
            .collect();
        for d in [Dtype::Raw, Dtype::F32, Dtype::Bf16] {
            let want = gather(&from_dir, Strategy::Pread, d, &ids);
            for &s in Strategy::ALL {
                assert!(gather(&t, s, d, &ids) == want, "{enc:?} {s} {d:?}");
            }
        }
        // Row ids from the checkpoint's config.json (found at source_root).
        let tokens = [11u32, 2024, 5, 99_000, 7];
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (ra, rb) = (t.row_ids().unwrap(), from_dir.row_ids().unwrap());
        ra.sequence().map_tokens(&tokens, &mut a).unwrap();
        rb.sequence().map_tokens(&tokens, &mut b).unwrap();
        assert_eq!(a.len(), tokens.len() * 16);
        assert_eq!(a, b);
        // The manifest names no tensors: its layer is the config's one
        // ple_layer_ids entry (2, 1-based: decoder layer 1).
        assert_eq!((t.layer(), t.ple_layers()), (Some(1), vec![1]));
        assert!(pleio::OpenOptions::new().layer(1).open(&manifest).is_ok());
        let e = pleio::OpenOptions::new()
            .layer(0)
            .open(&manifest)
            .unwrap_err();
        assert_eq!(e.kind(), pleio::ErrorKind::NoTable, "{e}");
    }
}

#[test]
fn a_lying_manifest_is_an_error_naming_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let ck_dir = dir.path().join("ck");
    let spec = CkptSpec {
        shards: 8,
        ..CkptSpec::new(CkptEncoding::Mlx4, 2000, 2, 3)
    };
    write_checkpoint(&spec, &ck_dir, &mut |_| {}).unwrap();
    let good = manifest_of(&Table::open(&ck_dir).unwrap(), ".");
    let path = ck_dir.join("ple-store.json");
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "past the end",
            Box::new(|m| m["shards"][3]["scales"]["offset"] = json!(1u64 << 40)),
            "shard 3 scales",
        ),
        (
            "gap",
            Box::new(|m| m["shards"][2]["row_start"] = json!(1)),
            "shard 2 starts at row 1",
        ),
        (
            "shape",
            Box::new(|m| m["shards"][1]["weight"]["shape"] = json!([5, 20])),
            "shard 1 weight",
        ),
        (
            "missing part",
            Box::new(|m| {
                m["shards"][4]
                    .as_object_mut()
                    .unwrap()
                    .remove("biases")
                    .map(drop)
                    .unwrap()
            }),
            "shard 4 has no biases",
        ),
        (
            "row count",
            Box::new(|m| m["row_count"] = json!(7)),
            "row_count is 7",
        ),
        (
            "version",
            Box::new(|m| m["version"] = json!(3)),
            "version 3",
        ),
        (
            "bad json",
            Box::new(|m| *m = json!("not a manifest")),
            "ple-store.json",
        ),
    ];
    for (what, edit, says) in cases {
        let mut m = good.clone();
        edit(&mut m);
        write(&path, &m);
        let e = Table::open(&path)
            .err()
            .unwrap_or_else(|| panic!("{what}: opened"));
        assert_eq!(e.kind(), ErrorKind::InvalidFile, "{what}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(says) && text.contains("ple-store.json"),
            "{what}: {text}"
        );
    }
    let mut m = good.clone();
    m["layout"] = json!("interleaved_q4");
    write(&path, &m);
    let e = Table::open(&path).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("interleaved_q4"), "{e}");
}

/// Makes a FIFO at `path` (the `mkfifo` tool).
fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

#[test]
fn a_manifest_reads_only_regular_files_under_its_root_with_checked_widths() {
    let dir = tempfile::tempdir().unwrap();
    let ck_dir = dir.path().join("ck");
    let spec = CkptSpec {
        shards: 2,
        ..CkptSpec::new(CkptEncoding::Bf16, 2000, 1, 3)
    };
    write_checkpoint(&spec, &ck_dir, &mut |_| {}).unwrap();
    let good = manifest_of(&Table::open(&ck_dir).unwrap(), ".");
    let path = ck_dir.join("ple-store.json");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, vec![7u8; 1 << 16]).unwrap();
    mkfifo(&ck_dir.join("fifo"));
    let wide = (1u64 << 63) + 2;
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            // row_width * 2 bytes wrapped to 4-byte rows, and opened.
            "overflowing width",
            Box::new(move |m| {
                m["row_width"] = json!(wide);
                for s in m["shards"].as_array_mut().unwrap() {
                    let rows = s["row_count"].clone();
                    s["weight"]["shape"] = json!([rows, wide]);
                }
            }),
            "overflow",
        ),
        (
            "absolute path",
            Box::new({
                let secret = secret.display().to_string();
                move |m| m["shards"][0]["weight"]["file"] = json!(secret)
            }),
            "not a relative path inside source_root",
        ),
        (
            "dot-dot path",
            Box::new(|m| m["shards"][1]["weight"]["file"] = json!("../secret")),
            "not a relative path inside source_root",
        ),
    ];
    for (what, edit, says) in cases {
        let mut m = good.clone();
        edit(&mut m);
        write(&path, &m);
        let e = Table::open(&path)
            .err()
            .unwrap_or_else(|| panic!("{what}: opened"));
        assert_eq!(e.kind(), ErrorKind::InvalidFile, "{what}: {e}");
        let text = e.to_string();
        assert!(text.contains(says), "{what}: {text}");
    }
    // A FIFO is refused at once (the open used to block forever).
    let mut m = good.clone();
    m["shards"][0]["weight"]["file"] = json!("fifo");
    write(&path, &m);
    let e = Table::open(&path).expect_err("a FIFO opened");
    assert!(e.to_string().contains("FIFO"), "{e}");
    // The manifest itself as a FIFO.
    let fifo_manifest = dir.path().join("fifo-store");
    std::fs::create_dir(&fifo_manifest).unwrap();
    mkfifo(&fifo_manifest.join("ple-store.json"));
    let e = Table::open(fifo_manifest.join("ple-store.json")).expect_err("a FIFO manifest opened");
    assert!(e.to_string().contains("FIFO"), "{e}");
}
