//! `pleio bench`: cold and warm gather latency of every strategy against the
//! device floor, with a bit-for-bit check across strategies.

use std::path::PathBuf;

use anyhow::{bail, Result};
use pleio::fetch::Strategy;
use pleio::Layout;
use pleio_lab::bench::{Arm, Bench, BenchConfig, ColdMode, Machine, Progress, Report};
use serde_json::{json, Value};

use crate::outfile::{self, write_file, Replace};
use crate::output::{human_bytes, step_progress, InFile};
use crate::report::{self, CappedRun};

/// Appends one formatted line to a `String`.
macro_rules! outln {
    ($o:expr) => {
        $o.push('\n')
    };
    ($o:expr, $($t:tt)*) => {{
        $o.push_str(&format!($($t)*));
        $o.push('\n');
    }};
}

/// Measure gather latency of every strategy, cold and warm, against the
/// device floor (`limit`: the same batches' distinct extents, contiguous
/// pages merged, read with O_DIRECT at the queue depth a short sweep of
/// 16/32/64/128/256 finds fastest; its figure is a median of at least 30 reads).
///
/// Cold arms evict the table's byte range before each batch (checked with
/// mincore); warm arms repeat the same rows with the table resident, against
/// the warm floor (`limit-warm`: the same rows' stored bytes copied from one
/// resident buffer by a plain loop, and decoded unless `--dtype raw`, one
/// thread). Every arm's output is compared bit for bit; any difference
/// fails the run (exit status 2). The table goes to stdout, progress to
/// stderr.
///
/// A safetensors checkpoint (directory, index, one file, ple-store.json)
/// is benched the same way, every file of its table evicted; its `limit`
/// arm reads every part of every row from whichever file holds it, all
/// files' requests in flight together.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (e.g. from `pleio synth`), or a safetensors checkpoint
    /// (e.g. from `pleio synth --format safetensors`).
    file: PathBuf,
    #[command(flatten)]
    layer: crate::table_args::LayerArg,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,1792,8192")]
    rows: Vec<usize>,
    /// Strategies, comma-separated (fault is always included: ratios need it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fault,advise,pread,uring,uring-direct,pool,auto,cached,shared"
    )]
    strategies: Vec<Strategy>,
    /// Row cache budget of the `cached` strategy, and of the `shared` one
    /// if this process creates it (e.g. 256M; the library's
    /// default when absent).
    #[arg(long, value_name = "SIZE", value_parser = pleio_lab::units::parse_quantity_arg)]
    budget: Option<u64>,
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
    /// What every gather writes: f32, bf16, f16, or raw (the stored bytes).
    #[arg(long, default_value = "f32")]
    dtype: pleio::Dtype,
    /// Any 2-D tensor to read instead of `per_layer_token_embd.weight`.
    #[arg(long)]
    tensor: Option<String>,
    /// Also write the results as JSON to this file (`-`: standard output,
    /// the table then goes to stderr).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Overwrite an existing JSON file (only if no other writer replaced it
    /// while this one ran).
    #[arg(long)]
    force: bool,
    /// Draw mean latency per strategy per batch size: cold arms (with the
    /// `limit` floor) to this SVG file, warm arms to `OUT-warm.svg` (both
    /// replaced if they are regular files).
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<PathBuf>,
    /// Run each strategy in its own memory cgroup capped at this size (e.g.
    /// 2G; needs root and a memory controller), the table evicted first:
    /// reports whether each stays within the cap and what it measures there.
    #[arg(long, value_name = "SIZE", value_parser = pleio_lab::units::parse_quantity_arg)]
    mem_cap: Option<u64>,
    /// The same table published in Redis (`pleio publish FILE URL`): adds
    /// the arms `redis` (every row read from the store) and `redis-shared`
    /// (the machine-wide cache in front of it, emptied before each cold
    /// batch: cold for this client), checked bit for bit against the file.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Skip the `limit` arm (capped children other than fault's).
    #[arg(long, hide = true)]
    no_limit: bool,
}

/// Checks the outputs can be written before anything is measured.
fn check_outputs(a: &Args) -> Result<()> {
    if let Some(path) = &a.json {
        outfile::check(path, Replace::IfForced(a.force))?;
    }
    if let Some(out) = &a.plot {
        outfile::check_chart(out)?;
        outfile::check_chart(&report::warm_path(out))?;
    }
    Ok(())
}

/// Prints the text report: on stdout, or on stderr when the JSON report
/// goes to stdout (`--json -`).
fn show(a: &Args, text: &str) {
    if a.json.as_deref() == Some(std::path::Path::new("-")) {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
}

pub fn run(a: Args) -> Result<()> {
    crate::table_args::files_only(&a.file, "bench")?;
    check_outputs(&a)?;
    if let Some(cap) = a.mem_cap {
        if a.redis.is_some() {
            bail!("--redis does not combine with --mem-cap (the capped children measure the file's strategies only)");
        }
        return run_capped(&a, cap);
    }
    let mut bench =
        Bench::open_with(&a.file, &a.layer.options(a.tensor.as_deref())).in_file(&a.file)?;
    if let Some(b) = a.budget {
        bench = bench.with_cache_budget(b)?;
    }
    if let Some(url) = &a.redis {
        bench = bench.with_remote(url)?;
    }
    let cfg = BenchConfig {
        rows: a.rows.clone(),
        strategies: a.strategies.clone(),
        batches: a.batches,
        cold: a.cold,
        seed: a.seed,
        limit: !a.no_limit,
        dtype: a.dtype,
    };
    let bar = step_progress(1, "bench");
    let report = bench.run(&cfg, &mut |p: Progress<'_>| {
        bar.set_length(p.total);
        bar.set_position(p.done);
        bar.set_message(p.phase.to_string());
    });
    bar.finish_and_clear();
    let report = report.in_file(&a.file)?;
    let mut text = String::new();
    print_table(&mut text, &report);
    show(&a, &text);
    finish(&a, &to_json(&report))
}

/// Writes the `--json` report and the `--plot` charts.
fn finish(a: &Args, j: &Value) -> Result<()> {
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(j)?;
        write_file(path, Replace::IfForced(a.force), |w| {
            w.write_all(text.as_bytes())?;
            w.write_all(b"\n")
        })?;
    }
    if let Some(out) = &a.plot {
        for p in report::bench_charts(j, out)? {
            println!("chart: {}", p.display());
        }
    }
    Ok(())
}

/// `--mem-cap`: each strategy measured by a child of this program in its
/// own capped cgroup (fault's child also measures `limit`).
fn run_capped(a: &Args, cap: u64) -> Result<()> {
    let version = report::probe_cap(cap)?;
    let bench =
        Bench::open_with(&a.file, &a.layer.options(a.tensor.as_deref())).in_file(&a.file)?;
    let info = bench.layout();
    drop(bench);
    let mut strategies = vec![Strategy::Fault];
    for s in &a.strategies {
        if !strategies.contains(s) {
            strategies.push(*s);
        }
    }
    let base = report::args_without(&[
        ("--mem-cap", true),
        ("--plot", true),
        ("--json", true),
        ("--force", false),
        ("--strategies", true),
        ("--no-limit", false),
    ]);
    let mut runs = Vec::new();
    let mut arms = Vec::new();
    let mut floor = Value::Null;
    for s in &strategies {
        eprintln!("{s}: measuring inside a {} memory cap", human_bytes(cap));
        // The child prints its report on stdout (a pipe to this process):
        // no file of a predictable name is involved.
        let mut args = base.clone();
        args.extend(["--strategies".into(), s.name().into()]);
        args.extend(["--json".into(), "-".into()]);
        if *s != Strategy::Fault {
            args.push("--no-limit".into());
        }
        let run = report::run_capped(cap, s.name(), &a.file, &args)?;
        if let Some(r) = &run.report {
            if !r["floor"].is_null() {
                floor = r["floor"].clone();
            }
            arms.extend(
                r["arms"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|arm| {
                        arm["strategy"] == s.name()
                            || arm["strategy"] == "limit"
                            || arm["strategy"] == "limit-warm"
                    })
                    .cloned(),
            );
        }
        runs.push(run);
    }
    // Only fault's child measured the floors (`limit` cold, `limit-warm`
    // warm): the other arms' ratios come from its figures.
    let is_floor = |x: &Value| x["strategy"] == "limit" || x["strategy"] == "limit-warm";
    let limits: Vec<(Value, Value, f64)> = arms
        .iter()
        .filter(|x| is_floor(x))
        .filter_map(|x| {
            Some((
                x["rows"].clone(),
                x["cold"].clone(),
                x["median_us"].as_f64()?,
            ))
        })
        .collect();
    for x in arms.iter_mut().filter(|x| !is_floor(x)) {
        if let (Some((_, _, l)), Some(m)) = (
            limits
                .iter()
                .find(|(n, c, _)| *n == x["rows"] && *c == x["cold"]),
            x["mean_us"].as_f64(),
        ) {
            x["ratio_to_limit"] = json!(finite(m / l));
        }
    }
    let mut j = report::envelope("bench", &Machine::detect(), &a.file, &info);
    j["cold_mode"] = json!(a.cold.name());
    j["batches"] = json!(a.batches);
    j["seed"] = json!(a.seed);
    j["dtype"] = json!(a.dtype.to_string());
    j["arms"] = json!(arms);
    j["floor"] = floor;
    j["mem_cap"] = report::mem_cap_json(cap, version, &runs);
    let mut text = String::new();
    print_capped(&mut text, &a.file, &info, cap, &runs, &arms);
    show(a, &text);
    finish(a, &j)?;
    if let Some(r) = runs.iter().find(|r| r.outcome() == "failed") {
        bail!("capped run failed: {}", r.summary());
    }
    Ok(())
}

fn print_capped(
    o: &mut String,
    file: &std::path::Path,
    t: &Layout,
    cap: u64,
    runs: &[CappedRun],
    arms: &[Value],
) {
    outln!(
        o,
        "{}: {} {} rows x {} B ({}), each strategy in a {} memory cgroup",
        file.display(),
        t.ty(),
        t.rows(),
        t.row_bytes(),
        human_bytes(t.bytes()),
        human_bytes(cap)
    );
    outln!(o);
    outln!(
        o,"| strategy | outcome | peak | cap | limit hits | rows | cold mean us | warm mean us | vs limit |");
    outln!(o, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let us = |v: &Value| v.as_f64().map_or_else(|| "-".into(), |x| format!("{x:.1}"));
    for run in runs {
        let u = &run.usage;
        let mine: Vec<&Value> = arms
            .iter()
            .filter(|x| x["strategy"] == run.label.as_str())
            .collect();
        let mut sizes: Vec<u64> = mine.iter().filter_map(|x| x["rows"].as_u64()).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let head = format!(
            "| {} | {} | {} | {} | {} |",
            run.label,
            run.outcome(),
            u.peak_bytes.map_or_else(|| "n/a".into(), human_bytes),
            human_bytes(u.limit_bytes),
            u.limit_hits
        );
        if sizes.is_empty() {
            outln!(o, "{head} - | - | - | - |");
        }
        for n in sizes {
            let find = |cold: bool| mine.iter().find(|x| x["rows"] == n && x["cold"] == cold);
            let cold = find(true);
            outln!(
                o,
                "{head} {n} | {} | {} | {} |",
                cold.map_or_else(|| "-".into(), |x| us(&x["mean_us"])),
                find(false).map_or_else(|| "-".into(), |x| us(&x["mean_us"])),
                cold.map_or_else(
                    || "-".into(),
                    |x| x["ratio_to_limit"]
                        .as_f64()
                        .map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
                ),
            );
        }
    }
    for run in runs.iter().filter(|r| r.outcome() == "failed") {
        eprintln!("{}", run.summary());
    }
}

fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

fn print_table(o: &mut String, r: &Report) {
    let t = &r.table;
    let m = &r.machine;
    outln!(
        o,
        "{}: {} {} rows x {} B ({}), cold: {}, {} batches per size, seed {}",
        r.file.display(),
        t.ty(),
        t.rows(),
        t.row_bytes(),
        human_bytes(t.bytes()),
        r.cold.name(),
        r.batches,
        r.seed
    );
    outln!(
        o,
        "machine: {}, {} CPUs, {} RAM, Linux {}, page {} B",
        m.cpu,
        m.cpus,
        human_bytes(m.mem_bytes),
        m.kernel,
        m.page_bytes
    );
    outln!(o);
    outln!(
        o,"| strategy | rows | cold | mean us | median us | p99 us | us/row | pages | read from device | major faults | requests | advice fail | cache hits/misses/evictions | peak RSS | vs fault | vs limit |");
    outln!(
        o,
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for arm in &r.arms {
        print_arm(o, arm);
    }
    let c = &r.residency;
    outln!(o);
    if let Some(sweep) = &r.floor {
        outln!(o, "{}", report::sweep_text(sweep));
        outln!(
            o,
            "limit, limit-warm: medians of their samples; vs limit: each cold arm's mean over limit's median, each warm arm's over limit-warm's"
        );
    }
    outln!(
        o,
        "residency checks: clock read {:.0} ns (auto: one per 16 warm rows), {} of one row {:.2} us, of the whole table {}",
        c.clock_ns,
        c.method,
        c.probe_row_us,
        if c.probe_table_ms.is_finite() {
            format!("{:.1} ms", c.probe_table_ms)
        } else {
            "not measured (read probes would read every uncached page)".to_owned()
        }
    );
    if r.arms.iter().any(|a| a.fallback) {
        outln!(
            o,
            "note: some arms ran on a fallback backend (io_uring or O_DIRECT unavailable)"
        );
    }
}

fn print_arm(o: &mut String, a: &Arm) {
    let name = if a.fallback {
        format!("{} (fallback)", a.strategy)
    } else {
        a.strategy.to_string()
    };
    let cache = if matches!(a.strategy, "cached" | "shared" | "redis-shared") {
        format!(
            "{:.0}/{:.0}/{:.0}",
            a.cache_hits, a.cache_misses, a.cache_evictions
        )
    } else {
        "-".into()
    };
    outln!(
        o,
        "| {name} | {} | {} | {:.1} | {:.1} | {:.1} | {:.3} | {:.0} | {} | {:.1} | {:.0} | {} | {cache} | {} | {} | {} |",
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

/// The report envelope (command `bench`) with `cold_mode`, `batches`,
/// `seed`, `residency_costs` and `arms`.
pub(crate) fn to_json(r: &Report) -> Value {
    let c = &r.residency;
    let mut j = report::envelope("bench", &r.machine, &r.file, &r.table);
    j["file"]["bytes"] = json!(r.file_bytes);
    j["cold_mode"] = json!(r.cold.name());
    j["batches"] = json!(r.batches);
    j["seed"] = json!(r.seed);
    j["dtype"] = json!(r.dtype.to_string());
    j["residency_costs"] = json!({
        "clock_ns": c.clock_ns,
        "method": c.method,
        "probe_row_us": finite(c.probe_row_us),
        "probe_table_ms": finite(c.probe_table_ms),
    });
    j["arms"] = r.arms.iter().map(arm_json).collect();
    j["floor"] = r.floor.as_ref().map_or(Value::Null, report::floor_json);
    j["redis"] = json!(r.remote);
    j
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
        "min_us": a.times_us.first().copied().and_then(finite),
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
        "cache_hits": a.cache_hits,
        "cache_misses": a.cache_misses,
        "cache_evictions": a.cache_evictions,
        "cache_bytes": a.cache_bytes,
        "ratio_to_fault": a.ratio_to_fault.and_then(finite),
        "ratio_to_limit": a.ratio_to_limit.and_then(finite),
    })
}
