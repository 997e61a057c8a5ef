//! `pleio replay`: a token stream's prefill and decode through the PLE stage.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use pleio::fetch::Strategy;
use pleio::CachePolicy;
use pleio_lab::bench::Machine;
use pleio_lab::floor::{DepthSweep, Floor, PhaseFloor};
use pleio_lab::replay::{
    Eviction, Latency, PhaseReport, ReplayConfig, ReplayFloor, ReplayPlan, ReplayReport, Replayer,
    UbatchReport,
};
use serde_json::{json, Value as Json};

use super::rows::Input;
use crate::outfile;
use crate::output::{human_bytes, InFile};
use crate::report;

/// Replay a token stream through the PLE stage: prefill in ubatches, then
/// decode steps of one token, gathering every row the model would ask for.
///
/// The stream is one sequence mapped with history (qwen4exp n-gram hash,
/// gemma4 identity). Decode steps are the tokens after the prefill part
/// (by default the stream's last `--decode` tokens); tokens past the end of
/// the stream are drawn from it at random (`--seed`). Reports PLE-stage
/// tokens/s (tokens per second of gather time), per-ubatch gather latency,
/// distinct rows and pages, rows reused from earlier ubatches, bytes read
/// from the device, major faults and peak RSS. With `--cold`, also the
/// device floor of each phase (its rows' distinct extents read cold with
/// O_DIRECT at the fastest queue depth, median of several passes), the
/// floor's tokens/s and the gather time's ratio to it.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (or any shard of a split set) with a PLE table, or a
    /// safetensors checkpoint: its directory, index, one file, or a
    /// ple-store.json.
    file: PathBuf,
    #[command(flatten)]
    layer: crate::table_args::LayerArg,
    #[command(flatten)]
    input: Input,
    /// Tokens per prefill ubatch.
    #[arg(long, default_value_t = 512)]
    ubatch: usize,
    /// Prefill tokens (default: the stream minus the decode tokens).
    #[arg(long)]
    prefill: Option<usize>,
    /// Decode steps of one token each.
    #[arg(long, default_value_t = 64)]
    decode: usize,
    /// How row bytes are brought in (default: the library's default
    /// strategy).
    #[arg(long, default_value_t = Strategy::default())]
    strategy: Strategy,
    /// Evict the table from the page cache (checked with mincore) before
    /// the prefill and again before the decode steps.
    #[arg(long)]
    cold: bool,
    /// Prefetch ubatch k+1 in the background while ubatch k computes.
    #[arg(long)]
    lookahead: bool,
    /// Simulated model compute per prefill ubatch, in milliseconds (a
    /// sleep after each gather; with --lookahead the next ubatch is
    /// fetched meanwhile).
    #[arg(long, default_value_t = 0.0)]
    compute_ms: f64,
    /// Seed of the decode tokens drawn when the stream runs out.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Replay the stream this many times in one process, reporting each
    /// pass. With --cold only the first pass starts cold: the table is
    /// evicted (and the row cache emptied) once, before its prefill.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    passes: u64,
    /// Row cache budget of the `cached` strategy (e.g. 256M): slots,
    /// bookkeeping and read staging together stay within it.
    #[arg(long, value_name = "SIZE", value_parser = pleio_lab::units::parse_quantity_arg)]
    budget: Option<u64>,
    /// Eviction policy of the row cache (lru, clock, sieve, s3-fifo).
    #[arg(long, value_name = "POLICY")]
    cache_policy: Option<CachePolicy>,
    /// Print one JSON object (the `pleio-report/1` schema).
    #[arg(long)]
    json: bool,
    /// Draw the gather latency of every prefill ubatch to this SVG file.
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<PathBuf>,
    /// Run the replay in a memory cgroup capped at this size (e.g. 2G;
    /// needs root and a memory controller), the table evicted first:
    /// reports whether it stays within the cap and what it measures there.
    #[arg(long, value_name = "SIZE", value_parser = pleio_lab::units::parse_quantity_arg)]
    mem_cap: Option<u64>,
    /// Skip the device floor (capped children: the parent measures it
    /// outside the cap).
    #[arg(long, hide = true)]
    no_floor: bool,
}

pub fn run(a: Args) -> Result<()> {
    crate::table_args::files_only(&a.file, "replay")?;
    if let Some(out) = &a.plot {
        outfile::check_chart(out)?;
    }
    if let Some(cap) = a.mem_cap {
        return run_capped(&a, cap);
    }
    let (replayer, tokens, cfg) = setup(&a)?;
    let plan = replayer.plan(&tokens, &cfg).in_file(&a.file)?;
    let reps = replayer.run_passes(&plan, &cfg).in_file(&a.file)?;
    if let Some(r) = reps.iter().find(|r| r.checksum != reps[0].checksum) {
        bail!(
            "pass {} gathered different floats than pass 1 (checksum {:016x} vs {:016x})",
            r.pass,
            r.checksum,
            reps[0].checksum
        );
    }
    let floor = if a.cold && !a.no_floor {
        measure_floor(&replayer, &plan, a.seed)
    } else {
        None
    };
    let j = to_json(&a, &replayer, tokens.len(), &reps, floor.as_ref());
    if a.json {
        println!("{j}");
    } else {
        for rep in &reps {
            if rep.pass > 1 {
                println!();
            }
            print_text(
                &a,
                &replayer,
                tokens.len(),
                rep,
                pass_floor(rep, floor.as_ref()),
            );
        }
        if reps.len() > 1 {
            print_passes(&reps);
        }
    }
    plot(&a, &j)
}

/// The replayer, the token stream and the replay's settings.
fn setup(a: &Args) -> Result<(Replayer, Vec<u32>, ReplayConfig)> {
    let compute = Duration::try_from_secs_f64(a.compute_ms / 1e3)
        .ok()
        .context("--compute-ms must be a non-negative number of milliseconds (at most 2^64 s)")?;
    let replayer = Replayer::open_with(&a.file, &a.layer.options(None))
        .and_then(|r| r.with_cache(a.budget, a.cache_policy))
        .in_file(&a.file)?;
    let tokens = a.input.load(replayer.mapper())?;
    let cfg = ReplayConfig {
        ubatch: a.ubatch,
        prefill: a.prefill,
        decode: a.decode,
        strategy: a.strategy,
        cold: a.cold,
        lookahead: a.lookahead,
        compute,
        seed: a.seed,
        passes: a.passes as usize,
    };
    Ok((replayer, tokens, cfg))
}

/// The device floor of `plan` at the queue depth a sweep finds fastest, or
/// `None` (with a warning) where `O_DIRECT` io_uring reads cannot be made.
fn measure_floor(r: &Replayer, plan: &ReplayPlan, seed: u64) -> Option<(DepthSweep, ReplayFloor)> {
    let t = r.reader();
    let measured = Floor::fastest(t, pleio::sys::page_size(), seed)
        .map_err(anyhow::Error::from)
        .and_then(|(floor, sweep)| Ok((sweep, r.floor(plan, &floor)?)));
    match measured {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("pleio: no device floor: {e:#}");
            None
        }
    }
}

/// `--plot`: the chart, its path on stdout (stderr under `--json`).
fn plot(a: &Args, j: &Json) -> Result<()> {
    if let Some(out) = &a.plot {
        report::replay_chart(j, out)?;
        if a.json {
            eprintln!("chart: {}", out.display());
        } else {
            println!("chart: {}", out.display());
        }
    }
    Ok(())
}

/// `--mem-cap`: the same replay by a child of this program in a capped
/// cgroup; its report plus `mem_cap`.
fn run_capped(a: &Args, cap: u64) -> Result<()> {
    let stdin = Some(std::path::Path::new("-"));
    if a.input.tokens.as_deref() == stdin || a.input.text.as_deref() == stdin {
        bail!("--mem-cap cannot pass stdin on to the capped run: give --tokens or --text a file");
    }
    let version = report::probe_cap(cap)?;
    let mut args =
        report::args_without(&[("--mem-cap", true), ("--plot", true), ("--json", false)]);
    args.push("--json".into());
    args.push("--no-floor".into());
    let label = a.strategy.name();
    if !a.json {
        eprintln!(
            "{label}: replaying inside a {} memory cap",
            human_bytes(cap)
        );
    }
    let run = report::run_capped(cap, label, &a.file, &args)?;
    let mut j = match &run.report {
        Some(r) => r.clone(),
        None => {
            let t = a.layer.open(&a.file, None)?;
            let mut j = report::envelope("replay", &Machine::detect(), &a.file, t.layout());
            j["replays"] = json!([]);
            j
        }
    };
    j["mem_cap"] = report::mem_cap_json(cap, version, std::slice::from_ref(&run));
    if a.cold && run.report.is_some() {
        // The floor measures the device, not the cap: measured here, for
        // the same plan.
        let (replayer, tokens, cfg) = setup(a)?;
        let plan = replayer.plan(&tokens, &cfg)?;
        if let Some((sweep, f)) = measure_floor(&replayer, &plan, a.seed) {
            j["floor"] = report::floor_json(&sweep);
            let r = &mut j["replays"][0];
            add_floor(&mut r["prefill"], Some(&f.prefill));
            if a.passes == 1 {
                add_floor(&mut r["decode"], Some(&f.decode));
            }
        }
    }
    if a.json {
        println!("{j}");
    } else {
        println!("{}", run.summary());
        for r in j["replays"].as_array().into_iter().flatten() {
            let f = |v: &Json| {
                v.as_f64()
                    .map_or_else(|| "n/a".into(), |x| format!("{x:.0}"))
            };
            let p99 = |v: &Json| {
                v.as_f64()
                    .map_or_else(|| "n/a".into(), |x| format!("{x:.3}"))
            };
            println!(
                "pass {}: prefill {} tokens/s (ubatch gather p99 {} ms), decode {} tokens/s (step p99 {} ms), peak RSS {}",
                r["pass"],
                f(&r["prefill"]["tokens_per_s"]),
                p99(&r["prefill"]["latency_ms"]["p99"]),
                f(&r["decode"]["tokens_per_s"]),
                p99(&r["decode"]["latency_ms"]["p99"]),
                r["peak_rss_bytes"].as_u64().map_or_else(|| "n/a".into(), human_bytes),
            );
        }
    }
    if run.outcome() == "failed" {
        bail!("capped run failed: {}", run.summary());
    }
    if run.report.is_some() {
        plot(a, &j)?;
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn latency_json(l: Option<Latency>) -> Json {
    l.map_or(
        Json::Null,
        |l| json!({"p50": ms(l.p50), "p90": ms(l.p90), "p99": ms(l.p99), "max": ms(l.max)}),
    )
}

/// A phase's figures; with its floor, `floor_ms` (the floor time),
/// `floor_tokens_per_s`, `ratio_to_floor` (gather over floor time) and the
/// floor's details under `floor` (all `null` without).
fn phase_json(p: &PhaseReport, floor: Option<&PhaseFloor>) -> Json {
    let mut j = json!({
        "tokens": p.tokens,
        "steps": p.steps,
        "rows": p.rows,
        "distinct_rows": p.distinct_rows,
        "reused_rows": p.reused_rows,
        "tokens_per_s": p.tokens_per_s(),
        "gather_ms": ms(p.gather),
        "exposed_ms": ms(p.exposed),
        "wall_ms": ms(p.wall),
        "latency_ms": latency_json(p.latency),
        "read_bytes": p.read_bytes,
        "process_major_faults": p.process_major_faults,
        "gather_read_bytes": p.gathers.read_bytes,
        "read_requests": p.gathers.read_requests,
        "cache_hits": p.gathers.cache_hits,
        "cache_misses": p.gathers.cache_misses,
        "cache_evictions": p.gathers.cache_evictions,
    });
    add_floor(&mut j, floor);
    j
}

/// Sets a phase's `floor_ms` (the floor time), `floor_tokens_per_s`,
/// `ratio_to_floor` (its `gather_ms` over the floor's) and `floor` (the
/// details), all `null` without a floor.
fn add_floor(phase: &mut Json, floor: Option<&PhaseFloor>) {
    // The same expression as the details' `median_ms`.
    let floor_ms = floor.map(|f| f.timing.median_us / 1e3).filter(|&f| f > 0.0);
    let tokens = phase["tokens"].as_u64().unwrap_or(0);
    let per_s = |x: f64| (tokens > 0).then(|| tokens as f64 * 1e3 / x);
    phase["floor_ms"] = json!(floor_ms);
    phase["floor_tokens_per_s"] = json!(floor_ms.and_then(per_s));
    phase["ratio_to_floor"] = json!(floor_ms.and_then(|f| Some(phase["gather_ms"].as_f64()? / f)));
    phase["floor"] = floor.map_or(Json::Null, report::phase_floor_json);
}

fn ubatch_json(u: &UbatchReport) -> Json {
    json!({
        "index": u.index,
        "tokens": u.tokens,
        "rows": u.rows,
        "distinct_rows": u.distinct_rows,
        "distinct_pages": u.distinct_pages,
        "reused_rows": u.reused_rows,
        "gather_ms": ms(u.gather),
        "exposed_ms": ms(u.exposed),
        "read_bytes": u.read_bytes,
        "process_major_faults": u.process_major_faults,
    })
}

fn eviction_json(e: &Eviction) -> Json {
    json!({
        "pages": e.pages,
        "resident_before": e.resident_before,
        "resident_after": e.resident_after,
    })
}

fn sum_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a? + b?)
}

/// The floor that applies to `rep`: pass 1's, when it started cold (with
/// more passes its decode steps were not evicted: no decode floor).
fn pass_floor<'a>(
    rep: &ReplayReport,
    floor: Option<&'a (DepthSweep, ReplayFloor)>,
) -> Option<PassFloor<'a>> {
    let f = floor.filter(|_| rep.pass == 1 && !rep.evictions.is_empty())?;
    Some(PassFloor {
        sweep: &f.0,
        prefill: &f.1.prefill,
        decode: (rep.evictions.len() > 1).then_some(&f.1.decode),
    })
}

/// The device floor figures of one pass.
#[derive(Clone, Copy)]
struct PassFloor<'a> {
    sweep: &'a DepthSweep,
    prefill: &'a PhaseFloor,
    decode: Option<&'a PhaseFloor>,
}

fn to_json(
    a: &Args,
    r: &Replayer,
    stream: usize,
    reps: &[ReplayReport],
    floor: Option<&(DepthSweep, ReplayFloor)>,
) -> Json {
    let t = r.reader().layout();
    let mut j = report::envelope("replay", &Machine::detect(), &a.file, t);
    j["floor"] = floor.map_or(Json::Null, |(sweep, _)| report::floor_json(sweep));
    j["replays"] = reps
        .iter()
        .map(|rep| replay_json(a, r, stream, rep, pass_floor(rep, floor)))
        .collect();
    j
}

fn replay_json(
    a: &Args,
    r: &Replayer,
    stream: usize,
    rep: &ReplayReport,
    floor: Option<PassFloor<'_>>,
) -> Json {
    let mut decode = phase_json(&rep.decode, floor.and_then(|f| f.decode));
    decode["drawn_tokens"] = json!(rep.drawn);
    json!({
        "architecture": r.mapper().architecture(),
        "pass": rep.pass,
        "strategy": rep.strategy.name(),
        "lookahead": rep.lookahead,
        "compute_ms": ms(rep.compute),
        "cold": !rep.evictions.is_empty(),
        "ubatch": rep.ubatch,
        "seed": a.seed,
        "stream_tokens": stream,
        "prefill": phase_json(&rep.prefill, floor.map(|f| f.prefill)),
        "decode": decode,
        "ubatches": rep.ubatches.iter().map(ubatch_json).collect::<Vec<_>>(),
        "evictions": rep.evictions.iter().map(eviction_json).collect::<Vec<_>>(),
        "read_bytes": sum_opt(rep.prefill.read_bytes, rep.decode.read_bytes),
        "process_major_faults": sum_opt(rep.prefill.process_major_faults, rep.decode.process_major_faults),
        "peak_rss_bytes": rep.peak_rss,
        "checksum": format!("{:016x}", rep.checksum),
        "lookahead_counters": rep.lookahead_counters.map(|c| json!({
            "prefetches": c.prefetches,
            "worker_gathers": c.worker_gathers,
            "worker_rows": c.worker_rows,
            "cancelled": c.cancelled,
        })),
        "cache": rep.cache_config.map(|(budget, policy)| json!({
            "budget_bytes": budget,
            "policy": policy.name(),
            "capacity_rows": rep.cache.map(|c| c.capacity),
            "resident_rows": rep.cache.map(|c| c.rows),
            "resident_bytes": rep.cache.map(|c| c.resident_bytes),
            "evictions_total": rep.cache.map(|c| c.evictions),
        })),
    })
}

/// One line per pass: prefill and decode tokens/s, and each pass's
/// prefill rate over the first's.
fn print_passes(reps: &[ReplayReport]) {
    println!();
    println!(
        "| pass | prefill tokens/s | vs pass 1 | decode tokens/s | device reads | cache hit rate |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let first = reps[0].prefill.tokens_per_s();
    for r in reps {
        let p = r.prefill.tokens_per_s();
        let g = &r.prefill.gathers;
        let lookups = g.cache_hits + g.cache_misses;
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.pass,
            p.map_or_else(|| "n/a".into(), |x| format!("{x:.0}")),
            p.zip(first)
                .map_or_else(|| "n/a".into(), |(x, f)| format!("{:.2}x", x / f)),
            r.decode
                .tokens_per_s()
                .map_or_else(|| "n/a".into(), |x| format!("{x:.0}")),
            opt_bytes(sum_opt(r.prefill.read_bytes, r.decode.read_bytes)),
            if lookups > 0 {
                format!("{:.1}%", 100.0 * g.cache_hits as f64 / lookups as f64)
            } else {
                "-".into()
            },
        );
    }
}

fn opt_bytes(b: Option<u64>) -> String {
    b.map_or_else(|| "n/a".into(), human_bytes)
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| v.to_string())
}

fn rate(p: &PhaseReport) -> String {
    p.tokens_per_s()
        .map_or_else(|| "n/a".into(), |r| format!("{r:.0} tokens/s"))
}

fn latency_text(l: Option<Latency>) -> String {
    l.map_or_else(
        || "n/a".into(),
        |l| {
            format!(
                "p50 {:.3} p90 {:.3} p99 {:.3} max {:.3} ms",
                ms(l.p50),
                ms(l.p90),
                ms(l.p99),
                ms(l.max)
            )
        },
    )
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (n, s) = xs.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// `floor 12345 tokens/s (PLE 1.23x the floor)`, or nothing.
fn floor_text(p: &PhaseReport, f: Option<&PhaseFloor>) -> String {
    let Some(f) = f else { return String::new() };
    format!(
        "; device floor {} ({:.1} ms: per step the median of {} passes; whole pass mean {:.1} p99 {:.1} ms; {} extents at queue depth {}), PLE {}",
        f.tokens_per_s(p.tokens)
            .map_or_else(|| "n/a".into(), |r| format!("{r:.0} tokens/s")),
        f.timing.median_us / 1e3,
        f.timing.samples,
        f.timing.mean_us / 1e3,
        f.timing.p99_us / 1e3,
        f.extents,
        f.queue_depth,
        p.ratio_to_floor(f)
            .map_or_else(|| "n/a".into(), |r| format!("{r:.2}x the floor")),
    )
}

fn print_text(
    a: &Args,
    r: &Replayer,
    stream: usize,
    rep: &ReplayReport,
    floor: Option<PassFloor<'_>>,
) {
    let t = r.reader().layout();
    println!(
        "{}: {} {}, {} rows of {} B ({}); {} rows per token ({})",
        a.file.display(),
        t.name(),
        t.ty(),
        t.rows(),
        t.row_bytes(),
        human_bytes(t.bytes()),
        r.mapper().rows_per_token(),
        r.mapper().architecture()
    );
    let mut how = format!("pass {}: strategy {}", rep.pass, rep.strategy);
    if let Some((budget, policy)) = rep.cache_config {
        how += &format!(", row cache {} {}", human_bytes(budget), policy);
    }
    if rep.lookahead {
        how += ", lookahead";
    }
    if !rep.compute.is_zero() {
        how += &format!(", compute {:.1} ms/ubatch", ms(rep.compute));
    }
    match rep.evictions.len() {
        0 => {}
        1 => how += ", cold (table evicted before the prefill)",
        _ => how += ", cold (table evicted before prefill and decode)",
    }
    println!("{how}");
    println!(
        "stream {stream} tokens: prefill {} in {} ubatches of {}, decode {} ({} drawn from the stream)",
        rep.prefill.tokens, rep.prefill.steps, rep.ubatch, rep.decode.tokens, rep.drawn
    );
    let p = &rep.prefill;
    println!(
        "prefill  {}  PLE {:.1} ms, exposed {:.1} ms, wall {:.1} ms{}",
        rate(p),
        ms(p.gather),
        ms(p.exposed),
        ms(p.wall),
        floor_text(p, floor.map(|f| f.prefill))
    );
    println!("  ubatch gather  {}", latency_text(p.latency));
    let u = &rep.ubatches;
    println!(
        "  per ubatch     {:.0} rows, {:.0} distinct, {:.0} pages, {:.0} reused from earlier ubatches",
        mean(u.iter().map(|u| u.rows as f64)),
        mean(u.iter().map(|u| u.distinct_rows as f64)),
        mean(u.iter().map(|u| u.distinct_pages as f64)),
        mean(u.iter().map(|u| u.reused_rows as f64)),
    );
    println!(
        "  device reads   {}, major faults {}",
        opt_bytes(p.read_bytes),
        opt(p.process_major_faults)
    );
    let d = &rep.decode;
    println!(
        "decode   {}  PLE {:.1} ms{}",
        rate(d),
        ms(d.gather),
        floor_text(d, floor.and_then(|f| f.decode))
    );
    println!("  step gather    {}", latency_text(d.latency));
    println!(
        "  device reads   {}, major faults {}, {} of {} rows reused",
        opt_bytes(d.read_bytes),
        opt(d.process_major_faults),
        d.reused_rows,
        d.rows
    );
    for (phase, g) in [
        ("prefill", &rep.prefill.gathers),
        ("decode", &rep.decode.gathers),
    ] {
        if g.cache_hits + g.cache_misses > 0 {
            println!(
                "{phase:<8} row cache: {} hits, {} misses, {} evictions, {} read by the gathers",
                g.cache_hits,
                g.cache_misses,
                g.cache_evictions,
                human_bytes(g.read_bytes)
            );
        }
    }
    if let Some(c) = rep.cache {
        println!(
            "row cache holds {} rows ({} of {} budget, capacity {} rows), {} evictions so far",
            c.rows,
            human_bytes(c.resident_bytes),
            human_bytes(c.budget),
            c.capacity,
            c.evictions
        );
    }
    if let Some(c) = rep.lookahead_counters {
        println!(
            "lookahead: {} prefetches, {} gathered by the worker ({} rows)",
            c.prefetches, c.worker_gathers, c.worker_rows
        );
    }
    println!(
        "peak RSS {}, checksum {:016x}",
        opt_bytes(rep.peak_rss),
        rep.checksum
    );
    if let Some(f) = floor {
        println!("{}", report::sweep_text(f.sweep));
    }
}
