//! Warm gather latency from Rust: the reference that scripts/py_bench.py
//! compares the Python and C bindings against (same protocol in
//! crates/pleio-capi/bench/gather_overhead.c and in the script).
//!
//! ```sh
//! cargo run --release -p pleio-benches --example gather_overhead -- TABLE IDS_FILE ROUNDS
//! ```
//!
//! IDS_FILE holds one batch of row ids per line. Every batch is gathered
//! twice to warm the table, then ROUNDS times all batches in order; prints
//! `{"ns_per_gather": [one mean per round]}` as JSON.

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: {} TABLE IDS_FILE ROUNDS", args[0]);
        std::process::exit(2);
    }
    let table = pleio::Table::open(&args[1])?;
    let batches: Vec<Vec<u64>> = std::fs::read_to_string(&args[2])?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::parse).collect())
        .collect::<Result<_, _>>()?;
    let rounds: usize = args[3].parse()?;
    let max = batches.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = vec![0f32; max * table.row_elems()];
    for _ in 0..2 {
        for b in &batches {
            table.gather(b, &mut out[..b.len() * table.row_elems()])?;
        }
    }
    let mut means = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t0 = Instant::now();
        for b in &batches {
            table.gather(b, &mut out[..b.len() * table.row_elems()])?;
        }
        means.push(t0.elapsed().as_nanos() as f64 / batches.len() as f64);
    }
    let list: Vec<String> = means.iter().map(|m| format!("{m:.1}")).collect();
    println!("{{\"ns_per_gather\": [{}]}}", list.join(", "));
    Ok(())
}
