//! `pleio bench`: cold and warm gather latency of every strategy against the
//! device floor, with a bit-for-bit check across strategies.

use std::path::PathBuf;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use pleio::bench::{Arm, Bench, BenchConfig, ColdMode, Progress, Report};
use pleio::fetch::Strategy;
use serde_json::{json, Value};

use crate::output::{human_bytes, write_atomic};

/// Measure gather latency of every strategy, cold and warm, against the
/// device floor (`limit`: the same batches' distinct pages read with
/// O_DIRECT at queue depth 64).
///
/// Cold arms evict the table's byte range before each batch (checked with
/// mincore); warm arms repeat the same rows with the table resident. Every
/// arm's f32 output is compared bit for bit; any difference fails the run
/// (exit status 2). The table goes to stdout, progress to stderr.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (e.g. from `pleio synth`).
    file: PathBuf,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,1792,8192")]
    rows: Vec<usize>,
    /// Strategies, comma-separated (fault is always included: ratios need it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fault,advise,pread,uring,uring-direct,pool,auto"
    )]
    strategies: Vec<Strategy>,
    /// Row lists (cold batches) per size; each is also timed warm.
    #[arg(long, default_value_t = 30)]
    batches: usize,
    /// evict: evict the table before each cold batch; mincore: draw cold
    /// rows among nonresident pages, evicting nothing; none: warm arms only.
    #[arg(long, default_value = "evict")]
    cold: ColdMode,
    /// Seed of the row lists.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Any 2-D tensor to read instead of `per_layer_token_embd.weight`.
    #[arg(long)]
    tensor: Option<String>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Overwrite an existing JSON file.
    #[arg(long)]
    force: bool,
}

pub fn run(a: Args) -> Result<()> {
    let bench =
        Bench::open(&a.file, a.tensor.as_deref()).with_context(|| a.file.display().to_string())?;
    let cfg = BenchConfig {
        rows: a.rows.clone(),
        strategies: a.strategies.clone(),
        batches: a.batches,
        cold: a.cold,
        seed: a.seed,
        limit: true,
    };
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("{msg:>16} [{bar:30}] {pos}/{len} gathers, eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let report = bench.run(&cfg, &mut |p: Progress<'_>| {
        bar.set_length(p.total);
        bar.set_position(p.done);
        bar.set_message(p.phase.to_string());
    });
    bar.finish_and_clear();
    let report = report.with_context(|| a.file.display().to_string())?;
    print_table(&report);
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&to_json(&report))?;
        write_atomic(path, a.force, |w| {
            w.write_all(text.as_bytes())?;
            w.write_all(b"\n")
        })?;
    }
    Ok(())
}

fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

fn print_table(r: &Report) {
    let t = &r.table;
    let m = &r.machine;
    println!(
        "{}: {} {} rows x {} B ({}), cold: {}, {} batches per size, seed {}",
        r.file.display(),
        t.ty,
        t.rows,
        t.row_bytes,
        human_bytes(t.bytes),
        r.cold.name(),
        r.batches,
        r.seed
    );
    println!(
        "machine: {}, {} CPUs, {} RAM, Linux {}, page {} B",
        m.cpu,
        m.cpus,
        human_bytes(m.mem_bytes),
        m.kernel,
        m.page_bytes
    );
    println!();
    println!("| strategy | rows | cold | mean us | median us | p99 us | us/row | pages | read from device | major faults | requests | advice fail | peak RSS | vs fault | vs limit |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for arm in &r.arms {
        print_arm(arm);
    }
    let c = &r.residency;
    println!();
    println!(
        "residency checks: clock read {:.0} ns (auto: one per 8 warm rows), mincore of one row {:.2} us, mincore of the whole table {:.1} ms",
        c.clock_ns, c.mincore_row_us, c.mincore_table_ms
    );
    if r.arms.iter().any(|a| a.fallback) {
        println!("note: some arms ran on a fallback backend (io_uring or O_DIRECT unavailable)");
    }
}

fn print_arm(a: &Arm) {
    let name = if a.fallback {
        format!("{} (fallback)", a.strategy)
    } else {
        a.strategy.to_string()
    };
    println!(
        "| {name} | {} | {} | {:.1} | {:.1} | {:.1} | {:.3} | {:.0} | {} | {:.1} | {:.0} | {} | {} | {} | {} |",
        a.rows,
        if a.cold { "cold" } else { "warm" },
        a.mean_us,
        a.median_us,
        a.p99_us,
        a.us_per_row,
        a.distinct_pages,
        human_bytes(a.bytes_read as u64),
        a.major_faults,
        a.read_requests,
        a.advice_failures,
        a.peak_rss.map_or_else(|| "-".into(), human_bytes),
        ratio(a.ratio_to_fault),
        ratio(a.ratio_to_limit),
    );
}

/// `{"machine":{..},"file":..,"table":{..},"arms":[..]}`.
pub(crate) fn to_json(r: &Report) -> Value {
    let m = &r.machine;
    let t = &r.table;
    let c = &r.residency;
    json!({
        "machine": {
            "cpu": m.cpu,
            "cpus": m.cpus,
            "mem_bytes": m.mem_bytes,
            "kernel": m.kernel,
            "page_bytes": m.page_bytes,
        },
        "file": r.file.display().to_string(),
        "file_bytes": r.file_bytes,
        "table": {
            "name": t.name,
            "type": t.ty,
            "rows": t.rows,
            "row_bytes": t.row_bytes,
            "row_elems": t.row_elems,
            "bytes": t.bytes,
            "offset": t.offset,
        },
        "cold_mode": r.cold.name(),
        "batches": r.batches,
        "seed": r.seed,
        "residency_costs": {
            "clock_ns": c.clock_ns,
            "mincore_row_us": finite(c.mincore_row_us),
            "mincore_table_ms": finite(c.mincore_table_ms),
        },
        "arms": r.arms.iter().map(arm_json).collect::<Vec<_>>(),
    })
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn arm_json(a: &Arm) -> Value {
    json!({
        "strategy": a.strategy,
        "rows": a.rows,
        "cold": a.cold,
        "samples": a.samples,
        "mean_us": a.mean_us,
        "median_us": a.median_us,
        "p99_us": a.p99_us,
        "us_per_row": a.us_per_row,
        "distinct_pages": a.distinct_pages,
        "bytes_read": a.bytes_read,
        "major_faults": a.major_faults,
        "read_requests": a.read_requests,
        "advice_failures": a.advice_failures,
        "cold_rows": a.cold_rows,
        "rearms": a.rearms,
        "fallback": a.fallback,
        "peak_rss_bytes": a.peak_rss,
        "ratio_to_fault": a.ratio_to_fault.and_then(finite),
        "ratio_to_limit": a.ratio_to_limit.and_then(finite),
    })
}
