//! Checkpoint row decode throughput: one ubatch of 8192 rows of 160
//! elements per encoding, to f32 and to bf16, one thread. Each row is
//! decoded with its own `EncodingDecoder` call from its 1-3 parts, as a
//! gather does. SIMD decoders are also measured on the scalar reference.
//!
//! `cargo bench -p pleio-benches --bench ckpt_decode` runs criterion and
//! then prints one summary line per case (best of 201 ubatches).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use pleio::quant::encoding::{Encoding, EncodingDecoder, Fp8Scale, ScaleType};
use pleio_lab::random::Rng;
use pleio_lab::synth_ckpt::{fill_part, CkptEncoding, NVFP4_GLOBAL};

const ROWS: usize = 8192;
const N: usize = 160;

/// The encodings measured, with the synth encoding that makes valid bytes.
fn encodings() -> Vec<(Encoding, CkptEncoding)> {
    vec![
        (Encoding::Bf16, CkptEncoding::Bf16),
        (
            Encoding::Fp8(Fp8Scale::PerTensor(f32::from_bits(0x3952_0000))),
            CkptEncoding::Fp8,
        ),
        (
            Encoding::Fp8(Fp8Scale::PerRow(ScaleType::Bf16)),
            CkptEncoding::Fp8Row,
        ),
        (
            Encoding::Nvfp4 {
                global_scale: NVFP4_GLOBAL,
            },
            CkptEncoding::Nvfp4,
        ),
        (Encoding::Mlx4, CkptEncoding::Mlx4),
    ]
}

/// One ubatch: each part of all rows in its own buffer (as in a shard).
struct Batch {
    parts: Vec<Vec<u8>>,
    lens: Vec<usize>,
    f32s: Vec<f32>,
    halves: Vec<u16>,
}

impl Batch {
    fn new(enc: Encoding, synth: CkptEncoding) -> Batch {
        let lens = enc
            .part_bytes(N)
            .expect("160 is whole groups")
            .as_slice()
            .to_vec();
        let parts = lens
            .iter()
            .enumerate()
            .map(|(p, &len)| {
                let mut v = vec![0u8; ROWS * len];
                fill_part(synth, p, &mut Rng::new(p as u64 + 1), &mut v);
                v
            })
            .collect();
        Batch {
            parts,
            lens,
            f32s: vec![0f32; ROWS * N],
            halves: vec![0u16; ROWS * N],
        }
    }

    fn run(&mut self, dec: &EncodingDecoder, bf16: bool) {
        let k = self.lens.len();
        for r in 0..ROWS {
            let mut parts: [&[u8]; 3] = [&[]; 3];
            for (p, (buf, &len)) in self.parts.iter().zip(&self.lens).enumerate() {
                parts[p] = &buf[r * len..(r + 1) * len];
            }
            let parts = black_box(&parts[..k]);
            if bf16 {
                let out = &mut self.halves[r * N..(r + 1) * N];
                dec.decode_bf16(parts, out).expect("whole rows");
            } else {
                let out = &mut self.f32s[r * N..(r + 1) * N];
                dec.decode_f32(parts, out).expect("whole rows");
            }
        }
        black_box((&mut self.f32s, &mut self.halves));
    }

    fn in_bytes(&self) -> usize {
        self.parts.iter().map(Vec::len).sum()
    }
}

/// (label, decoder, bf16 output) for every case.
fn cases() -> Vec<(String, Encoding, CkptEncoding, EncodingDecoder, bool)> {
    let mut out = Vec::new();
    for (enc, synth) in encodings() {
        let fast = EncodingDecoder::new(enc, N).expect("valid");
        let scalar = EncodingDecoder::scalar(enc, N).expect("valid");
        for bf16 in [false, true] {
            let o = if bf16 { "bf16" } else { "f32" };
            out.push((
                format!("{}->{o}", enc.name()),
                enc,
                synth,
                fast.clone(),
                bf16,
            ));
            if fast.is_simd() {
                out.push((
                    format!("{}->{o}/scalar", enc.name()),
                    enc,
                    synth,
                    scalar.clone(),
                    bf16,
                ));
            }
        }
    }
    out
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("ckpt_decode_ubatch");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (name, enc, synth, dec, bf16) in cases() {
        let mut batch = Batch::new(enc, synth);
        group.throughput(Throughput::Elements(ROWS as u64));
        group.bench_function(BenchmarkId::from_parameter(&name), |b| {
            b.iter(|| batch.run(&dec, bf16))
        });
    }
    group.finish();
}

fn summary() {
    println!("checkpoint decode summary: {ROWS} rows of {N} per ubatch, best of 201, one thread");
    for (name, enc, synth, dec, bf16) in cases() {
        let mut batch = Batch::new(enc, synth);
        batch.run(&dec, bf16);
        let best = (0..201)
            .map(|_| {
                let t = Instant::now();
                batch.run(&dec, bf16);
                t.elapsed()
            })
            .min()
            .unwrap_or_default()
            .as_secs_f64();
        let out_bytes = ROWS * N * if bf16 { 2 } else { 4 };
        println!(
            "{name:>22}: {:>7.3} ms = {:>6.2} M rows/s, in {:>5.2} GB/s, out {:>6.2} GB/s",
            best * 1e3,
            ROWS as f64 / best / 1e6,
            batch.in_bytes() as f64 / best / 1e9,
            out_bytes as f64 / best / 1e9,
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        summary();
    }
}
