//! Row-id throughput of the qwen4exp n-gram mapper (released constants).
//! Criterion's `thrpt` line is row ids per second.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pleio::ngram::{QwenNgramParams, RowMapper};

fn tokens(n: usize) -> Vec<u32> {
    // deterministic pseudo-random ids over the unigram vocabulary, with an
    // EOS now and then
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 997 == 996 {
                248_044
            } else {
                (x % 248_320) as u32
            }
        })
        .collect()
}

fn bench_ngram(c: &mut Criterion) {
    let params = QwenNgramParams::released();
    let mut group = c.benchmark_group("qwen4exp_rows");
    for n in [1usize, 512, 4096] {
        let toks = tokens(n);
        let mut out = vec![0u64; n * params.n_heads()];
        group.throughput(Throughput::Elements((n * params.n_heads()) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &toks, |b, toks| {
            let mut seq = params.sequence();
            b.iter(|| {
                seq.map_into(black_box(toks), &mut out).unwrap();
                black_box(&out);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_ngram);
criterion_main!(benches);
