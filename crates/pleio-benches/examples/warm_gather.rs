//! Warm gathers through the mapping, timed robustly: `fault` and `auto` on
//! rows already in the page cache, 16 rows (one decode step) and 1792 rows
//! (a prefill ubatch's worth), each on one row list repeated (`same`:
//! caches and TLB hot, so a gather's fixed costs show) and cycling through
//! 64 lists (`cycled`). This is the path the SIGBUS guard sits on (row bytes
//! copied out of the mapping by the guarded routine, then decoded).
//!
//! Each figure is the minimum over many trials of the mean time of a few
//! gathers: the minimum is what the code costs when nothing else on the
//! machine interferes, so it compares builds on a loaded machine.
//!
//! ```sh
//! target/release/pleio synth --rows 48000000 -o big.gguf   # the 4 GiB table of docs/benchmarks.md
//! cargo run --release -p pleio-benches --example warm_gather -- big.gguf
//! ```

use std::hint::black_box;
use std::time::Instant;

use pleio::{Strategy, Table};
use pleio_lab::random::Rng;

/// Row lists per batch size.
const LISTS: usize = 64;

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: warm_gather FILE.gguf");
        std::process::exit(2);
    };
    let reader = Table::open(&path).expect("open the PLE table");
    let n_rows = reader.rows();
    let mut rng = Rng::new(0x5eed);
    println!("{path}: {n_rows} rows; minimum over trials, microseconds per gather");
    // (rows per gather, gathers per trial, trials)
    for (size, reps, trials) in [(16usize, 200usize, 3000usize), (1792, 2, 400)] {
        let lists: Vec<Vec<u64>> = (0..LISTS)
            .map(|_| (0..size).map(|_| rng.below(n_rows)).collect())
            .collect();
        let mut out = vec![0f32; size * reader.row_elems()];
        for s in [Strategy::Fault, Strategy::Auto] {
            // Warm: every list read twice, so `auto` knows its pages too.
            for l in lists.iter().chain(&lists) {
                reader.gather_with(s, l, &mut out).expect("gather");
            }
            for same in [true, false] {
                let mut best = f64::MAX;
                let mut k = 0;
                for _ in 0..trials {
                    let t = Instant::now();
                    for _ in 0..reps {
                        if !same {
                            k = (k + 1) % LISTS;
                        }
                        reader
                            .gather_with(s, black_box(&lists[k]), &mut out)
                            .expect("gather");
                    }
                    best = best.min(t.elapsed().as_secs_f64() / reps as f64);
                }
                let how = if same { "same" } else { "cycled" };
                println!("{:5} {size:4} rows {how:6} {:9.3}", s.name(), best * 1e6);
            }
        }
    }
}
