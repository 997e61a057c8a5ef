//! Gathers batches of random rows from a table in Redis and prints the
//! median and 90th percentile per batch (docs/remote.md: where the time of
//! a 1792-row batch goes, read beside the server's `INFO commandstats` and
//! its process's CPU time). With `--json`, one JSON object instead
//! (`rows`, `batches`, `median_us`, `p90_us`: what scripts/remote_speed.py
//! reads). With `--pause-ms N`, the client sleeps N ms before each batch,
//! as an engine does between decode steps: the servers and the client wake
//! from idle for every batch instead of running back to back. With
//! `--lookahead`, the client works as an engine with lookahead does
//! (llama.cpp's provider, `Table::prefetch`): when it takes batch k it
//! queues batch k+1's rows to the background worker, which reads them
//! during the pause; the time reported is what the engine waits for batch
//! k (taking it and queueing the next), not the read.
//!
//!     cargo run --release -p pleio-benches --example remote_gather -- \
//!         redis://127.0.0.1:PORT/NAME [ROWS=1792] [BATCHES=200] [STRATEGY=auto] \
//!         [--pause-ms N] [--lookahead] [--json]

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|s| s == "--json");
    let lookahead = args.iter().any(|s| s == "--lookahead");
    let pause_at = args.iter().position(|s| s == "--pause-ms");
    let pause = match pause_at {
        Some(i) => std::time::Duration::from_millis(
            args.get(i + 1)
                .ok_or("--pause-ms needs a number of milliseconds")?
                .parse()?,
        ),
        None => std::time::Duration::ZERO,
    };
    let a: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|&(i, s)| {
            s != "--json" && s != "--lookahead" && pause_at.is_none_or(|p| i != p && i != p + 1)
        })
        .map(|(_, s)| s)
        .collect();
    let url = a.get(1).ok_or(
        "usage: remote_gather redis://HOST:PORT/NAME [ROWS] [BATCHES] [STRATEGY] [--pause-ms N] [--lookahead] [--json]",
    )?;
    let n: usize = a.get(2).map_or(Ok(1792), |s| s.parse())?;
    let batches: usize = a.get(3).map_or(Ok(200), |s| s.parse())?;
    let strategy: pleio::Strategy = a.get(4).map_or(Ok(pleio::Strategy::Auto), |s| s.parse())?;
    let t = pleio::OpenOptions::new().strategy(strategy).open(url)?;
    let mut rng = pleio_lab::random::Rng::new(7);
    let mut out = vec![0u8; t.out_bytes(pleio::Dtype::Raw, n).ok_or("batch too large")?];
    let mut times = Vec::with_capacity(batches);
    let batch = |rng: &mut pleio_lab::random::Rng| -> Vec<u64> {
        (0..n).map(|_| rng.below(t.rows())).collect()
    };
    // With --lookahead, batch k+1 is queued when batch k is taken.
    let mut queued = if lookahead {
        Some(t.prefetch(&batch(&mut rng), pleio::Dtype::Raw)?)
    } else {
        None
    };
    // With --lookahead, the time the handover alone took (the rest is
    // queueing the next batch, during which, on a machine this small, the
    // worker and the servers it wakes can take the caller's core).
    let mut takes = Vec::new();
    for k in 0..batches {
        // The ids of the batch this one's gather reads (with --lookahead,
        // the next batch's, known to an engine before this one is taken).
        let rows = batch(&mut rng);
        std::thread::sleep(pause);
        let s = Instant::now();
        match queued.take() {
            Some(p) => {
                p.wait_into_bytes(&mut out)?;
                takes.push(s.elapsed().as_secs_f64() * 1e6);
                if k + 1 < batches {
                    queued = Some(t.prefetch(&rows, pleio::Dtype::Raw)?);
                }
            }
            None => {
                t.gather_as(pleio::Dtype::Raw, &rows, &mut out)?;
            }
        }
        times.push(s.elapsed().as_secs_f64() * 1e6);
    }
    let (median, p90) = percentiles(&mut times).ok_or("BATCHES must be at least 1")?;
    let take = percentiles(&mut takes).map(|(m, _)| m);
    if json {
        let take = take.map_or(String::new(), |m| format!(", \"take_median_us\": {m:.1}"));
        println!(
            "{{\"rows\": {n}, \"batches\": {batches}, \"median_us\": {median:.1}, \"p90_us\": {p90:.1}{take}}}"
        );
    } else {
        let take = take.map_or(String::new(), |m| {
            format!(" (handover alone: median {m:.1} us)")
        });
        println!(
            "{n} rows x {batches} batches from {}: median {median:.1} us, p90 {p90:.1} us{take}",
            t.path().display(),
        );
    }
    Ok(())
}

/// The median and 90th percentile of `v` (sorted here); `None` if empty.
fn percentiles(v: &mut [f64]) -> Option<(f64, f64)> {
    v.sort_by(f64::total_cmp);
    Some((*v.get(v.len() / 2)?, v[v.len() * 9 / 10]))
}
