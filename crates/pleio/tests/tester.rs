//! The one tester: every case runs through every table source x strategy
//! x path (direct call, lookahead) x threads (1, 8) x output type, and must
//! give exactly what an independent reference gives (plain `read`s and the
//! scalar decoder; for checkpoints, the bytes the writer generated and the
//! encoding's scalar decoder). New strategies join through
//! `Strategy::ALL`, output types through `Dtype::ALL`, sources by a line in
//! `sources()`: nothing else in this file needs to change.

mod fetch_fixture;

use std::sync::Arc;

use fetch_fixture::{CkptFixture, Fixture, Rng};
use pleio::quant::convert::{f32_to_bf16, f32_to_f16};
use pleio::quant::GgmlType;
use pleio::{sys, Dtype, ErrorKind, Strategy, Table};
use pleio_lab::synth::SynthSpec;
use pleio_lab::synth_ckpt::CkptEncoding;

/// A table source: a GGUF file, or a safetensors checkpoint directory.
enum Source {
    Gguf(Fixture),
    Ckpt(CkptFixture),
}

impl Source {
    fn reader(&self) -> Table {
        match self {
            Source::Gguf(f) => f.reader(),
            Source::Ckpt(f) => f.reader(),
        }
    }

    /// The row cache budget its readers get, when one is set.
    fn cache_budget(&self) -> Option<u64> {
        match self {
            Source::Gguf(f) => f.cache_budget,
            Source::Ckpt(f) => f.cache_budget,
        }
    }

    fn rows(&self) -> u64 {
        match self {
            Source::Gguf(f) => f.table.rows(),
            Source::Ckpt(f) => f.rows,
        }
    }

    fn reference(&self, rows: &[u64]) -> Vec<f32> {
        match self {
            Source::Gguf(f) => f.reference(rows),
            Source::Ckpt(f) => f.reference(rows),
        }
    }

    fn reference_raw(&self, rows: &[u64]) -> Vec<u8> {
        match self {
            Source::Gguf(f) => f.reference_raw(rows),
            Source::Ckpt(f) => f.reference_raw(rows),
        }
    }

    fn straddlers(&self, table: &Table, page: u64, n: usize) -> Vec<u64> {
        match self {
            Source::Gguf(f) => f.straddlers(page, n),
            Source::Ckpt(f) => f.straddlers(table, page, n),
        }
    }
}

/// The table sources every case runs on.
fn sources() -> Vec<(&'static str, Source)> {
    // Checkpoints get row caches of 64 KiB: a few dozen to a few hundred
    // rows (with the staging for their parts' reads), so every batch
    // evicts.
    let ckpt = |enc, shards, files, seed| {
        Source::Ckpt(CkptFixture::new(enc, 6000, shards, files, seed).with_cache_budget(64 << 10))
    };
    vec![
        (
            "qwen4exp IQ4_NL (90-byte rows, some straddle a page)",
            Source::Gguf(Fixture::qwen(6000, 11)),
        ),
        (
            "qwen4exp Q8_0 (170-byte rows)",
            Source::Gguf(Fixture::of_spec(&SynthSpec::qwen(GgmlType::Q8_0, 3000, 12))),
        ),
        (
            "gemma4 Q5_K (7392-byte rows, every one spans 2-3 pages)",
            Source::Gguf(Fixture::of_spec(&SynthSpec::gemma(
                GgmlType::Q5_K,
                300,
                42,
                13,
            ))),
        ),
        (
            "checkpoint BF16 (8 shards interleaved with other tensors in 3 files)",
            ckpt(CkptEncoding::Bf16, 8, 3, 21),
        ),
        (
            "checkpoint FP8 with a table scale (8 shards, 3 files)",
            ckpt(CkptEncoding::Fp8, 8, 3, 22),
        ),
        (
            "checkpoint FP8 with per-row scales (2 parts a row, 2 files)",
            ckpt(CkptEncoding::Fp8Row, 8, 2, 23),
        ),
        (
            "checkpoint NVFP4 (2 parts a row, 16 shards, 3 files)",
            ckpt(CkptEncoding::Nvfp4, 16, 3, 24),
        ),
        (
            "checkpoint MLX 4-bit (3 parts a row, 8 shards, 1 file)",
            ckpt(CkptEncoding::Mlx4, 8, 1, 25),
        ),
        (
            "checkpoint MLX 4-bit (3 parts a row, 8 shards, 4 files)",
            ckpt(CkptEncoding::Mlx4, 8, 4, 26),
        ),
        (
            "qwen4exp IQ4_NL, row cache of 64 KiB (a few hundred rows: every batch evicts)",
            Source::Gguf(Fixture::qwen(6000, 14).with_cache_budget(64 << 10)),
        ),
        (
            "gemma4 Q5_K, row cache of 64 KiB (a handful of rows)",
            Source::Gguf(
                Fixture::of_spec(&SynthSpec::gemma(GgmlType::Q5_K, 300, 42, 15))
                    .with_cache_budget(64 << 10),
            ),
        ),
    ]
}

/// How a gather is called.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// `Table::gather_as_with` on the calling thread.
    Direct,
    /// `Lookahead::prefetch` then `wait_into` (f32).
    Lookahead,
    /// `Table::prefetch(rows, dtype)` (the engines' entry: one worker per
    /// table, started on first use) then `wait_into_bytes`.
    Prefetch,
}

/// The row lists every combination must agree on.
fn cases(fx: &Source, table: &Table) -> Vec<(&'static str, Vec<u64>)> {
    let n = fx.rows();
    let page = sys::page_size();
    let mut rng = Rng::new(7);
    let random: Vec<u64> = (0..600).map(|_| rng.below(n)).collect();
    let mut dense: Vec<u64> = (0..n.min(400)).collect();
    dense.reverse();
    vec![
        ("empty batch", vec![]),
        ("first row", vec![0]),
        ("last row, ending at EOF", vec![n - 1]),
        ("duplicates", vec![3, 3, 9, 3, n - 1, 9, n - 1, 0, 0]),
        ("page straddlers", fx.straddlers(table, page, 40)),
        ("random, more than one advice chunk", random),
        ("dense, reversed (overlapping runs)", dense),
        ("both ends", vec![n - 1, 0, n - 2, 1]),
        (
            "both sides of every shard boundary, descending",
            table
                .layout()
                .shards()
                .iter()
                .rev()
                .flat_map(|s| [s.row_start + s.rows - 1, s.row_start])
                .collect(),
        ),
    ]
}

/// What the reference says `rows` are in `dtype`.
fn expected(fx: &Source, dtype: Dtype, rows: &[u64]) -> Vec<u8> {
    let f = fx.reference(rows);
    match dtype {
        Dtype::F32 => f.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::Bf16 => f
            .iter()
            .flat_map(|&x| f32_to_bf16(x).to_le_bytes())
            .collect(),
        Dtype::F16 => f
            .iter()
            .flat_map(|&x| f32_to_f16(x).to_le_bytes())
            .collect(),
        Dtype::Raw => fx.reference_raw(rows),
        other => panic!("the tester does not know {other}"),
    }
}

/// One gather of `rows` through `path`, as bytes of `dtype`.
fn run(table: &Table, path: Path, s: Strategy, dtype: Dtype, rows: &[u64]) -> Vec<u8> {
    let what = format!("{s} {dtype} {path:?}");
    match path {
        Path::Direct => {
            let mut out = vec![0xa5u8; table.out_bytes(dtype, rows.len()).unwrap()];
            let st = table
                .gather_as_with(s, dtype, rows, &mut out)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(st.rows, rows.len() as u64, "{what}");
            out
        }
        Path::Lookahead => {
            let la = table.clone().with_strategy(s).lookahead().unwrap();
            let mut out = vec![f32::NAN; rows.len() * table.row_elems()];
            la.prefetch(rows)
                .wait_into(&mut out)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            out.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
        Path::Prefetch => {
            let table = table.clone().with_strategy(s);
            let mut out = vec![0xa5u8; table.out_bytes(dtype, rows.len()).unwrap()];
            let p = table
                .prefetch(rows, dtype)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let done = p
                .wait_into_bytes(&mut out)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!((done.rows.as_slice(), done.dtype), (rows, dtype), "{what}");
            out
        }
    }
}

/// Every (path, dtype) pair the tester runs.
fn paths() -> Vec<(Path, Dtype)> {
    let mut v: Vec<(Path, Dtype)> = Dtype::ALL.iter().map(|&d| (Path::Direct, d)).collect();
    v.push((Path::Lookahead, Dtype::F32));
    v.extend(Dtype::ALL.iter().map(|&d| (Path::Prefetch, d)));
    v
}

/// Runs every case of one source through every strategy and path, checking
/// each result (`tag` names the thread).
fn check_source(name: &str, fx: &Source, table: &Table, tag: &str) {
    for (case, rows) in cases(fx, table) {
        for (path, dtype) in paths() {
            let want = expected(fx, dtype, &rows);
            for &s in Strategy::ALL {
                let got = run(table, path, s, dtype, &rows);
                assert!(
                    got == want,
                    "{name}: {case}: {s} {dtype} {path:?} {tag} differs from the reference"
                );
            }
        }
    }
}

#[test]
fn every_source_strategy_path_and_dtype_gives_the_reference_bytes() {
    for (name, fx) in sources() {
        let table = fx.reader();
        check_source(name, &fx, &table, "1 thread");
        // Again, warm, with detailed stats on.
        check_source(name, &fx, &table.clone().with_detailed_stats(true), "warm");
        if let Some(budget) = fx.cache_budget() {
            // The small caches evicted, and kept their budget.
            let k = table.cache_counters().unwrap();
            assert!(k.evictions > 0, "{name}: nothing evicted");
            assert!(table.cache_allocated_bytes() <= budget, "{name}");
        }
    }
}

#[test]
fn eight_threads_on_one_table_stay_exact() {
    for (name, fx) in sources() {
        let table = Arc::new(fx.reader().with_detailed_stats(true));
        std::thread::scope(|sc| {
            for t in 0..8 {
                let (table, fx) = (table.clone(), &fx);
                sc.spawn(move || check_source(name, fx, &table, &format!("thread {t} of 8")));
            }
        });
    }
}

#[test]
fn bad_ids_and_buffers_fail_before_anything_is_written() {
    for (name, fx) in sources() {
        let table = fx.reader();
        let n = fx.rows();
        for &s in Strategy::ALL {
            for bad in [n, n + 1, u64::MAX, i64::MIN as u64] {
                let rows = [0, bad, 1];
                for &dtype in Dtype::ALL {
                    let mut out = vec![7u8; table.out_bytes(dtype, rows.len()).unwrap()];
                    let e = table.gather_as_with(s, dtype, &rows, &mut out).unwrap_err();
                    assert_eq!(
                        (e.kind(), e.row()),
                        (ErrorKind::RowOutOfRange, Some(bad)),
                        "{name}: {s} {dtype}: {e}"
                    );
                    assert!(e.to_string().contains(&bad.to_string()), "{e}");
                    assert!(out.iter().all(|&b| b == 7), "{name}: {s} {dtype}: written");
                    let mut short = vec![7u8; table.out_bytes(dtype, 1).unwrap()];
                    let e = table
                        .gather_as_with(s, dtype, &[1, 2], &mut short)
                        .unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::OutputSize, "{name}: {s} {dtype}");
                    assert!(short.iter().all(|&b| b == 7));
                }
                let la = table.clone().with_strategy(s).lookahead().unwrap();
                let mut out = vec![7.0f32; rows.len() * table.row_elems()];
                let e = la.prefetch(&rows).wait_into(&mut out).unwrap_err();
                assert_eq!((e.kind(), e.row()), (ErrorKind::RowOutOfRange, Some(bad)));
                assert!(
                    out.iter().all(|&x| x == 7.0),
                    "{name}: {s} lookahead: written"
                );
            }
        }
    }
}

/// Hostile checkpoints through the one entry point: a file missing, a file
/// cut short before open, and one cut short under an open table. Each is a
/// typed error naming the file (and the tensor, where one is at fault);
/// nothing panics and no output is written.
#[test]
fn hostile_checkpoints_give_typed_errors_naming_file_and_tensor() {
    let fx = CkptFixture::new(CkptEncoding::Mlx4, 6000, 8, 3, 31);
    let files: Vec<std::path::PathBuf> = {
        let t = fx.reader();
        let ck = t.checkpoint().unwrap().clone();
        ck.files.clone()
    };
    assert_eq!(files.len(), 3);
    let victim = &files[1];
    let bytes = std::fs::read(victim).unwrap();

    // Cut short under an open table: every strategy fails reading, names
    // the file and an offset, and writes nothing.
    let table = fx.reader();
    let rows: Vec<u64> = (0..fx.rows).step_by(7).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .open(victim)
        .unwrap()
        .set_len(bytes.len() as u64 / 3)
        .unwrap();
    for &s in Strategy::ALL {
        if !sys::SIGBUS_PROTECTED && (s.is_mapped() || s == Strategy::Auto) {
            continue;
        }
        table.forget_residency();
        let mut out = vec![7u8; table.out_bytes(Dtype::F32, rows.len()).unwrap()];
        let e = table
            .gather_as_with(s, Dtype::F32, &rows, &mut out)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{s}: {e}");
        let text = e.to_string();
        assert!(text.contains(&victim.display().to_string()), "{s}: {text}");
        assert!(text.contains("offset"), "{s}: {text}");
        assert!(out.iter().all(|&b| b == 7), "{s}: output written");
    }

    // Cut short before open: the header's tensors run past the end.
    let e = Table::open(&fx.path).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidFile, "{e}");
    let text = e.to_string();
    assert!(text.contains(&victim.display().to_string()), "{text}");
    assert!(text.contains('`'), "names the tensor: {text}");

    // A file the index names is gone.
    std::fs::remove_file(victim).unwrap();
    let e = Table::open(&fx.path).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains(&victim.display().to_string()), "{e}");

    // Not a checkpoint at all.
    let e = Table::open(fx.dir.path().join("nothing.json")).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidFile),
        "{e}"
    );
}
