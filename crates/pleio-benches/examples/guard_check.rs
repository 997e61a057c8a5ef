//! The cost of the SIGBUS guard's per-gather check: `Table::sigbus_guard()`
//! makes the same `sigaction` query a mapped gather makes before its first
//! copy; a gather adds one signal-mask query. Also times warm 16-row `fault`
//! gathers, which include both. Each figure is the minimum over trials of
//! the mean of a few calls (what the code costs when nothing interferes).
//!
//! ```sh
//! target/release/pleio synth --rows 200000 -o small.gguf
//! cargo run --release -p pleio-benches --example guard_check -- small.gguf
//! ```

use std::hint::black_box;
use std::time::Instant;

use pleio::{Strategy, Table};

/// Minimum over `trials` of the mean nanoseconds of `reps` calls of `f`.
fn min_ns(trials: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    (0..trials)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..reps {
                f();
            }
            t0.elapsed().as_nanos() as f64 / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: guard_check FILE.gguf");
        std::process::exit(2);
    };
    let table = Table::open(&path).expect("open the PLE table");
    println!("guard: {:?}", table.sigbus_guard());
    let check = min_ns(2000, 100, || {
        black_box(table.sigbus_guard());
    });
    println!("sigbus_guard() (one sigaction query): {check:.0} ns");
    let rows: Vec<u64> = (0..16).map(|i| i * 997 % table.rows()).collect();
    let mut out = vec![0f32; rows.len() * table.row_elems()];
    let gather = min_ns(2000, 100, || {
        black_box(table.gather_with(Strategy::Fault, &rows, &mut out).unwrap());
    });
    println!("warm fault gather of 16 rows (check included): {gather:.0} ns");
}
