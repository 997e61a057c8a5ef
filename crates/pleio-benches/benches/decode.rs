//! Row decode throughput: one ubatch of 8192 rows per decodable type.
//!
//! Rows are 160 elements for types with blocks of 32 or smaller, 256 for the
//! rest (256-element super-blocks and NVFP4's 64). Each row is decoded with
//! its own `RowDecoder::decode` call, as a gather does. Types with a SIMD
//! kernel are also measured on the scalar reference (`<type>/scalar`).
//!
//! `cargo bench -p pleio --bench decode` runs criterion and then prints one
//! summary line per type (best of several timed ubatches).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use pleio::quant::{can_decode, GgmlType, RowDecoder};
use pleio_lab::random::{fill_random_blocks, Rng};

const ROWS: usize = 8192;

/// Elements per row for `ty`.
fn row_elems(ty: GgmlType) -> usize {
    if ty.block_elems() <= 32 {
        160
    } else {
        256
    }
}

/// One ubatch of random valid rows of `ty`, and the output buffer.
struct Batch {
    src: Vec<u8>,
    dst: Vec<f32>,
    row_bytes: usize,
    row_elems: usize,
}

impl Batch {
    fn new(ty: GgmlType) -> Batch {
        let row_elems = row_elems(ty);
        let row_bytes = row_elems / ty.block_elems() * ty.block_bytes();
        let mut src = vec![0u8; ROWS * row_bytes];
        fill_random_blocks(ty, &mut Rng::new(u64::from(ty.id())), &mut src)
            .expect("decodable type");
        Batch {
            src,
            dst: vec![0f32; ROWS * row_elems],
            row_bytes,
            row_elems,
        }
    }

    /// Decodes every row with `dec`.
    fn run(&mut self, dec: &RowDecoder) {
        let rows = self.src.chunks_exact(self.row_bytes);
        for (s, d) in rows.zip(self.dst.chunks_exact_mut(self.row_elems)) {
            dec.decode(black_box(s), d).expect("whole rows");
        }
        black_box(&mut self.dst);
    }
}

/// Decoders to measure: the fastest, and the scalar one where they differ.
fn decoders() -> Vec<(String, GgmlType, RowDecoder)> {
    let mut out = Vec::new();
    for &ty in GgmlType::ALL.iter().filter(|&&t| can_decode(t)) {
        let fast = RowDecoder::new(ty).expect("decodable");
        let scalar = RowDecoder::scalar(ty).expect("decodable");
        out.push((ty.name().to_string(), ty, fast));
        if fast.is_simd() {
            out.push((format!("{}/scalar", ty.name()), ty, scalar));
        }
    }
    out
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_ubatch");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (name, ty, dec) in decoders() {
        let mut batch = Batch::new(ty);
        group.throughput(Throughput::Bytes((batch.dst.len() * 4) as u64));
        group.bench_function(BenchmarkId::from_parameter(&name), |b| {
            b.iter(|| batch.run(&dec))
        });
    }
    group.finish();
}

/// One line per decoder: best time of several ubatches, rows/s, GB/s.
fn summary() {
    println!("decode summary: {ROWS} rows per ubatch, best of 15, one thread");
    for (name, ty, dec) in decoders() {
        let mut batch = Batch::new(ty);
        batch.run(&dec);
        let best = (0..15)
            .map(|_| {
                let t = Instant::now();
                batch.run(&dec);
                t.elapsed()
            })
            .min()
            .unwrap_or_default()
            .as_secs_f64();
        let (inb, outb) = (batch.src.len() as f64, (batch.dst.len() * 4) as f64);
        println!(
            "{name:>14}: {ROWS} rows x {:>3} in {:>7.3} ms = {:>6.2} M rows/s, in {:>5.2} GB/s, out {:>6.2} GB/s",
            batch.row_elems,
            best * 1e3,
            ROWS as f64 / best / 1e6,
            inb / best / 1e9,
            outb / best / 1e9,
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    // Only when benchmarking for real (not `cargo test --benches`).
    if std::env::args().any(|a| a == "--bench") {
        summary();
    }
}
