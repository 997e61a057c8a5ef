//! Malformed safetensors files and checkpoints, enumerated: each gives its
//! own typed error naming the file and tensor at fault, never a panic; and
//! a property test that pleio's header reader accepts exactly what the
//! reference reader (the `safetensors` crate) accepts, with the same
//! tensors.

use std::path::Path;

use pleio::checkpoint::{CheckpointError, CheckpointTable};
use pleio::quant::encoding::Encoding;
use pleio::safetensors::{Dtype, SafetensorsError as E, SafetensorsFile, SafetensorsWriter};
use proptest::prelude::*;

/// A file: the 8-byte length, the header text, `data` zero bytes.
fn file(header: &str, data: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.resize(v.len() + data, 0);
    v
}

fn err(bytes: &[u8]) -> E {
    SafetensorsFile::parse(bytes).expect_err("must be refused")
}

const T: &str = r#""t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;

#[test]
fn well_formed_parses() {
    let h = format!(
        r#"{{"__metadata__":{{"format":"pt"}},{T},"u":{{"dtype":"BF16","shape":[],"data_offsets":[8,10]}}}}"#
    );
    let f = SafetensorsFile::parse(&file(&h, 10)).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert_eq!(f.tensor("u").unwrap().shape, Vec::<u64>::new());
    assert_eq!(f.metadata(), &[("format".to_string(), "pt".to_string())]);
    assert_eq!(
        f.tensor_range(f.tensor("u").unwrap()),
        8 + h.len() as u64 + 8..18 + h.len() as u64
    );
}

#[test]
fn truncated_and_lengths_past_eof() {
    assert!(matches!(err(&[1, 2, 3]), E::TooShort { file_size: 3 }));
    let mut f = file(&format!("{{{T}}}"), 8);
    let len = f.len() as u64;
    f[..8].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(err(&f), E::HeaderPastEnd { .. }));
    f[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(err(&f), E::HeaderTooLarge { len: u64::MAX, .. }));
    f[..8].copy_from_slice(&100_000_001u64.to_le_bytes());
    assert!(matches!(err(&f), E::HeaderTooLarge { .. }));
    // The whole header must be given to the parser.
    let f = file(&format!("{{{T}}}"), 8);
    let e = SafetensorsFile::parse_header(&f[..20], f.len() as u64).unwrap_err();
    assert!(matches!(e, E::Truncated { available: 20, .. }));
    // Data cut short: the tensor runs past the end.
    let e = err(&f[..f.len() - 1]);
    assert!(
        matches!(&e, E::TensorPastEnd { tensor, .. } if tensor == "t"),
        "{e}"
    );
}

#[test]
fn header_text_errors() {
    assert!(matches!(
        err(&file("[1]", 0)),
        E::HeaderNotObject { first: Some(b'[') }
    ));
    assert!(matches!(err(&file(" {}", 0)), E::HeaderNotObject { .. }));
    let mut bad_utf8 = file("{\"xx\":1}", 0);
    bad_utf8[10] = 0xFF;
    assert!(matches!(
        err(&bad_utf8),
        E::HeaderNotUtf8 { valid_up_to: 2 }
    ));
    assert!(matches!(
        err(&file(&format!("{{{T}"), 8)),
        E::BadJson { .. }
    ));
    assert!(matches!(
        err(&file(&format!("{{{T}}} x"), 8)),
        E::BadJson { .. }
    ));
    let e = err(&file(r#"{"w":{"dtype":"F32","shape":[2]}}"#, 0));
    assert!(
        matches!(&e, E::BadJson { message } if message.contains("`w`") && message.contains("data_offsets")),
        "{e}"
    );
    let e = err(&file(r#"{"__metadata__":{"k":1}}"#, 0));
    assert!(
        matches!(&e, E::BadJson { message } if message.contains("__metadata__")),
        "{e}"
    );
    // Trailing spaces (the writers' padding) are fine.
    SafetensorsFile::parse(&file(&format!("{{{T}}}    "), 8)).unwrap();
}

#[test]
fn tensor_entry_errors_name_the_tensor() {
    let one = |entry: &str, data: usize| err(&file(&format!("{{\"w\":{entry}}}"), data));
    let e = one(r#"{"dtype":"F12","shape":[2],"data_offsets":[0,8]}"#, 8);
    assert!(matches!(&e, E::UnknownDtype { tensor, dtype } if tensor == "w" && dtype == "F12"));
    let e = one(r#"{"dtype":"F32","shape":[2],"data_offsets":[8,0]}"#, 8);
    assert!(matches!(&e, E::ReversedOffsets { tensor, .. } if tensor == "w"));
    let e = one(
        r#"{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}"#,
        8,
    );
    assert!(
        matches!(&e, E::ShapeOverflow { tensor, .. } if tensor == "w"),
        "{e}"
    );
    let e = one(
        r#"{"dtype":"F64","shape":[2305843009213693952,4],"data_offsets":[0,8]}"#,
        8,
    );
    assert!(matches!(e, E::ShapeOverflow { .. }), "{e}");
    let e = one(r#"{"dtype":"F32","shape":[3],"data_offsets":[0,8]}"#, 8);
    assert!(matches!(&e, E::SizeMismatch { tensor, expected: 12, found: 8, .. } if tensor == "w"));
    let e = one(r#"{"dtype":"F4","shape":[3],"data_offsets":[0,1]}"#, 1);
    assert!(matches!(e, E::NotWholeBytes { elems: 3, .. }));
    let e = one(r#"{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}"#, 8);
    assert!(
        matches!(&e, E::BadJson { message } if message.contains("`w`")),
        "{e}"
    );
    let e = one(r#"{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}"#, 8);
    assert!(matches!(e, E::BadJson { .. }));
    let dims = vec!["1"; 17].join(",");
    let e = one(
        &format!(r#"{{"dtype":"F32","shape":[{dims}],"data_offsets":[0,4]}}"#),
        4,
    );
    assert!(
        matches!(&e, E::BadJson { message } if message.contains("more than 16")),
        "{e}"
    );
    let e = one(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#, 4);
    assert!(matches!(&e, E::TensorPastEnd { tensor, end: 8, data_len: 4, .. } if tensor == "w"));
    let e = one(
        r#"{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,0]}"#,
        4,
    );
    assert!(matches!(e, E::ReversedOffsets { .. }));
}

#[test]
fn layout_errors() {
    let two = |a: [u64; 2], b: [u64; 2], data: usize| {
        let h = format!(
            r#"{{"a":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}},"b":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}}}}"#,
            a[1] - a[0],
            a[0],
            a[1],
            b[1] - b[0],
            b[0],
            b[1]
        );
        SafetensorsFile::parse(&file(&h, data))
    };
    two([0, 8], [8, 12], 12).unwrap();
    let e = two([0, 8], [4, 12], 12).unwrap_err();
    assert!(
        matches!(&e, E::Overlap { first, second, first_end: 8, second_start: 4, .. } if first == "a" && second == "b"),
        "{e}"
    );
    let e = two([0, 12], [4, 6], 12).unwrap_err();
    assert!(
        matches!(&e, E::Overlap { first, second, .. } if first == "a" && second == "b"),
        "{e}"
    );
    let e = two([0, 4], [8, 12], 12).unwrap_err();
    assert!(
        matches!(&e, E::Gap { start: 4, end: 8, next } if next == "b"),
        "{e}"
    );
    let e = two([0, 4], [4, 8], 12).unwrap_err();
    assert!(matches!(e, E::TrailingBytes { extra: 4, .. }), "{e}");
    let e = two([4, 8], [8, 12], 12).unwrap_err();
    assert!(
        matches!(&e, E::Gap { start: 0, end: 4, next } if next == "a"),
        "{e}"
    );
    let h = format!("{{{T},{T}}}");
    assert!(matches!(err(&file(&h, 8)), E::DuplicateTensor { tensor } if tensor == "t"));
    // No tensors at all, no data: valid (the reference agrees).
    SafetensorsFile::parse(&file("{}", 0)).unwrap();
}

#[test]
fn open_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("bad.safetensors");
    std::fs::write(&p, file(&format!("{{{T}}}"), 7)).unwrap();
    let e = SafetensorsFile::open(&p).unwrap_err();
    assert_eq!(e.path(), Some(p.as_path()));
    assert!(matches!(e.root(), E::TensorPastEnd { .. }));
    assert!(
        e.to_string().contains("bad.safetensors") && e.to_string().contains("`t`"),
        "{e}"
    );
    let e = SafetensorsFile::open(&tmp.path().join("none.safetensors")).unwrap_err();
    assert!(matches!(e, E::Io { path: Some(_), .. }));
    std::fs::write(&p, [1u8, 2]).unwrap();
    assert!(matches!(
        SafetensorsFile::open(&p).unwrap_err().root(),
        E::TooShort { .. }
    ));
}

// ---- checkpoints ----

/// A tensor to write: name, dtype, shape, leading bytes (zeros after).
type Spec = (String, Dtype, Vec<u64>, Vec<u8>);

/// Writes a safetensors file of the given tensors.
fn write_st(path: &Path, tensors: &[Spec]) {
    let mut w = SafetensorsWriter::create(path).unwrap();
    for (name, dtype, shape, _) in tensors {
        w.add_tensor(name, *dtype, shape).unwrap();
    }
    w.begin_data().unwrap();
    for (_, dtype, shape, bytes) in tensors {
        let n = shape.iter().product::<u64>() * dtype.size().unwrap();
        let mut b = bytes.clone();
        b.resize(n as usize, 0);
        w.write_tensor_data(&b).unwrap();
    }
    w.finish().unwrap();
}

const P: &str = "model.language_model.layers.1.ple.ple_embedding.ngram_embedding.";

fn shard(i: usize, width: u64) -> Spec {
    (
        format!("{P}shard_{i}.weight"),
        Dtype::BF16,
        vec![4, width],
        vec![],
    )
}

fn write_ckpt(dir: &Path, files: &[Vec<Spec>], index: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let mut map = serde_json::Map::new();
    for (k, f) in files.iter().enumerate() {
        let name = format!("model-{k}.safetensors");
        write_st(&dir.join(&name), f);
        for (n, ..) in f {
            map.insert(n.clone(), name.clone().into());
        }
    }
    if index {
        let idx = serde_json::json!({"metadata": {}, "weight_map": map});
        std::fs::write(dir.join("model.safetensors.index.json"), idx.to_string()).unwrap();
    }
}

fn open_err(dir: &Path) -> CheckpointError {
    CheckpointTable::open(dir).expect_err("must be refused")
}

#[test]
fn checkpoint_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let d = |n: &str| tmp.path().join(n);

    // Three shards over two files, fine.
    write_ckpt(
        &d("ok"),
        &[vec![shard(0, 8), shard(2, 8)], vec![shard(1, 8)]],
        true,
    );
    let t = CheckpointTable::open(&d("ok")).unwrap();
    assert_eq!((t.rows, t.row_elems, t.shards.len()), (12, 8, 3));

    // A shard missing from the index.
    write_ckpt(&d("missing"), &[vec![shard(0, 8), shard(2, 8)]], true);
    let e = open_err(&d("missing"));
    assert!(
        matches!(&e, CheckpointError::MissingShard { index: 1, count: 3, expected } if expected.ends_with("shard_1.weight")),
        "{e}"
    );

    // Shards of different widths.
    write_ckpt(&d("widths"), &[vec![shard(0, 8), shard(1, 16)]], true);
    let e = open_err(&d("widths"));
    assert!(
        matches!(&e, CheckpointError::ShardMismatch { what: "width", tensor, .. } if tensor.contains("shard_1")),
        "{e}"
    );

    // The index names a file that lacks the tensor.
    write_ckpt(&d("lying"), &[vec![shard(0, 8)], vec![shard(1, 8)]], true);
    let idx = d("lying").join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&idx)
        .unwrap()
        .replace("model-1", "model-0");
    std::fs::write(&idx, text).unwrap();
    let e = open_err(&d("lying"));
    assert!(
        matches!(&e, CheckpointError::NotInFile { tensor, .. } if tensor.contains("shard_1")),
        "{e}"
    );

    // An index escaping the directory, or mapping a tensor twice.
    std::fs::write(&idx, r#"{"weight_map": {"a": "../x.safetensors"}}"#).unwrap();
    assert!(
        matches!(open_err(&d("lying")), CheckpointError::Safetensors(ref s) if matches!(s.root(), E::BadIndex { .. }))
    );
    std::fs::write(&idx, r#"{"weight_map": {"a": "x", "a": "y"}}"#).unwrap();
    let e = open_err(&d("lying"));
    assert!(e.to_string().contains("mapped twice"), "{e}");
    std::fs::write(&idx, "{").unwrap();
    assert!(matches!(
        open_err(&d("lying")),
        CheckpointError::Safetensors(_)
    ));

    // A header error inside a checkpoint names the file.
    write_ckpt(&d("hdr"), &[vec![shard(0, 8)]], false);
    std::fs::write(d("hdr").join("model-0.safetensors"), file("{\"x\":", 0)).unwrap();
    let e = open_err(&d("hdr"));
    assert!(e.to_string().contains("model-0.safetensors"), "{e}");

    // The same tensor in two files (no index).
    write_ckpt(&d("dup"), &[vec![shard(0, 8)], vec![shard(0, 8)]], false);
    assert!(matches!(
        open_err(&d("dup")),
        CheckpointError::DuplicateTensor { .. }
    ));

    // FP8 without a scale.
    let fp8 = |i: usize| {
        (
            format!("{P}shard_{i}.weight"),
            Dtype::F8_E4M3,
            vec![4, 16],
            vec![],
        )
    };
    write_ckpt(&d("noscale"), &[vec![fp8(0), fp8(1)]], true);
    assert!(matches!(
        open_err(&d("noscale")),
        CheckpointError::MissingScale { .. }
    ));

    // NVFP4 global scales that differ.
    let nv = |i: usize, g: f32| {
        vec![
            (
                format!("{P}shard_{i}.weight"),
                Dtype::U8,
                vec![4, 8],
                vec![],
            ),
            (
                format!("{P}shard_{i}.weight_scale"),
                Dtype::F8_E4M3,
                vec![4, 1],
                vec![],
            ),
            (
                format!("{P}shard_{i}.weight_scale_2"),
                Dtype::F32,
                vec![],
                g.to_le_bytes().to_vec(),
            ),
        ]
    };
    let mut f = nv(0, 0.5);
    f.extend(nv(1, 0.25));
    write_ckpt(&d("nvfp4"), &[f], true);
    let e = open_err(&d("nvfp4"));
    assert!(
        matches!(&e, CheckpointError::ScaleMismatch { tensor, .. } if tensor.contains("shard_1.weight_scale_2")),
        "{e}"
    );

    // vLLM's NVFP4 layout: one table-level `weight_scale_2`, no per-shard
    // ones; it is the global scale. Without any: named; not F32: refused.
    let blocks = |i: usize| {
        let mut v = nv(i, 0.0);
        v.pop();
        v
    };
    let mut f = blocks(0);
    f.extend(blocks(1));
    write_ckpt(&d("nvfp4-none"), &[f.clone()], true);
    let e = open_err(&d("nvfp4-none"));
    assert!(
        matches!(&e, CheckpointError::MissingGlobalScale { .. })
            && e.to_string().contains("weight_scale_2"),
        "{e}"
    );
    let table_scale = |dtype: Dtype, bytes: Vec<u8>| {
        let mut f = f.clone();
        f.push((format!("{P}weight_scale_2"), dtype, vec![1], bytes));
        f
    };
    write_ckpt(
        &d("nvfp4-table"),
        &[table_scale(Dtype::F32, 0.375f32.to_le_bytes().to_vec())],
        true,
    );
    let t = CheckpointTable::open(&d("nvfp4-table")).unwrap();
    assert_eq!(
        (t.encoding, t.rows, t.row_elems),
        (
            Encoding::Nvfp4 {
                global_scale: 0.375
            },
            8,
            16
        )
    );
    write_ckpt(
        &d("nvfp4-bf16"),
        &[table_scale(Dtype::BF16, vec![0xc0, 0x3e])],
        true,
    );
    let e = open_err(&d("nvfp4-bf16"));
    assert!(e.to_string().contains("weight_scale_2"), "{e}");

    // Two PLE layers are two tables, each opened by its layer; two tables
    // of one layer (another prefix spelling the same `layers.1.`, or HF and
    // MLX names) are ambiguous; none at all.
    let other = (
        "model.language_model.layers.3.ple.ple_embedding.ngram_embedding.shard_0.weight"
            .to_string(),
        Dtype::BF16,
        vec![6, 8],
        vec![],
    );
    write_ckpt(&d("two"), &[vec![shard(0, 8), other]], true);
    let t = CheckpointTable::open(&d("two")).unwrap();
    assert_eq!(
        (t.layer, t.ple_layers.clone(), t.rows),
        (Some(1), vec![1, 3], 4)
    );
    let t = CheckpointTable::open_layer(&d("two"), Some(3)).unwrap();
    assert_eq!((t.layer, t.rows), (Some(3), 6));
    assert_eq!(t.ple_layer_index().unwrap(), 1);
    let e = CheckpointTable::open_layer(&d("two"), Some(2)).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::NoSuchLayer { layer: 2, layers } if layers == &[1, 3]),
        "{e}"
    );
    assert!(e.to_string().contains("[1, 3]"), "{e}");
    // transformers' save_pretrained of a CausalLM: `model.layers.{i}.`,
    // one unsplit table per layer.
    let unsplit = |l: u64, rows: u64| {
        (
            format!("model.layers.{l}.ple.ple_embedding.ngram_embedding.weight"),
            Dtype::BF16,
            vec![rows, 8],
            vec![],
        )
    };
    write_ckpt(&d("unsplit"), &[vec![unsplit(2, 5), unsplit(0, 3)]], false);
    let t = CheckpointTable::open(&d("unsplit")).unwrap();
    assert_eq!(
        (t.layer, t.ple_layers.clone(), t.rows),
        (Some(0), vec![0, 2], 3)
    );
    let t = CheckpointTable::open_layer(&d("unsplit"), Some(2)).unwrap();
    assert_eq!((t.layer, t.rows, t.shards.len()), (Some(2), 5, 1));
    assert_eq!(t.prefix, "model.layers.2.ple.ple_embedding.");
    let same_layer = (
        "model.layers.1.ple.ple_embedding.ngram_embedding.shard_0.weight".to_string(),
        Dtype::BF16,
        vec![4, 8],
        vec![],
    );
    write_ckpt(&d("same"), &[vec![shard(0, 8), same_layer]], true);
    assert!(matches!(
        open_err(&d("same")),
        CheckpointError::AmbiguousTable { .. }
    ));
    let mlx_same = (
        "model.language_model.layers.1.ple.ple_embedding.ngram_embedding.shards.0.weight"
            .to_string(),
        Dtype::BF16,
        vec![4, 8],
        vec![],
    );
    write_ckpt(&d("spellings"), &[vec![shard(0, 8), mlx_same]], true);
    assert!(matches!(
        open_err(&d("spellings")),
        CheckpointError::AmbiguousTable { .. }
    ));
    let gemma = |n: &str| (n.to_string(), Dtype::BF16, vec![4, 8], vec![]);
    write_ckpt(
        &d("gemmas"),
        &[vec![
            gemma("model.language_model.embed_tokens_per_layer.weight"),
            gemma("model.embed_tokens_per_layer.weight"),
        ]],
        true,
    );
    assert!(matches!(
        open_err(&d("gemmas")),
        CheckpointError::AmbiguousTable { .. }
    ));
    write_ckpt(
        &d("none"),
        &[vec![("x".into(), Dtype::U8, vec![3], vec![])]],
        true,
    );
    assert!(matches!(
        open_err(&d("none")),
        CheckpointError::NoTable { .. }
    ));

    // A config whose split_ngram_parts leaves a shard out, and one whose
    // derived rows or buffers disagree with the checkpoint.
    let cfg = |parts: u64, base: u64| {
        serde_json::json!({"text_config": {"ngram_size": 3, "heads_per_ngram": 8,
            "ngram_vocab_size_base": base, "make_ngram_vocab_size_divisible_by": 128,
            "split_ngram_parts": parts, "vocab_size": 248320, "eos_token_id": 248044}})
        .to_string()
    };
    std::fs::write(d("ok").join("config.json"), cfg(2, 2)).unwrap();
    let e = open_err(&d("ok"));
    assert!(
        matches!(
            &e,
            CheckpointError::ExtraShard {
                index: 2,
                count: 2,
                ..
            }
        ),
        "{e}"
    );
    // 16 heads of at least ngram_vocab_size_base rows each cannot fit in
    // the 12 rows the tensors hold: refused before any prime is derived.
    std::fs::write(d("ok").join("config.json"), cfg(3, 2)).unwrap();
    let e = open_err(&d("ok"));
    assert!(
        matches!(&e, CheckpointError::Config { .. })
            && e.to_string().contains("more than the table's 12")
            // the file is named once (its path), not again by the message
            && e.to_string().matches("config.json").count() == 1,
        "{e}"
    );
    // A table on a layer config.json's ple_layer_ids does not list.
    let mut c: serde_json::Value = serde_json::from_str(&cfg(3, 2)).unwrap();
    c["text_config"]["ple_layer_ids"] = serde_json::json!([1, 3]);
    std::fs::write(d("ok").join("config.json"), c.to_string()).unwrap();
    let e = open_err(&d("ok"));
    assert!(
        matches!(&e, CheckpointError::LayerNotInConfig { layer: 1, ids } if ids == &[1, 3]),
        "{e}"
    );
    std::fs::write(d("ok").join("config.json"), "{not json").unwrap();
    assert!(matches!(open_err(&d("ok")), CheckpointError::Config { .. }));

    // Buffers that disagree with the config: 3 shards of 128 rows = 384,
    // the rows the config's smallest primes give.
    let wide = |i: usize| {
        (
            format!("{P}shard_{i}.weight"),
            Dtype::BF16,
            vec![128, 8],
            vec![],
        )
    };
    let buf = |name: &str, vals: &[u64]| {
        (
            format!("model.language_model.layers.1.ple.ple_embedding.{name}"),
            Dtype::I64,
            vec![vals.len() as u64],
            vals.iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    };
    write_ckpt(
        &d("buf"),
        &[vec![
            wide(0),
            wide(1),
            wide(2),
            buf("layer_multipliers", &[1, 2, 3]),
        ]],
        true,
    );
    std::fs::write(d("buf").join("config.json"), cfg(3, 2)).unwrap();
    let e = open_err(&d("buf"));
    assert!(
        matches!(&e, CheckpointError::BufferMismatch { tensor, .. } if tensor.ends_with("layer_multipliers")),
        "{e}"
    );
}

// ---- the reference reader as an oracle ----

/// A random header: up to 4 tensors with dtypes (some bogus), shapes and
/// offsets near consistent, plus a data section of nearly the right size.
fn arb_file() -> impl Strategy<Value = Vec<u8>> {
    let dtype = prop::sample::select(vec![
        "F32", "BF16", "U8", "F8_E4M3", "I64", "F4", "F6_E2M3", "Q4",
    ]);
    let dim = prop_oneof![8 => 0u64..5, 1 => Just(1u64 << 62), 1 => Just(3u64)];
    let tensor = (dtype, prop::collection::vec(dim, 0..4), -2i64..3);
    (
        prop::collection::vec(tensor, 0..5),
        any::<u64>(),
        -3i64..4,
        any::<bool>(),
    )
        .prop_map(|(ts, seed, data_skew, shuffle)| {
            let mut pos = 0u64;
            let mut entries = Vec::new();
            for (i, (dt, shape, skew)) in ts.iter().enumerate() {
                let bits: u64 = match *dt {
                    "F32" => 32,
                    "BF16" => 16,
                    "I64" => 64,
                    "F4" => 4,
                    "F6_E2M3" => 6,
                    _ => 8,
                };
                let n = shape
                    .iter()
                    .try_fold(1u64, |a, &d| a.checked_mul(d))
                    .and_then(|n| n.checked_mul(bits))
                    .map_or(16, |b| b / 8);
                let len = n.min(64).saturating_add_signed(*skew);
                let (s, e) = (pos, pos + len);
                pos = e;
                let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
                entries.push(format!(
                    r#""t{i}":{{"dtype":"{dt}","shape":[{}],"data_offsets":[{s},{e}]}}"#,
                    dims.join(",")
                ));
            }
            if shuffle && entries.len() > 1 {
                let k = (seed % entries.len() as u64) as usize;
                entries.rotate_left(k);
            }
            let h = format!("{{{}}}", entries.join(","));
            file(&h, pos.saturating_add_signed(data_skew) as usize)
        })
}

/// Compares both readers on one file; returns whether it was accepted.
fn same_verdict(bytes: &[u8]) -> bool {
    let ours = SafetensorsFile::parse(bytes);
    let theirs = ::safetensors::SafeTensors::read_metadata(bytes);
    assert_eq!(
        ours.is_ok(),
        theirs.is_ok(),
        "ours: {:?}",
        ours.as_ref().err()
    );
    let (Ok(f), Ok((n, m))) = (ours, theirs) else {
        return false;
    };
    assert_eq!(f.header_len(), n as u64);
    let tensors = m.tensors();
    assert_eq!(f.tensors().len(), tensors.len());
    for t in f.tensors() {
        let r = tensors[&t.name];
        assert_eq!(t.dtype.name(), format!("{:?}", r.dtype));
        let shape: Vec<u64> = r.shape.iter().map(|&d| d as u64).collect();
        assert_eq!(t.shape, shape);
        assert_eq!(
            (t.data.start, t.data.end),
            (r.data_offsets.0 as u64, r.data_offsets.1 as u64)
        );
    }
    true
}

#[test]
fn accepts_exactly_what_the_reference_accepts() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(Config::default().rng_algorithm),
    );
    let strategy = arb_file();
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..20_000 {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        if same_verdict(&bytes) {
            ok += 1;
        } else {
            refused += 1;
        }
    }
    // Both verdicts are well represented, so the comparison means something.
    assert!(
        ok > 2_000 && refused > 2_000,
        "accepted {ok}, refused {refused}"
    );
}
