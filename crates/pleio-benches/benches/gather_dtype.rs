//! Warm gathers of a GGUF table in each output type: one ubatch of 1792
//! random rows of an IQ4_NL qwen4exp table (160 elements a row), gathered
//! as f32 (`Table::gather`), bf16 and f16 (`Table::gather_as`), mapped
//! (`Strategy::Fault`, every page resident after the first pass).
//!
//! `cargo bench -p pleio-benches --bench gather_dtype` runs criterion and
//! then prints the best time of each type and the ratios bf16/f32 and
//! f16/f32 (the 16-bit outputs should cost at most ~1.1x f32's time).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use pleio::quant::GgmlType;
use pleio::{Dtype, Strategy, Table};
use pleio_lab::random::Rng;
use pleio_lab::synth::SynthSpec;

const ROWS: usize = 1792;
const TABLE_ROWS: u64 = 400_000;

/// The table file (removed on drop).
struct TempTable {
    path: PathBuf,
    table: Table,
}

impl Drop for TempTable {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn table() -> TempTable {
    let path = std::env::temp_dir().join(format!(
        "pleio-bench-gather-dtype-{}.gguf",
        std::process::id()
    ));
    let file = std::fs::File::create(&path).expect("temp file");
    SynthSpec::qwen(GgmlType::IQ4_NL, TABLE_ROWS, 11)
        .write(file, &mut |_| {})
        .expect("synthetic table");
    let table = Table::open(&path)
        .expect("open")
        .with_strategy(Strategy::Fault);
    TempTable { path, table }
}

/// One ubatch of ids and the three outputs.
struct Batch {
    ids: Vec<u64>,
    f32s: Vec<f32>,
    halves: Vec<u8>,
    bytes: Vec<u8>,
}

impl Batch {
    fn new(t: &Table) -> Batch {
        let mut rng = Rng::new(5);
        let n = t.rows();
        let ids = (0..ROWS).map(|_| rng.next_u64() % n).collect();
        Batch {
            ids,
            f32s: vec![0f32; ROWS * t.row_elems()],
            halves: vec![0u8; ROWS * t.row_elems() * 2],
            bytes: Vec::new(),
        }
    }

    /// f32 bytes through `gather_as` (the decoded row copied out of a
    /// scratch row, as the 16-bit outputs are converted out of it).
    fn run_f32_bytes(&mut self, t: &Table) {
        let n = self.halves.len() * 2;
        self.bytes.resize(n, 0);
        t.gather_as(Dtype::F32, black_box(&self.ids), &mut self.bytes)
            .expect("gather");
        black_box(&mut self.bytes);
    }

    fn run(&mut self, t: &Table, dtype: Dtype) {
        match dtype {
            Dtype::F32 => {
                t.gather(black_box(&self.ids), &mut self.f32s)
                    .expect("gather");
                black_box(&mut self.f32s);
            }
            d => {
                t.gather_as(d, black_box(&self.ids), &mut self.halves)
                    .expect("gather");
                black_box(&mut self.halves);
            }
        }
    }
}

const DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

fn bench(c: &mut Criterion, t: &Table) {
    let mut group = c.benchmark_group("gather_dtype_iq4_nl_1792");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let mut batch = Batch::new(t);
    for d in DTYPES {
        batch.run(t, d);
        group.throughput(Throughput::Elements(ROWS as u64));
        group.bench_function(BenchmarkId::from_parameter(d.name()), |b| {
            b.iter(|| batch.run(t, d))
        });
    }
    group.finish();
}

/// Best of many ubatches per type, interleaved so that every type sees
/// the same machine state; then the ratios to f32.
fn summary(t: &Table) {
    let mut batch = Batch::new(t);
    let mut best = [f64::INFINITY; 4];
    for d in DTYPES {
        batch.run(t, d);
    }
    batch.run_f32_bytes(t);
    for _ in 0..200 {
        for (k, d) in DTYPES.into_iter().enumerate() {
            let s = Instant::now();
            batch.run(t, d);
            best[k] = best[k].min(s.elapsed().as_secs_f64());
        }
        let s = Instant::now();
        batch.run_f32_bytes(t);
        best[3] = best[3].min(s.elapsed().as_secs_f64());
    }
    println!(
        "gather_dtype summary: IQ4_NL, {ROWS} random rows x {} elements, warm, Strategy::Fault, best of 200, one thread",
        t.row_elems()
    );
    for (k, d) in DTYPES.into_iter().enumerate() {
        println!(
            "{:>5}: {:>8.1} us  ({:.3}x f32)",
            d.name(),
            best[k] * 1e6,
            best[k] / best[0]
        );
    }
    println!(
        "f32 as bytes (gather_as: decoded into a scratch row, then copied): {:>8.1} us  ({:.3}x f32)",
        best[3] * 1e6,
        best[3] / best[0]
    );
}

fn main() {
    let t = table();
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, &t.table);
    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        summary(&t.table);
    }
}
