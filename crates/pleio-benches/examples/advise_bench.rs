//! Cold and warm gather times, `fault` vs `advise` (both advice modes), on a
//! real table: the measurement behind issue 3's closing table.
//!
//! ```text
//! cargo run --release -p pleio --example advise_bench -- /work/big.gguf [batches]
//! ```
//!
//! Before each cold batch the table's byte range (only that range) is
//! dropped from this process's page tables and then from the page cache
//! (`posix_fadvise(DONTNEED)`), and the eviction is checked with `mincore`.
//! Rows are drawn at random, the same lists for every strategy.

use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

use pleio::fetch::{Strategy, Table};
use pleio::sys::{self, AdviceMode, OsAdvisor};
use pleio_lab::random::Rng;

/// One configuration to measure.
struct Case {
    label: &'static str,
    strategy: Strategy,
    mode: AdviceMode,
}

/// Mean and median of `xs` (microseconds).
fn summary(xs: &mut [f64]) -> (f64, f64) {
    xs.sort_by(f64::total_cmp);
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    (mean, xs[xs.len() / 2])
}

struct Bench {
    reader: Table,
    file: File,
    n_rows: u64,
    range: std::ops::Range<u64>,
}

impl Bench {
    fn rows(&self, batch: u64, n: usize, salt: u64) -> Vec<u64> {
        let mut rng = Rng::new(batch * 1_000_003 + n as u64 * 7 + salt);
        (0..n).map(|_| rng.below(self.n_rows)).collect()
    }

    /// Drops the table's pages from our page tables, then from the cache,
    /// until `mincore` sees at most the two partial edge pages (pages still
    /// under readahead I/O cannot be dropped until it completes).
    fn evict(&self) {
        let m = self.reader.mapping().expect("mapped");
        for _ in 0..200 {
            assert!(m.drop_resident(self.range.clone()), "MADV_DONTNEED refused");
            sys::evict(&self.file, self.range.clone()).expect("posix_fadvise");
            if self.resident() <= 2 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("eviction left {} pages resident", self.resident());
    }

    fn resident(&self) -> u64 {
        let m = self.reader.mapping().expect("mapped");
        m.resident_pages(self.range.clone()).unwrap_or(u64::MAX)
    }

    /// Cold: per batch evict, then one timed gather. Returns per-gather us,
    /// mean major faults, mean syscalls.
    fn cold(&self, c: &Case, n: usize, batches: u64) -> (Vec<f64>, f64, f64) {
        let reader = self
            .reader
            .clone()
            .with_advisor(Arc::new(OsAdvisor::new(c.mode)))
            .with_detailed_stats(true);
        let mut out = vec![0f32; n * reader.row_elems()];
        let (mut times, mut faults, mut calls) = (Vec::new(), 0u64, 0u64);
        for b in 0..batches {
            let rows = self.rows(b, n, 0);
            self.evict();
            let t = Instant::now();
            let st = reader
                .gather_with(c.strategy, &rows, &mut out)
                .expect("gather");
            times.push(t.elapsed().as_secs_f64() * 1e6);
            faults += st.major_faults.unwrap_or(0);
            calls += st.advice_syscalls;
            std::hint::black_box(&out);
        }
        (
            times,
            faults as f64 / batches as f64,
            calls as f64 / batches as f64,
        )
    }

    /// Warm: per batch, one untimed gather brings the rows in, then `reps`
    /// timed gathers; returns the per-gather mean of each batch.
    fn warm(&self, c: &Case, n: usize, batches: u64, reps: u32) -> Vec<f64> {
        let reader = self
            .reader
            .clone()
            .with_advisor(Arc::new(OsAdvisor::new(c.mode)));
        let mut out = vec![0f32; n * reader.row_elems()];
        (0..batches)
            .map(|b| {
                let rows = self.rows(b, n, 1);
                reader
                    .gather_with(c.strategy, &rows, &mut out)
                    .expect("gather");
                let t = Instant::now();
                for _ in 0..reps {
                    reader
                        .gather_with(c.strategy, &rows, &mut out)
                        .expect("gather");
                    std::hint::black_box(&out);
                }
                t.elapsed().as_secs_f64() * 1e6 / f64::from(reps)
            })
            .collect()
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "/work/big.gguf".into());
    let batches: u64 = args.next().map_or(40, |s| s.parse().expect("batches"));
    let reader = Table::open(&path).expect("PLE table");
    let range = reader.layout().byte_range();
    let n_rows = reader.rows();
    let bench = Bench {
        reader,
        file: File::open(&path).expect("open"),
        n_rows,
        range,
    };
    println!(
        "{path}: {} rows, {:.2} GiB table, page {} B, {batches} batches per cell",
        n_rows,
        bench.range.end.saturating_sub(bench.range.start) as f64 / (1u64 << 30) as f64,
        sys::page_size()
    );
    let cases = [
        Case {
            label: "fault",
            strategy: Strategy::Fault,
            mode: AdviceMode::PerRun,
        },
        Case {
            label: "advise (madvise per run)",
            strategy: Strategy::Advise,
            mode: AdviceMode::PerRun,
        },
        Case {
            label: "advise (process_madvise per chunk)",
            strategy: Strategy::Advise,
            mode: AdviceMode::Batched,
        },
    ];
    println!("\n| strategy | rows | cold mean ms | cold median ms | major faults / gather | advice syscalls / gather |");
    println!("|---|---|---|---|---|---|");
    for n in [16usize, 1792] {
        for c in &cases {
            let (mut t, faults, calls) = bench.cold(c, n, batches);
            let (mean, med) = summary(&mut t);
            println!(
                "| {} | {n} | {:.3} | {:.3} | {faults:.1} | {calls:.1} |",
                c.label,
                mean / 1e3,
                med / 1e3
            );
        }
    }
    println!("\n| strategy | rows | warm mean us | warm median us |");
    println!("|---|---|---|---|");
    for n in [16usize, 1792] {
        let reps = if n == 16 { 2000 } else { 50 };
        for c in &cases {
            let (mean, med) = summary(&mut bench.warm(c, n, batches, reps));
            println!("| {} | {n} | {mean:.2} | {med:.2} |", c.label);
        }
    }
}
