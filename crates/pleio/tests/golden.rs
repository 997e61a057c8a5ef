//! Row decoders against gguf-py's `dequantize`, bit for bit.
//!
//! `tests/golden/` holds committed fixtures made by `scripts/golden.py`:
//! `<TYPE>.blocks` (raw blocks), `<TYPE>.f32` (gguf-py's output) and
//! `manifest.txt` (`TYPE seed n_random n_edge`). Each type is decoded with
//! the fastest decoder ([`RowDecoder::new`], whole and in odd-sized pieces)
//! and the scalar reference ([`RowDecoder::scalar`]), and every f32 must have
//! the expected bits. The first `n_random` blocks must also be exactly what
//! `fill_random_blocks` makes from `seed`, which keeps the Rust and Python
//! block generators in step.
//!
//! `crosscheck_live` runs the same checks on fresh data from
//! `scripts/golden.py --live DIR` when `PLEIO_XCHECK_DIR=DIR` is set
//! (see `scripts/crosscheck.sh`), and is skipped otherwise.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use pleio::quant::{can_decode, GgmlType, RowDecoder};
use pleio_lab::random::{fill_random_blocks, Rng};
use pleio_testkit::skip;

/// One manifest line.
struct Entry {
    ty: GgmlType,
    seed: u64,
    n_random: usize,
    n_edge: usize,
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn read_manifest(dir: &Path) -> Result<Vec<Entry>, String> {
    let path = dir.join("manifest.txt");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut entries = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("{}: bad line {line:?}", path.display());
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 4 {
            return Err(bad());
        }
        entries.push(Entry {
            ty: GgmlType::from_name(f[0]).ok_or_else(bad)?,
            seed: f[1].parse().map_err(|_| bad())?,
            n_random: f[2].parse().map_err(|_| bad())?,
            n_edge: f[3].parse().map_err(|_| bad())?,
        });
    }
    Ok(entries)
}

/// The 26 types pleio decodes (all that gguf-py 0.19 can dequantize).
fn decodable() -> Vec<GgmlType> {
    let v: Vec<GgmlType> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| can_decode(t))
        .collect();
    assert_eq!(v.len(), 26, "decodable types: {v:?}");
    v
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Compares decoded floats with the expected ones by bits; describes the
/// first mismatch and how many elements differ.
fn compare(ty: GgmlType, how: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    let be = ty.block_elems();
    let mut bad = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g.to_bits() != w.to_bits());
    let Some((i, (g, w))) = bad.next() else {
        return Ok(());
    };
    let count = 1 + bad.count();
    Err(format!(
        "{ty} {how}: block {}, element {}: got {:#010x} ({g:e}), expected {:#010x} ({w:e}) \
         [{count} of {} elements differ]",
        i / be,
        i % be,
        g.to_bits(),
        w.to_bits(),
        got.len()
    ))
}

/// Runs every check for one type; returns the number of blocks compared.
fn check_type(dir: &Path, e: &Entry) -> Result<usize, String> {
    let ty = e.ty;
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    let blocks = read(&dir.join(format!("{ty}.blocks")))?;
    let want_bytes = read(&dir.join(format!("{ty}.f32")))?;
    let n = e.n_random + e.n_edge;
    if blocks.len() != n * bb || want_bytes.len() != n * be * 4 {
        return Err(format!(
            "{ty}: manifest says {n} blocks; {} block bytes and {} f32 bytes found",
            blocks.len(),
            want_bytes.len()
        ));
    }
    let want: Vec<f32> = want_bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();

    let mut errors = Vec::new();

    // The Python generator and fill_random_blocks agree.
    let mut mine = vec![0u8; e.n_random * bb];
    fill_random_blocks(ty, &mut Rng::new(e.seed), &mut mine).map_err(|x| x.to_string())?;
    if let Some(i) = mine.iter().zip(&blocks).position(|(a, b)| a != b) {
        errors.push(format!(
            "{ty} generator: fill_random_blocks(seed {}) differs from golden.py at block {}, \
             byte {}: {:#04x} vs {:#04x}",
            e.seed,
            i / bb,
            i % bb,
            mine[i],
            blocks[i]
        ));
    }

    let mut got = vec![0f32; n * be];
    for (how, dec) in [
        ("new", RowDecoder::new(ty)),
        ("scalar", RowDecoder::scalar(ty)),
    ] {
        let dec = dec.map_err(|x| x.to_string())?;
        got.fill(0.0);
        dec.decode(&blocks, &mut got).map_err(|x| x.to_string())?;
        if let Err(m) = compare(ty, how, &got, &want) {
            errors.push(m);
        }
    }

    // The fast path again, in pieces of 1, 2, 3, 5, 8, 13 blocks (SIMD tails).
    let dec = RowDecoder::new(ty).map_err(|x| x.to_string())?;
    got.fill(0.0);
    let (mut at, mut k) = (0, 0);
    while at < n {
        let len = [1, 2, 3, 5, 8, 13][k % 6].min(n - at);
        dec.decode(
            &blocks[at * bb..(at + len) * bb],
            &mut got[at * be..(at + len) * be],
        )
        .map_err(|x| x.to_string())?;
        at += len;
        k += 1;
    }
    if let Err(m) = compare(ty, "new, in pieces", &got, &want) {
        errors.push(m);
    }

    if errors.is_empty() {
        Ok(n)
    } else {
        Err(errors.join("\n"))
    }
}

/// Checks one type of the committed goldens.
fn golden(name: &str) {
    let ty = GgmlType::from_name(name).expect("known type");
    assert!(decodable().contains(&ty), "{name} is not decodable");
    let dir = golden_dir();
    let manifest = read_manifest(&dir).unwrap();
    let entry = manifest
        .iter()
        .find(|e| e.ty == ty)
        .unwrap_or_else(|| panic!("{name} missing from {}", dir.display()));
    match check_type(&dir, entry) {
        Ok(n) => println!("golden {name}: {n} blocks match"),
        Err(m) => panic!("golden mismatch:\n{m}"),
    }
}

macro_rules! golden_tests {
    ($($test:ident => $name:literal,)*) => {
        $( #[test] fn $test() { golden($name); } )*

        /// The per-type tests cover every decodable type, and the committed
        /// manifest lists each of them once.
        #[test]
        fn golden_covers_every_decodable_type() {
            let tested: BTreeSet<&str> = [$($name),*].into_iter().collect();
            let want: BTreeSet<&str> = decodable().iter().map(|t| t.name()).collect();
            assert_eq!(tested, want);
            let listed: Vec<&str> =
                read_manifest(&golden_dir()).unwrap().iter().map(|e| e.ty.name()).collect();
            assert_eq!(listed.len(), 26);
            assert_eq!(listed.iter().copied().collect::<BTreeSet<_>>(), want);
        }
    };
}

golden_tests! {
    golden_f32 => "F32",
    golden_f16 => "F16",
    golden_bf16 => "BF16",
    golden_q4_0 => "Q4_0",
    golden_q4_1 => "Q4_1",
    golden_q5_0 => "Q5_0",
    golden_q5_1 => "Q5_1",
    golden_q8_0 => "Q8_0",
    golden_q2_k => "Q2_K",
    golden_q3_k => "Q3_K",
    golden_q4_k => "Q4_K",
    golden_q5_k => "Q5_K",
    golden_q6_k => "Q6_K",
    golden_iq1_s => "IQ1_S",
    golden_iq1_m => "IQ1_M",
    golden_iq2_xxs => "IQ2_XXS",
    golden_iq2_xs => "IQ2_XS",
    golden_iq2_s => "IQ2_S",
    golden_iq3_xxs => "IQ3_XXS",
    golden_iq3_s => "IQ3_S",
    golden_iq4_nl => "IQ4_NL",
    golden_iq4_xs => "IQ4_XS",
    golden_tq1_0 => "TQ1_0",
    golden_tq2_0 => "TQ2_0",
    golden_mxfp4 => "MXFP4",
    golden_nvfp4 => "NVFP4",
}

/// A corrupted expectation is reported with type, block, element and bits.
#[test]
fn compare_reports_the_first_mismatch() {
    let want = vec![1.0f32; 64];
    let mut got = want.clone();
    got[40] = 2.0;
    got[50] = -0.0;
    let m = compare(GgmlType::Q4_0, "new", &got, &want).unwrap_err();
    assert!(
        m.starts_with("Q4_0 new: block 1, element 8: got 0x40000000"),
        "{m}"
    );
    assert!(
        m.contains("expected 0x3f800000") && m.contains("[2 of 64"),
        "{m}"
    );
    // -0.0 and 0.0 are equal floats but different bits.
    assert!(compare(GgmlType::F32, "x", &[-0.0], &[0.0]).is_err());
    assert!(compare(GgmlType::F32, "x", &[f32::NAN], &[f32::NAN]).is_ok());
}

/// The live cross-check against gguf-py on fresh random blocks.
///
/// Runs only when `PLEIO_XCHECK_DIR` names a directory written by
/// `scripts/golden.py --live`; it must hold all 26 types with at least
/// `PLEIO_XCHECK_MIN_BLOCKS` (default 10000) random blocks each.
#[test]
fn crosscheck_live() {
    let Some(dir) = std::env::var_os("PLEIO_XCHECK_DIR") else {
        skip!("PLEIO_XCHECK_DIR is not set (scripts/crosscheck.sh sets it)");
    };
    let dir = PathBuf::from(dir);
    let min_blocks: usize = std::env::var("PLEIO_XCHECK_MIN_BLOCKS")
        .ok()
        .map(|s| s.parse().expect("PLEIO_XCHECK_MIN_BLOCKS must be a number"))
        .unwrap_or(10_000);
    let manifest = read_manifest(&dir).unwrap();
    let found: BTreeSet<&str> = manifest.iter().map(|e| e.ty.name()).collect();
    let want: BTreeSet<&str> = decodable().iter().map(|t| t.name()).collect();
    assert_eq!(found, want, "types in {}", dir.display());
    assert_eq!(manifest.len(), 26, "each type once in {}", dir.display());

    let mut report = String::new();
    let (mut failed, mut total) = (Vec::new(), 0usize);
    for e in &manifest {
        if e.n_random < min_blocks {
            failed.push(e.ty.name());
            let _ = writeln!(
                report,
                "{:8} FAIL: only {} random blocks (< {min_blocks})",
                e.ty.name(),
                e.n_random
            );
            continue;
        }
        match check_type(&dir, e) {
            Ok(n) => {
                total += n;
                let _ = writeln!(
                    report,
                    "{:8} OK: {n} blocks compared ({} random, {} edge)",
                    e.ty.name(),
                    e.n_random,
                    e.n_edge
                );
            }
            Err(m) => {
                failed.push(e.ty.name());
                let _ = writeln!(
                    report,
                    "{:8} FAIL:\n  {}",
                    e.ty.name(),
                    m.replace('\n', "\n  ")
                );
            }
        }
    }
    println!("crosscheck_live ({}):\n{report}", dir.display());
    assert!(
        failed.is_empty(),
        "crosscheck_live: {} of 26 types FAILED: {}",
        failed.len(),
        failed.join(" ")
    );
    println!("crosscheck_live: all 26 types OK, {total} blocks compared bit for bit");
}
