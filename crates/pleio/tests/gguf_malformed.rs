//! Malformed GGUF files, enumerated: each must give the specific error,
//! naming the key, tensor or offset at fault, and never panic.
//!
//! The absurd counts (2^60 tensors, keys, array elements, string bytes) are
//! refused by comparing the count with the bytes left *before* any vector
//! is allocated (see the `gguf` module docs), so these tests would abort
//! with an allocation failure, not just run slowly, if a check were missing.

use std::io::Cursor;

use pleio::gguf::{Array, GgufError, GgufFile, GgufWriter, Value};
use pleio::quant::GgmlType;
use pleio_lab::random::Rng;

// An encoder independent of the library's writer, able to emit anything.
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s);
}

const T_U8: u32 = 0;
const T_BOOL: u32 = 7;
const T_U32: u32 = 4;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;

/// One metadata pair: key bytes, type id, encoded payload.
struct Kv(&'static [u8], u32, Vec<u8>);

fn kv_u32(key: &'static str, v: u32) -> Kv {
    Kv(key.as_bytes(), T_U32, v.to_le_bytes().to_vec())
}

/// One tensor info, raw.
struct Ti(&'static str, Vec<u64>, u32, u64);

/// A file: header, pairs, infos, padding to `align`, `data_len` data bytes.
fn raw(kvs: &[Kv], tis: &[Ti], align: usize, data_len: usize) -> Vec<u8> {
    let mut f = b"GGUF".to_vec();
    put_u32(&mut f, 3);
    put_u64(&mut f, tis.len() as u64);
    put_u64(&mut f, kvs.len() as u64);
    for Kv(k, ty, payload) in kvs {
        put_str(&mut f, k);
        put_u32(&mut f, *ty);
        f.extend_from_slice(payload);
    }
    for Ti(name, dims, ty, off) in tis {
        put_str(&mut f, name.as_bytes());
        put_u32(&mut f, dims.len() as u32);
        dims.iter().for_each(|&d| put_u64(&mut f, d));
        put_u32(&mut f, *ty);
        put_u64(&mut f, *off);
    }
    f.resize(f.len().next_multiple_of(align), 0);
    f.resize(f.len() + data_len, 0x55);
    f
}

fn parse_err(bytes: &[u8]) -> GgufError {
    match GgufFile::parse(bytes) {
        Ok(_) => panic!("malformed file parsed"),
        Err(e) => e,
    }
}

/// Asserts the message mentions every one of `parts`.
fn says(e: &GgufError, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

const F32: u32 = 0;

/// A valid small file from the library writer: several value types, three
/// tensors.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new(Cursor::new(Vec::new()));
    w.add_metadata("general.architecture", "qwen4exp").unwrap();
    w.add_metadata("general.alignment", 64u32).unwrap();
    w.add_metadata("a.u64", 7u64).unwrap();
    w.add_metadata("a.f32", 0.5f32).unwrap();
    w.add_metadata("a.flag", true).unwrap();
    w.add_metadata("a.list", vec![1u64, 2, 3]).unwrap();
    w.add_metadata("a.words", vec!["x".to_owned(), String::new()])
        .unwrap();
    let nested = Array::Array(vec![Array::from(vec![1i8, -1]), Array::from(vec![false])]);
    w.add_metadata("a.nested", nested).unwrap();
    w.add_tensor("t.q8", GgmlType::Q8_0, &[64, 2]).unwrap();
    w.add_tensor("t.f32", GgmlType::F32, &[3]).unwrap();
    w.add_tensor("t.iq4", GgmlType::IQ4_NL, &[160, 3]).unwrap();
    w.begin_data().unwrap();
    let n: u64 = w.tensors().iter().map(|t| t.n_bytes).sum();
    let mut data = vec![0u8; n as usize];
    Rng::new(1).fill_bytes(&mut data);
    w.write_tensor_data(&data).unwrap();
    w.finish().unwrap().into_inner()
}

#[test]
fn valid_file_parses() {
    let bytes = valid_file();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.alignment(), 64);
}

#[test]
fn truncated_at_every_offset() {
    let bytes = valid_file();
    let f = GgufFile::parse(&bytes).unwrap();
    let last = f
        .tensors()
        .iter()
        .map(|t| f.tensor_range(t).end)
        .max()
        .unwrap();
    for cut in 0..last as usize {
        let e = parse_err(&bytes[..cut]);
        match e {
            GgufError::Truncated {
                offset,
                need,
                available,
                ..
            } => {
                assert!(cut < f.data_offset() as usize, "cut at {cut}: {e}");
                assert!(offset <= cut as u64 && need > available, "{e}");
                says(
                    &e,
                    &[&format!("truncated at offset {offset} while reading")],
                );
            }
            GgufError::CountTooLarge { offset, .. } => {
                assert!(offset < cut as u64, "{e}");
            }
            // Once the infos are complete, the data is missing.
            GgufError::TensorPastEnd { file_size, .. } => assert_eq!(file_size, cut as u64),
            other => panic!("cut at {cut}: unexpected {other}"),
        }
    }
    // Cuts at the end of the infos and later name the tensor past the end.
    let e = parse_err(&bytes[..f.data_offset() as usize]);
    assert!(matches!(e, GgufError::TensorPastEnd { .. }), "{e}");
    says(
        &e,
        &["tensor `t.q8`", &format!("({} bytes)", f.data_offset())],
    );
}

#[test]
fn bad_magic_and_versions() {
    let mut bytes = valid_file();
    bytes[3] = b'X';
    let e = parse_err(&bytes);
    assert!(
        matches!(e, GgufError::BadMagic { found } if &found == b"GGUX"),
        "{e}"
    );
    says(&e, &["offset 0"]);

    for (version, hint) in [
        (1u32, "obsolete"),
        (4, "only 2 and 3"),
        (3 << 24, "big-endian"),
    ] {
        let mut bytes = valid_file();
        bytes[4..8].copy_from_slice(&version.to_le_bytes());
        let e = parse_err(&bytes);
        assert!(
            matches!(e, GgufError::UnsupportedVersion { version: v } if v == version),
            "{e}"
        );
        says(&e, &[&format!("version {version}"), hint]);
    }
    // Version 2 has the same layout and is read.
    let mut bytes = valid_file();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(GgufFile::parse(&bytes).unwrap().version(), 2);
}

#[test]
fn absurd_counts_fail_before_allocating() {
    const HUGE: u64 = 1 << 60;
    let mut f = raw(&[], &[], 32, 1 << 20);
    f[8..16].copy_from_slice(&HUGE.to_le_bytes());
    let e = parse_err(&f);
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                count: HUGE,
                offset: 8,
                ..
            }
        ),
        "{e}"
    );
    says(&e, &["tensor count at offset 8"]);

    let mut f = raw(&[], &[], 32, 1 << 20);
    f[16..24].copy_from_slice(&HUGE.to_le_bytes());
    let e = parse_err(&f);
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                count: HUGE,
                offset: 16,
                ..
            }
        ),
        "{e}"
    );
    says(&e, &["metadata count at offset 16"]);

    // Arrays of 2^60 elements of each kind of element: fixed-size, string,
    // nested array.
    for elem in [T_U8, T_U32, T_BOOL, T_STRING, T_ARRAY] {
        let mut payload = Vec::new();
        put_u32(&mut payload, elem);
        put_u64(&mut payload, HUGE);
        let f = raw(&[Kv(b"big.array", T_ARRAY, payload)], &[], 32, 1 << 20);
        let e = parse_err(&f);
        assert!(
            matches!(
                e,
                GgufError::CountTooLarge {
                    count: HUGE,
                    offset: 49,
                    ..
                }
            ),
            "{e}"
        );
        says(&e, &["length of array `big.array`", "offset 49"]);
    }

    // A string value, a key and a tensor name of 2^60 bytes.
    let mut payload = Vec::new();
    put_u64(&mut payload, HUGE);
    let f = raw(&[Kv(b"big.string", T_STRING, payload)], &[], 32, 1 << 20);
    let e = parse_err(&f);
    assert!(
        matches!(e, GgufError::CountTooLarge { count: HUGE, .. }),
        "{e}"
    );
    says(&e, &["length of value of key `big.string`"]);

    let mut f = raw(&[kv_u32("k", 1)], &[], 32, 1 << 20);
    f[24..32].copy_from_slice(&HUGE.to_le_bytes());
    let e = parse_err(&f);
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                count: HUGE,
                offset: 24,
                ..
            }
        ),
        "{e}"
    );
    says(&e, &["length of key of metadata pair #0"]);

    let mut f = raw(&[], &[Ti("t", vec![4], F32, 0)], 32, 16);
    f[24..32].copy_from_slice(&HUGE.to_le_bytes());
    let e = parse_err(&f);
    says(&e, &["length of name of tensor #0"]);

    let f = raw(&[], &[Ti("t", vec![0; 0], F32, 0)], 32, 16);
    let mut f = f;
    // n_dims follows the 8-byte length and the 1-byte name.
    f[33..37].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = parse_err(&f);
    assert!(
        matches!(&e, GgufError::TooManyDims { n_dims, .. } if *n_dims == u64::from(u32::MAX)),
        "{e}"
    );
    says(&e, &["tensor `t`", "4294967295 dimensions"]);
}

#[test]
fn bad_values() {
    let e = parse_err(&raw(&[Kv(b"odd", 13, vec![0; 8])], &[], 32, 0));
    assert!(
        matches!(
            e,
            GgufError::UnknownValueType {
                type_id: 13,
                offset: 35,
                ..
            }
        ),
        "{e}"
    );
    says(&e, &["key `odd`", "offset 35"]);

    let mut payload = Vec::new();
    put_u32(&mut payload, 99);
    put_u64(&mut payload, 1);
    let e = parse_err(&raw(&[Kv(b"arr", T_ARRAY, payload)], &[], 32, 0));
    assert!(
        matches!(
            e,
            GgufError::UnknownValueType {
                type_id: 99,
                offset: 39,
                ..
            }
        ),
        "{e}"
    );
    says(&e, &["key `arr`"]);

    let e = parse_err(&raw(&[Kv(b"k\xff", T_U32, vec![0; 4])], &[], 32, 0));
    assert!(
        matches!(e, GgufError::InvalidUtf8 { offset: 32, .. }),
        "{e}"
    );
    says(&e, &["offset 32", "key of metadata pair #0"]);

    let mut payload = Vec::new();
    put_str(&mut payload, b"ok\xc3");
    let e = parse_err(&raw(&[Kv(b"name", T_STRING, payload)], &[], 32, 0));
    assert!(
        matches!(e, GgufError::InvalidUtf8 { offset: 48, .. }),
        "{e}"
    );
    says(&e, &["value of key `name`"]);

    let e = parse_err(&raw(&[Kv(b"flag", T_BOOL, vec![2])], &[], 32, 0));
    assert!(
        matches!(
            e,
            GgufError::InvalidBool {
                byte: 2,
                offset: 40,
                ..
            }
        ),
        "{e}"
    );
    says(&e, &["key `flag`"]);

    let e = parse_err(&raw(
        &[kv_u32("dup", 1), kv_u32("x", 2), kv_u32("dup", 3)],
        &[],
        32,
        0,
    ));
    assert!(
        matches!(&e, GgufError::DuplicateKey { key, offset: Some(60) } if key == "dup"),
        "{e}"
    );
    says(&e, &["`dup`", "offset 60"]);
}

#[test]
fn nesting_is_bounded() {
    // 100 000 nested arrays: would overflow the stack if unbounded.
    let depth = 100_000;
    let mut payload = Vec::new();
    for _ in 0..depth {
        put_u32(&mut payload, T_ARRAY);
        put_u64(&mut payload, 1);
    }
    put_u32(&mut payload, T_U8);
    put_u64(&mut payload, 0);
    let e = parse_err(&raw(&[Kv(b"deep", T_ARRAY, payload)], &[], 32, 0));
    assert!(
        matches!(&e, GgufError::NestingTooDeep { key, .. } if key == "deep"),
        "{e}"
    );
    says(&e, &["key `deep`", "at offset"]);
}

#[test]
fn bad_tensors() {
    let e = parse_err(&raw(&[], &[Ti("w.bad", vec![32], 4, 0)], 32, 64));
    assert!(
        matches!(
            e,
            GgufError::UnknownGgmlType {
                type_id: 4,
                offset: 49,
                ..
            }
        ),
        "{e}"
    );
    says(&e, &["tensor `w.bad`", "type id 4", "offset 49"]);

    // A dimension above i64::MAX is rejected (as ggml does) even when a
    // zero dimension makes the element count 0.
    for dims in [vec![0, 1 << 63], vec![1 << 63, 0], vec![0, u64::MAX]] {
        let e = parse_err(&raw(&[], &[Ti("w.wide", dims.clone(), F32, 0)], 32, 64));
        assert!(matches!(e, GgufError::DimsOverflow { .. }), "{dims:?}: {e}");
        says(&e, &["w.wide"]);
    }

    let q4_0 = GgmlType::Q4_0.id();
    let e = parse_err(&raw(&[], &[Ti("w.row", vec![33, 2], q4_0, 0)], 32, 64));
    assert!(
        matches!(
            e,
            GgufError::RowNotWholeBlocks {
                ne0: 33,
                ty: GgmlType::Q4_0,
                ..
            }
        ),
        "{e}"
    );
    says(&e, &["tensor `w.row`", "33 elements", "Q4_0"]);

    let e = parse_err(&raw(
        &[],
        &[Ti("w.huge", vec![1 << 32, 1 << 32, 1 << 32], F32, 0)],
        32,
        64,
    ));
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
    says(&e, &["tensor `w.huge`"]);

    let e = parse_err(&raw(&[], &[Ti("w.mis", vec![4], F32, 16)], 32, 64));
    assert!(
        matches!(
            e,
            GgufError::MisalignedTensor {
                offset: 16,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
    says(&e, &["tensor `w.mis`", "offset 16", "alignment 32"]);

    let f = raw(&[], &[Ti("w.eof", vec![20], F32, 0)], 32, 64);
    let e = parse_err(&f);
    let len = f.len() as u64;
    assert!(
        matches!(e, GgufError::TensorPastEnd { end, file_size, .. } if end == len + 16 && file_size == len),
        "{e}"
    );
    says(&e, &["tensor `w.eof`", &format!("({len} bytes)")]);

    let f = raw(&[], &[Ti("w.far", vec![4], F32, u64::MAX - 31)], 32, 64);
    let e = parse_err(&f);
    assert!(
        matches!(e, GgufError::TensorPastEnd { end: u64::MAX, .. }),
        "{e}"
    );

    let tis = [Ti("a", vec![16], F32, 0), Ti("b", vec![4], F32, 32)];
    let e = parse_err(&raw(&[], &tis, 32, 64));
    assert!(
        matches!(&e, GgufError::OverlappingTensors { first, second, first_end: 64, second_start: 32, .. } if first == "a" && second == "b"),
        "{e}"
    );
    says(&e, &["`a`", "`b`"]);

    let tis = [Ti("same", vec![4], F32, 0), Ti("same", vec![4], F32, 32)];
    let e = parse_err(&raw(&[], &tis, 32, 64));
    assert!(
        matches!(&e, GgufError::DuplicateTensor { tensor } if tensor == "same"),
        "{e}"
    );
    says(&e, &["`same`"]);
}

#[test]
fn bad_alignments() {
    for a in [0u32, 3, 48] {
        let e = parse_err(&raw(&[kv_u32("general.alignment", a)], &[], 32, 0));
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
        says(&e, &[&format!("alignment {a} (u32)")]);
    }
    let mut payload = Vec::new();
    put_str(&mut payload, b"32");
    let e = parse_err(&raw(
        &[Kv(b"general.alignment", T_STRING, payload)],
        &[],
        32,
        0,
    ));
    assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
}

#[test]
fn random_byte_flips_never_panic() {
    let bytes = valid_file();
    let data_offset = GgufFile::parse(&bytes).unwrap().data_offset() as usize;
    let mut rng = Rng::new(0x5eed);
    let mut errors = 0;
    for _ in 0..4000 {
        let mut f = bytes.clone();
        let flips = 1 + rng.next_u64() % 4;
        for _ in 0..flips {
            // Mostly in the header region, where the structure is.
            let limit = if rng.next_u64().is_multiple_of(8) {
                f.len()
            } else {
                data_offset
            };
            let at = (rng.next_u64() % limit as u64) as usize;
            f[at] ^= 1 << (rng.next_u64() % 8);
        }
        let cut = if rng.next_u64().is_multiple_of(4) {
            (rng.next_u64() % f.len() as u64) as usize
        } else {
            f.len()
        };
        if let Err(e) = GgufFile::parse(&f[..cut]) {
            errors += 1;
            // Formatting the error must not panic either.
            assert!(!e.to_string().is_empty());
        }
    }
    assert!(
        errors > 1000,
        "only {errors} of 4000 corrupted files were refused"
    );
}

#[test]
fn metadata_of_a_parsed_file_is_in_file_order() {
    let bytes = valid_file();
    let f = GgufFile::parse(&bytes).unwrap();
    let keys: Vec<&str> = f.metadata().iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            "general.architecture",
            "general.alignment",
            "a.u64",
            "a.f32",
            "a.flag",
            "a.list",
            "a.words",
            "a.nested"
        ]
    );
    assert_eq!(
        f.metadata().get("a.words"),
        Some(&Value::from(vec!["x".to_owned(), String::new()]))
    );
}

/// A valid file whose header is about `bytes` long (one big string array),
/// so reading it takes several reads.
fn file_with_header_of(bytes: usize) -> Vec<u8> {
    let mut w = GgufWriter::new(Cursor::new(Vec::new()));
    let words: Vec<String> = (0..bytes / 24).map(|i| format!("token-{i:08}")).collect();
    w.add_metadata("tokenizer.ggml.tokens", words).unwrap();
    w.add_metadata("a.u32", 7u32).unwrap();
    w.add_tensor("t.f32", GgmlType::F32, &[3, 5]).unwrap();
    w.add_tensor("t.q8", GgmlType::Q8_0, &[64, 2]).unwrap();
    w.begin_data().unwrap();
    let n: u64 = w.tensors().iter().map(|t| t.n_bytes).sum();
    let mut data = vec![0u8; n as usize];
    Rng::new(3).fill_bytes(&mut data);
    w.write_tensor_data(&data).unwrap();
    w.finish().unwrap().into_inner()
}

/// Asserts `a` and `b` parsed the same header.
fn same_header(a: &GgufFile, b: &GgufFile) {
    assert_eq!(a.version(), b.version());
    assert_eq!(a.alignment(), b.alignment());
    assert_eq!(a.data_offset(), b.data_offset());
    assert_eq!(a.file_size(), b.file_size());
    assert_eq!(a.metadata(), b.metadata());
    assert_eq!(a.tensors(), b.tensors());
}

/// Reading a header from a file (pread, growing reads, no mapping) gives
/// what parsing the whole file in memory gives: the same header, or for a
/// file cut anywhere, the same error.
#[test]
fn reading_the_header_from_the_file_matches_parsing_its_bytes() {
    // One read, and headers of several reads (64 KiB, then 256 KiB, 1 MiB).
    for bytes in [
        valid_file(),
        file_with_header_of(100 << 10),
        file_with_header_of(900 << 10),
    ] {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &bytes).unwrap();
        let read = GgufFile::read_header(&file).unwrap();
        same_header(&read, &GgufFile::parse(&bytes).unwrap());
        let data_offset = read.data_offset() as usize;
        let mut rng = Rng::new(bytes.len() as u64);
        let mut cuts: Vec<usize> = (0..40)
            .map(|_| rng.below(bytes.len() as u64) as usize)
            .collect();
        cuts.extend([0, 3, 4, 24, data_offset - 1, data_offset, bytes.len() - 1]);
        for cut in cuts {
            std::os::unix::fs::FileExt::write_all_at(&file, &bytes, 0).unwrap();
            file.set_len(cut as u64).unwrap();
            let want = GgufFile::parse(&bytes[..cut]).map(|_| ());
            let got = GgufFile::read_header(&file).map(|_| ());
            assert_eq!(
                got.map_err(|e| e.to_string()),
                want.map_err(|e| e.to_string()),
                "cut at {cut} of {}",
                bytes.len()
            );
        }
    }
}
