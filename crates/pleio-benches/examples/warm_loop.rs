//! Warm gathers in a loop: LISTS lists of random rows, each gathered once
//! untimed, then the lists in turn for ITERS gathers; prints the mean time
//! per gather. Unlike `pleio bench --cold none`, which repeats one list and
//! so finds its rows in the CPU's caches, the rows here come from memory
//! (docs/benchmarks.md, "Warm gathers against the warm floor"). f32 rows
//! go into a float slice (`Table::gather`, an engine's call), the other
//! types into bytes (`gather_as`). LISTS (default 64) sets how many lists
//! there are: 1 repeats one list, as `pleio bench` does.
//!
//!     cargo run --release -p pleio-benches --example warm_loop -- \
//!         TABLE ROWS ITERS [STRATEGY=auto] [DTYPE=raw] [LISTS=64]

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: warm_loop TABLE ROWS ITERS [STRATEGY] [DTYPE] [LISTS]";
    let path = a.get(1).ok_or(usage)?;
    let n: usize = a.get(2).ok_or(usage)?.parse()?;
    let iters: usize = a.get(3).ok_or(usage)?.parse()?;
    let strategy: pleio::Strategy = a.get(4).map_or(Ok(pleio::Strategy::Auto), |s| s.parse())?;
    let dtype: pleio::Dtype = a.get(5).map_or(Ok(pleio::Dtype::Raw), |s| s.parse())?;
    let lists: usize = a.get(6).map_or(Ok(64), |s| s.parse())?;
    if iters == 0 || lists == 0 {
        return Err("ITERS and LISTS must be at least 1".into());
    }
    let t = pleio::OpenOptions::new().strategy(strategy).open(path)?;
    let mut rng = pleio_lab::random::Rng::new(7);
    let lists: Vec<Vec<u64>> = (0..lists)
        .map(|_| (0..n).map(|_| rng.below(t.rows())).collect())
        .collect();
    let mut out = vec![0u8; t.out_bytes(dtype, n).ok_or("batch too large")?];
    let mut floats = vec![0f32; n * t.row_elems()];
    // f32 into floats, as an engine gathers (`gather`); the rest as bytes
    let mut gather = |l: &[u64]| match dtype {
        pleio::Dtype::F32 => t.gather(l, &mut floats).map(drop),
        _ => t.gather_as(dtype, l, &mut out).map(drop),
    };
    for l in &lists {
        gather(l)?;
    }
    let s = Instant::now();
    for l in lists.iter().cycle().take(iters) {
        gather(l)?;
    }
    let ns = s.elapsed().as_nanos() as f64 / iters as f64;
    println!("{strategy} {n} rows {dtype}: {ns:.0} ns per gather (mean of {iters})");
    Ok(())
}
