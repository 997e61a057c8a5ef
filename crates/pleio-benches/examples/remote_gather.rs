//! Gathers batches of random rows from a table in Redis and prints the
//! median and 90th percentile per batch (docs/remote.md: where the time of
//! a 1792-row batch goes, read beside the server's `INFO commandstats` and
//! its process's CPU time).
//!
//!     cargo run --release -p pleio-benches --example remote_gather -- \
//!         redis://127.0.0.1:PORT/NAME [ROWS=1792] [BATCHES=200] [STRATEGY=auto]

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let url = a
        .get(1)
        .ok_or("usage: remote_gather redis://HOST:PORT/NAME [ROWS] [BATCHES] [STRATEGY]")?;
    let n: usize = a.get(2).map_or(Ok(1792), |s| s.parse())?;
    let batches: usize = a.get(3).map_or(Ok(200), |s| s.parse())?;
    let strategy: pleio::Strategy = a.get(4).map_or(Ok(pleio::Strategy::Auto), |s| s.parse())?;
    let t = pleio::OpenOptions::new().strategy(strategy).open(url)?;
    let mut rng = pleio_lab::random::Rng::new(7);
    let mut out = vec![0u8; t.out_bytes(pleio::Dtype::Raw, n).ok_or("batch too large")?];
    let mut times = Vec::with_capacity(batches);
    for _ in 0..batches {
        let rows: Vec<u64> = (0..n).map(|_| rng.below(t.rows())).collect();
        let s = Instant::now();
        t.gather_as(pleio::Dtype::Raw, &rows, &mut out)?;
        times.push(s.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{n} rows x {batches} batches from {}: median {:.1} us, p90 {:.1} us",
        t.path().display(),
        times[times.len() / 2],
        times[times.len() * 9 / 10]
    );
    Ok(())
}
