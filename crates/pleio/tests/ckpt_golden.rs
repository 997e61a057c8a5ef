//! Checkpoint goldens: tables written by Hugging Face's `safetensors` and
//! decoded by NumPy + ml_dtypes (`scripts/ckpt_golden.py`), found by
//! `CheckpointTable::open` and decoded by pleio (fast and scalar decoders)
//! to f32, bf16 and f16: every row bit for bit; and the same rows gathered
//! through `Table::open` with every strategy.
//!
//! `committed_goldens` reads `tests/golden/ckpt`; `ckpt_crosscheck_live`
//! reads the fresh cases `scripts/ckpt_crosscheck.sh` writes and names in
//! `PLEIO_CKPT_XCHECK_DIR`.

use std::fs::File;
use std::path::{Path, PathBuf};

use pleio::checkpoint::CheckpointTable;
use pleio::quant::encoding::EncodingDecoder;
use pleio::{Dtype, Strategy, Table};
use pleio_lab::synth_ckpt::read_row_parts;
use pleio_testkit::skip;

fn read_u16(p: &Path) -> Vec<u16> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

fn read_u32(p: &Path) -> Vec<u32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Checks one case; returns the rows compared.
fn check_case(dir: &Path, encoding: &str, rows: u64, row_elems: u64) -> u64 {
    let t = CheckpointTable::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    assert_eq!(t.encoding.name(), encoding, "{}", dir.display());
    assert_eq!(
        (t.rows, t.row_elems),
        (rows, row_elems),
        "{}",
        dir.display()
    );
    let n = row_elems as usize;
    let (f32s, bf16s, f16s) = (
        read_u32(&dir.join("expected.f32")),
        read_u16(&dir.join("expected.bf16")),
        read_u16(&dir.join("expected.f16")),
    );
    assert_eq!(f32s.len(), rows as usize * n);
    let files: Vec<File> = t.files.iter().map(|f| File::open(f).unwrap()).collect();
    let fast = t.decoder().unwrap();
    let scalar = EncodingDecoder::scalar(t.encoding, n).unwrap();
    let (mut y, mut h) = (vec![0f32; n], vec![0u16; n]);
    for r in 0..rows {
        let bufs = read_row_parts(&t, &files, r).unwrap();
        let parts: Vec<&[u8]> = bufs.iter().map(Vec::as_slice).collect();
        let at = r as usize * n..(r as usize + 1) * n;
        for dec in [&fast, &scalar] {
            dec.decode_f32(&parts, &mut y).unwrap();
            let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            if got != f32s[at.clone()] {
                let j = (0..n).find(|&j| got[j] != f32s[at.start + j]).unwrap();
                panic!(
                    "{} row {r} elem {j}: f32 {:#010x}, NumPy {:#010x} (simd {})",
                    dir.display(),
                    got[j],
                    f32s[at.start + j],
                    dec.is_simd()
                );
            }
            dec.decode_bf16(&parts, &mut h).unwrap();
            assert_eq!(h, bf16s[at.clone()], "{} row {r} bf16", dir.display());
            dec.decode_f16(&parts, &mut h).unwrap();
            assert_eq!(h, f16s[at.clone()], "{} row {r} f16", dir.display());
        }
    }
    // The same rows through the one entry point, every strategy, in
    // reverse order with a duplicate.
    let table = Table::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let ids: Vec<u64> = (0..rows).rev().chain([0]).collect();
    let want = |dtype: Dtype| -> Vec<u8> {
        ids.iter()
            .flat_map(|&r| {
                let at = r as usize * n..(r as usize + 1) * n;
                match dtype {
                    Dtype::F32 => f32s[at].iter().flat_map(|v| v.to_le_bytes()).collect(),
                    Dtype::Bf16 => bf16s[at].iter().flat_map(|v| v.to_le_bytes()).collect(),
                    _ => f16s[at]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect::<Vec<u8>>(),
                }
            })
            .collect()
    };
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let expected = want(dtype);
        for &s in Strategy::ALL {
            let mut out = vec![0u8; table.out_bytes(dtype, ids.len()).unwrap()];
            table.gather_as_with(s, dtype, &ids, &mut out).unwrap();
            assert!(
                out == expected,
                "{}: Table::gather_as {s} {dtype} differs from NumPy",
                dir.display()
            );
        }
    }
    rows
}

/// Checks every case of a manifest; returns (cases, rows).
fn check_dir(dir: &Path) -> (usize, u64) {
    let text = std::fs::read_to_string(dir.join("manifest.json"))
        .unwrap_or_else(|e| panic!("{}/manifest.json: {e}", dir.display()));
    let cases: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    let mut rows = 0;
    for c in &cases {
        rows += check_case(
            &dir.join(c["case"].as_str().unwrap()),
            c["encoding"].as_str().unwrap(),
            c["rows"].as_u64().unwrap(),
            c["row_elems"].as_u64().unwrap(),
        );
    }
    (cases.len(), rows)
}

#[test]
fn committed_goldens() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/ckpt");
    let (cases, rows) = check_dir(&dir);
    assert_eq!(cases, 9);
    assert_eq!(rows, 9 * 24);
}

#[test]
fn ckpt_crosscheck_live() {
    let Ok(dir) = std::env::var("PLEIO_CKPT_XCHECK_DIR") else {
        skip!("PLEIO_CKPT_XCHECK_DIR is not set (scripts/ckpt_crosscheck.sh sets it)");
    };
    let (cases, rows) = check_dir(Path::new(&dir));
    let min: u64 = std::env::var("PLEIO_CKPT_XCHECK_MIN_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    assert!(
        rows >= min * cases as u64,
        "only {rows} rows in {cases} cases"
    );
    println!("ckpt_crosscheck_live: all {cases} cases OK ({rows} rows)");
}
