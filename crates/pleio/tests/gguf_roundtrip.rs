//! Files written with `GgufWriter` read back identically, alone and as
//! split sets opened through `Model`.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use pleio::gguf::{
    split_path, Array, GgufError, GgufFile, GgufWriter, Value, ValueType, SPLIT_COUNT_KEY,
    SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY,
};
use pleio::model::Model;
use pleio::quant::GgmlType;
use pleio_lab::random::Rng;

/// Metadata with every value type, extremes, empty strings and arrays,
/// nested arrays.
fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::from("qwen4exp")),
        ("v.u8", Value::U8(u8::MAX)),
        ("v.i8", Value::I8(i8::MIN)),
        ("v.u16", Value::U16(u16::MAX)),
        ("v.i16", Value::I16(-2)),
        ("v.u32", Value::U32(248_044)),
        ("v.i32", Value::I32(i32::MIN)),
        ("v.f32", Value::F32(-1.25e-7)),
        ("v.bool", Value::Bool(false)),
        ("v.string", Value::from("Grüße, 世界")),
        ("v.empty_string", Value::from("")),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f64", Value::F64(std::f64::consts::PI)),
        ("a.u8", Value::from(vec![0u8, 255])),
        ("a.i8", Value::from(vec![-128i8, 127])),
        ("a.u16", Value::from(vec![1u16])),
        ("a.i16", Value::from(vec![-1i16, 0, 1])),
        ("a.u32", Value::from((0..1000u32).collect::<Vec<_>>())),
        ("a.i32", Value::from(vec![i32::MAX])),
        ("a.f32", Value::from(vec![0.5f32, -0.0, f32::INFINITY])),
        ("a.bool", Value::from(vec![true, false, true])),
        (
            "a.string",
            Value::from(vec!["a".to_owned(), String::new(), "ü".to_owned()]),
        ),
        (
            "a.u64",
            Value::from(vec![23_703_573_157_769u64, 20_109_073_645_365]),
        ),
        ("a.i64", Value::from(vec![-1i64])),
        ("a.f64", Value::from(vec![1e300f64])),
        ("a.empty_u32", Value::from(Vec::<u32>::new())),
        ("a.empty_string", Value::from(Vec::<String>::new())),
        ("a.empty_nested", Value::from(Array::Array(vec![]))),
        (
            "a.nested",
            Value::from(Array::Array(vec![
                Array::from(vec![1u64, 2]),
                Array::from(Vec::<bool>::new()),
                Array::Array(vec![
                    Array::from(vec!["deep".to_owned()]),
                    Array::Array(vec![]),
                ]),
            ])),
        ),
    ]
}

/// Tensors of several types and sizes (none a multiple of 64 bytes), one
/// scalar and one empty.
fn tensor_specs() -> Vec<(&'static str, GgmlType, Vec<u64>)> {
    vec![
        ("t.f32", GgmlType::F32, vec![3]),
        ("t.q4_0", GgmlType::Q4_0, vec![64, 3]),
        ("t.empty", GgmlType::Q8_0, vec![32, 0]),
        (
            "per_layer_token_embd.weight",
            GgmlType::IQ4_NL,
            vec![160, 5],
        ),
        ("t.f16", GgmlType::F16, vec![7, 2, 3]),
        ("t.scalar", GgmlType::I8, vec![]),
        ("t.q5_k", GgmlType::Q5_K, vec![256, 2]),
    ]
}

/// Writes `metadata` and tensors `specs` with seeded random data, streamed
/// in `piece`-byte chunks that cross tensor boundaries; returns each
/// tensor's bytes.
fn write_file(
    path: &Path,
    metadata: &[(&str, Value)],
    specs: &[(&str, GgmlType, Vec<u64>)],
    seed: u64,
    piece: usize,
) -> Vec<Vec<u8>> {
    let mut w = GgufWriter::create(path).unwrap();
    for (k, v) in metadata {
        w.add_metadata(*k, v.clone()).unwrap();
    }
    for (name, ty, dims) in specs {
        w.add_tensor(*name, *ty, dims).unwrap();
    }
    w.begin_data().unwrap();
    let mut rng = Rng::new(seed);
    let datas: Vec<Vec<u8>> = w
        .tensors()
        .iter()
        .map(|t| {
            let mut d = vec![0u8; t.n_bytes as usize];
            rng.fill_bytes(&mut d);
            d
        })
        .collect();
    for chunk in datas.concat().chunks(piece) {
        w.write_tensor_data(chunk).unwrap();
    }
    w.finish().unwrap();
    datas
}

fn check_file(
    path: &Path,
    metadata: &[(&str, Value)],
    specs: &[(&str, GgmlType, Vec<u64>)],
    datas: &[Vec<u8>],
) {
    let bytes = std::fs::read(path).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.version(), 3);
    let alignment = metadata
        .iter()
        .find(|(k, _)| *k == "general.alignment")
        .map_or(32, |(_, v)| v.as_u64().unwrap());
    assert_eq!(f.alignment(), alignment);
    assert_eq!(f.data_offset() % alignment, 0);
    let got: Vec<(&str, &Value)> = f.metadata().iter().collect();
    let want: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    assert_eq!(got, want);
    assert_eq!(f.tensors().len(), specs.len());
    let mut end = 0u64;
    for ((t, (name, ty, dims)), data) in f.tensors().iter().zip(specs).zip(datas) {
        assert_eq!((t.name.as_str(), t.ty, &t.dims), (*name, *ty, dims));
        assert_eq!(t.n_elems, dims.iter().product::<u64>());
        assert_eq!(
            t.n_bytes,
            ty.row_bytes(dims.first().copied().unwrap_or(1)).unwrap() * t.n_rows()
        );
        assert_eq!(t.offset % alignment, 0);
        assert_eq!(t.offset, end.next_multiple_of(alignment));
        end = t.offset + t.n_bytes;
        assert_eq!(f.tensor_data(&bytes, t).unwrap(), data.as_slice(), "{name}");
        assert_eq!(f.tensor(name), Some(t));
    }
    // The data section ends padded to the alignment.
    assert_eq!(
        bytes.len() as u64,
        f.data_offset() + end.next_multiple_of(alignment)
    );
}

#[test]
fn every_value_type_and_tensor_type_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    for (i, alignment) in [None, Some(1u32), Some(8), Some(64), Some(4096)]
        .into_iter()
        .enumerate()
    {
        let mut metadata = all_values();
        if let Some(a) = alignment {
            metadata.insert(3, ("general.alignment", Value::U32(a)));
        }
        let path = dir.path().join(format!("m{i}.gguf"));
        let datas = write_file(&path, &metadata, &tensor_specs(), i as u64, 7 + 100 * i);
        check_file(&path, &metadata, &tensor_specs(), &datas);

        let model = Model::open(&path).unwrap();
        assert_eq!(model.architecture(), Some("qwen4exp"));
        assert_eq!(model.shards().len(), 1);
        let shard = &model.shards()[0];
        assert_eq!(shard.path(), path);
        assert_eq!(shard.file_len(), std::fs::metadata(&path).unwrap().len());
        assert_eq!(shard.tensor_count(), datas.len());
        for (t, data) in model.tensors().iter().zip(&datas) {
            assert_eq!(t.shard, 0);
            assert_eq!(t.file_offset, shard.data_offset() + t.info.offset);
            assert_eq!(model.tensor_data(t).unwrap(), data.as_slice());
        }
    }
}

#[test]
fn value_display_and_accessors_after_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write_file(&path, &all_values(), &[], 0, 1);
    let model = Model::open(&path).unwrap();
    let md = model.metadata();
    assert_eq!(
        md.get("a.u32").unwrap().to_string(),
        "[u32; 1000] [0, 1, 2, ...]"
    );
    assert_eq!(
        md.get("a.u64").and_then(Value::as_u64_array),
        Some(vec![23_703_573_157_769, 20_109_073_645_365])
    );
    assert_eq!(md.get("v.u32").and_then(Value::as_u32), Some(248_044));
    assert_eq!(md.get("v.i8").and_then(Value::as_i64), Some(-128));
    assert_eq!(md.get("v.i8").and_then(Value::as_u64), None);
    assert_eq!(md.get("v.empty_string").and_then(Value::as_str), Some(""));
    let nested = md.get("a.nested").and_then(Value::as_array).unwrap();
    assert_eq!((nested.element_type(), nested.len()), (ValueType::Array, 3));
    assert!(md.get("missing").is_none());
}

/// Writes a 3-shard set the way gguf-split does: metadata in shard 0,
/// split keys in every shard.
fn write_split_set(stem: &Path) -> Vec<(String, Vec<u8>)> {
    let count = 3u16;
    let shards: [&[(&str, GgmlType, Vec<u64>)]; 3] = [
        &[("token_embd.weight", GgmlType::Q8_0, vec![64, 4])],
        &[
            (
                "per_layer_token_embd.weight",
                GgmlType::IQ4_NL,
                vec![160, 9],
            ),
            ("blk.0.attn_q.weight", GgmlType::F16, vec![8, 8]),
        ],
        &[("output.weight", GgmlType::Q4_0, vec![32, 3])],
    ];
    let mut all = Vec::new();
    for (no, specs) in shards.iter().enumerate() {
        let mut md = vec![
            (SPLIT_NO_KEY, Value::U16(no as u16)),
            (SPLIT_COUNT_KEY, Value::U16(count)),
        ];
        if no == 0 {
            md.insert(0, ("general.architecture", Value::from("qwen4exp")));
            md.push((SPLIT_TENSORS_COUNT_KEY, Value::I32(4)));
        }
        let datas = write_file(
            &split_path(stem, no as u16, count),
            &md,
            specs,
            10 + no as u64,
            1000,
        );
        all.extend(specs.iter().map(|s| s.0.to_owned()).zip(datas));
    }
    all
}

#[test]
fn split_set_opens_from_any_shard() {
    let dir = tempfile::tempdir().unwrap();
    let stem = dir.path().join("qwen-iq4");
    let expected = write_split_set(&stem);
    for no in 0..3 {
        let model = Model::open(split_path(&stem, no, 3)).unwrap();
        assert_eq!(model.architecture(), Some("qwen4exp"));
        assert_eq!(model.shards().len(), 3);
        for (i, shard) in model.shards().iter().enumerate() {
            assert_eq!(shard.path(), split_path(&stem, i as u16, 3));
            assert_eq!(
                model.shard_mapping(i).unwrap().len() as u64,
                shard.file_len()
            );
        }
        let names: Vec<&str> = model.tensors().iter().map(|t| t.name()).collect();
        let want: Vec<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, want);
        let shard_of: Vec<usize> = model.tensors().iter().map(|t| t.shard).collect();
        assert_eq!(shard_of, [0, 1, 1, 2]);
        for (name, data) in &expected {
            let t = model.tensor(name).unwrap();
            let shard = &model.shards()[t.shard];
            assert_eq!(t.file_offset, shard.data_offset() + t.info.offset);
            assert_eq!(model.tensor_data(t).unwrap(), data.as_slice());
            // The absolute offset addresses the shard file itself.
            let file = std::fs::read(shard.path()).unwrap();
            assert_eq!(
                &file[t.file_range().start as usize..t.file_range().end as usize],
                data.as_slice()
            );
        }
        assert!(model.tensor("nope").is_none());
        assert_eq!(model.shard_mapping(3).map(|m| m.len()), None);
    }
}

#[test]
fn tensor_of_another_model_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let stem = dir.path().join("m");
    write_split_set(&stem);
    let a = Model::open(split_path(&stem, 0, 3)).unwrap();
    let other = dir.path().join("other.gguf");
    write_file(
        &other,
        &[],
        &[("output.weight", GgmlType::F32, vec![4])],
        0,
        64,
    );
    let b = Model::open(&other).unwrap();
    let foreign = b.tensor("output.weight").unwrap();
    assert!(a.tensor_data(foreign).is_none());
    assert!(b.tensor_data(foreign).is_some());
}

#[test]
fn missing_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let stem = dir.path().join("m");
    write_split_set(&stem);
    let gone = split_path(&stem, 1, 3);
    std::fs::remove_file(&gone).unwrap();
    for no in [0, 2] {
        let e = Model::open(split_path(&stem, no, 3)).unwrap_err();
        assert!(
            matches!(&e, GgufError::MissingShard { path, no: 1, count: 3 } if *path == gone),
            "{e}"
        );
        assert!(e.to_string().contains(&gone.display().to_string()), "{e}");
    }
    // The file asked for missing is a plain I/O error with its path.
    let e = Model::open(&gone).unwrap_err();
    assert!(
        matches!(&e, GgufError::Io { path: Some(p), .. } if *p == gone),
        "{e}"
    );
}

/// Writes a file with metadata `md` and one small tensor called `tensor`.
fn shard_with(path: PathBuf, md: &[(&str, Value)], tensor: &str) -> PathBuf {
    write_file(&path, md, &[(tensor, GgmlType::F32, vec![2])], 0, 8);
    path
}

#[test]
fn split_keys_must_agree_with_names() {
    let dir = tempfile::tempdir().unwrap();
    let stem = dir.path().join("s");
    let good = |no: u16| {
        vec![
            (SPLIT_NO_KEY, Value::U16(no)),
            (SPLIT_COUNT_KEY, Value::U16(2)),
        ]
    };
    let first = shard_with(split_path(&stem, 0, 2), &good(0), "x");
    // Second shard claims to be shard 0.
    let second = shard_with(split_path(&stem, 1, 2), &good(0), "y");
    let e = Model::open(&first).unwrap_err();
    assert!(
        matches!(&e, GgufError::ShardMismatch { path, key: "split.no", expected: 1, found } if *path == second && found == "0"),
        "{e}"
    );
    // Second shard lacks split.count.
    shard_with(second.clone(), &[(SPLIT_NO_KEY, Value::U16(1))], "y");
    let e = Model::open(&second).unwrap_err();
    assert!(
        matches!(&e, GgufError::ShardMismatch { key: "split.count", found, .. } if found == "missing"),
        "{e}"
    );
    // Both fine, but shard 0 miscounts the tensors.
    shard_with(second.clone(), &good(1), "y");
    let mut md = good(0);
    md.push((SPLIT_TENSORS_COUNT_KEY, Value::I32(5)));
    shard_with(first.clone(), &md, "x");
    let e = Model::open(&second).unwrap_err();
    assert!(
        matches!(&e, GgufError::ShardMismatch { key: "split.tensors.count", expected: 2, found, .. } if found == "5"),
        "{e}"
    );
    md.pop();
    md.push((SPLIT_TENSORS_COUNT_KEY, Value::I32(2)));
    shard_with(first.clone(), &md, "x");
    assert_eq!(Model::open(&second).unwrap().tensors().len(), 2);
    // Same tensor name in two shards.
    shard_with(first.clone(), &good(0), "y");
    let e = Model::open(&first).unwrap_err();
    assert!(
        matches!(e.root(), GgufError::DuplicateTensor { tensor } if tensor == "y"),
        "{e}"
    );
    assert_eq!(e.path(), Some(second.as_path()));
    // A split shard under a plain name cannot find its siblings.
    let plain = shard_with(dir.path().join("plain.gguf"), &good(0), "x");
    let e = Model::open(&plain).unwrap_err();
    assert!(matches!(e, GgufError::UnnamedSplit { count: 2, .. }), "{e}");
    // A one-shard "set" needs no split keys.
    let one = shard_with(split_path(dir.path().join("one"), 0, 1), &[], "x");
    assert_eq!(Model::open(&one).unwrap().shards().len(), 1);
}

#[test]
fn parse_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = shard_with(dir.path().join("bad.gguf"), &[], "x");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(6);
    std::fs::write(&path, &bytes).unwrap();
    let e = Model::open(&path).unwrap_err();
    assert!(matches!(e.root(), GgufError::Truncated { .. }), "{e}");
    assert_eq!(e.path(), Some(path.as_path()));
    assert!(
        e.to_string().starts_with(&path.display().to_string()),
        "{e}"
    );
}

#[test]
fn skipped_tensors_read_as_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.gguf");
    let mut w = GgufWriter::create(&path).unwrap();
    w.add_tensor("head", GgmlType::F32, &[5]).unwrap();
    w.add_tensor("hole", GgmlType::IQ4_NL, &[160, 50_000])
        .unwrap();
    w.add_tensor("mid", GgmlType::Q8_0, &[32, 3]).unwrap();
    w.add_tensor("tail", GgmlType::F16, &[4096, 64]).unwrap();
    w.begin_data().unwrap();
    let mid = vec![0xABu8; 3 * 34];
    w.write_tensor_data(&[1; 20]).unwrap();
    w.skip_tensor_data(45_000).unwrap();
    w.skip_tensor_data(90 * 50_000 - 45_000).unwrap();
    w.write_tensor_data(&mid).unwrap();
    w.skip_tensor_data(4096 * 64 * 2).unwrap();
    w.finish().unwrap();

    let model = Model::open(&path).unwrap();
    let data = |n: &str| model.tensor_data(model.tensor(n).unwrap()).unwrap();
    assert_eq!(data("head"), &[1; 20]);
    assert!(data("hole").iter().all(|&b| b == 0));
    assert_eq!(data("mid"), mid.as_slice());
    let tail = data("tail");
    assert_eq!(tail.len(), 4096 * 64 * 2);
    assert!(tail.iter().all(|&b| b == 0));
}

#[test]
fn writer_misuse_is_an_error() {
    let new = || GgufWriter::new(Cursor::new(Vec::new()));
    let mut w = new();
    w.add_tensor("a", GgmlType::F32, &[4]).unwrap();
    w.add_tensor("b", GgmlType::F32, &[2]).unwrap();
    let e = w.add_tensor("a", GgmlType::F32, &[1]).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateTensor { .. }), "{e}");
    let e = w.add_tensor("q", GgmlType::Q4_K, &[160]).unwrap_err();
    assert!(
        matches!(e, GgufError::RowNotWholeBlocks { ne0: 160, .. }),
        "{e}"
    );
    let e = w
        .add_tensor("big", GgmlType::F32, &[u64::MAX, 2])
        .unwrap_err();
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
    w.add_metadata("k", 1u8).unwrap();
    let e = w.add_metadata("k", 2u8).unwrap_err();
    assert!(
        matches!(e, GgufError::DuplicateKey { offset: None, .. }),
        "{e}"
    );
    for bad in [
        Value::U32(0),
        Value::U32(3),
        Value::U64(32),
        Value::from("32"),
    ] {
        let e = w.add_metadata("general.alignment", bad).unwrap_err();
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
    }
    let e = w.write_tensor_data(&[0]).unwrap_err();
    assert!(matches!(e, GgufError::WriterState(_)), "{e}");
    w.begin_data().unwrap();
    assert!(matches!(
        w.add_metadata("late", 1u8),
        Err(GgufError::WriterState(_))
    ));
    assert!(matches!(
        w.add_tensor("late", GgmlType::F32, &[1]),
        Err(GgufError::WriterState(_))
    ));
    let e = w.write_tensor_data(&[0; 25]).unwrap_err();
    assert!(
        matches!(e, GgufError::TooMuchTensorData { extra: 1 }),
        "{e}"
    );
    w.write_tensor_data(&[0; 17]).unwrap();
    let e = w.finish().unwrap_err();
    assert!(
        matches!(&e, GgufError::IncompleteTensorData { tensor, written: 1, expected: 8 } if tensor == "b"),
        "{e}"
    );

    let mut deep = Array::from(vec![1u8]);
    for _ in 0..pleio::gguf::MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    let e = new().add_metadata("deep", deep).unwrap_err();
    assert!(matches!(e, GgufError::NestingTooDeep { .. }), "{e}");

    // No tensors: finish alone writes a valid file.
    let mut w = new();
    w.add_metadata("only", "metadata").unwrap();
    let bytes = w.finish().unwrap().into_inner();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!((f.tensors().len(), f.metadata().len()), (0, 1));
}
