//! `pleio demo`: the problem and the fix on this machine, in one command.
//!
//! Makes (once) a qwen4exp-shaped IQ4_NL table (or, with `--format
//! safetensors`, a checkpoint directory) in the cache directory,
//! measures cold 16- and 1792-row gathers of every strategy against the
//! device floor, replays the bundled corpus through each strategy cold and
//! warm against the floor of the same replay, and ends with one table, two
//! charts and a verdict (flagged as noisy when a floor figure came out
//! slower than a strategy).

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pleio::fetch::Strategy;
use pleio::ngram::released::QWEN_ROW_ELEMS;
use pleio::quant::GgmlType;
use pleio::tokenizer::QwenTokenizer;
use pleio_lab::bench::{Arm, Bench, BenchConfig, ColdMode, Report};
use pleio_lab::floor::{Floor, PhaseSamples};
use pleio_lab::replay::{ReplayConfig, ReplayFloor, ReplayPlan, ReplayReport, Replayer};
use pleio_lab::synth::SynthSpec;
use pleio_lab::synth_ckpt::{write_checkpoint_into, CkptEncoding, CkptSpec};
use serde_json::{json, Value as Json};

use super::rows::corpus_tokens;
use super::synth::FormatArg;
use crate::outfile::{self, write_file, OutFile, Replace};
use crate::output::{byte_progress, human_bytes, step_progress};
use crate::plot;
use crate::report;

/// Show what gathering PLE rows costs on this machine, strategy by
/// strategy: cold 16- and 1792-row gathers against the device floor
/// (`limit`), then the bundled corpus replayed cold and warm (prefill
/// ubatches of 512 tokens and single-token decode steps).
///
/// The table (a qwen4exp-shaped IQ4_NL file, 4 GiB by default; with
/// `--format safetensors` a qwen4exp checkpoint directory of four files in
/// `--encoding`) is written once into the cache directory and reused; cold
/// runs evict only its byte ranges from the page cache.
#[derive(clap::Args)]
pub struct Args {
    /// Table size (suffixes k, M, G, T are powers of 1024; 1.5G works). Larger than the free
    /// page cache shows the "table larger than RAM" case.
    #[arg(long, default_value = "4G", value_parser = pleio_lab::units::parse_quantity_arg)]
    size: u64,
    /// The table's format: a GGUF file (IQ4_NL) or a safetensors
    /// checkpoint directory (four files, 128 shards, `--encoding`).
    #[arg(long, value_enum, default_value = "gguf")]
    format: FormatArg,
    /// Checkpoint row encoding (`--format safetensors`): fp8 (one BF16
    /// table scale), fp8-row, bf16, nvfp4, mlx4.
    #[arg(long, default_value = "fp8")]
    encoding: String,
    /// Where the table and charts live (default: $XDG_CACHE_HOME/pleio or
    /// ~/.cache/pleio).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the table for the next run (the default).
    #[arg(long, conflicts_with = "clean")]
    keep: bool,
    /// Delete the table when done.
    #[arg(long)]
    clean: bool,
    /// Corpus tokens to replay (prefill; the decode steps follow them).
    #[arg(long, default_value_t = 8192)]
    tokens: usize,
    /// Decode steps per replay.
    #[arg(long, default_value_t = 64)]
    decode: usize,
    /// Cold batches per gather size.
    #[arg(long, default_value_t = 10)]
    batches: usize,
    /// Strategies to compare (fault is always included).
    #[arg(long, value_delimiter = ',')]
    strategies: Option<Vec<Strategy>>,
    /// Memory budget of the `cached` strategy's row cache (its row slots,
    /// bookkeeping and read staging together).
    #[arg(long, default_value = "64M", value_parser = pleio_lab::units::parse_quantity_arg)]
    budget: u64,
    /// Also write everything as JSON to this file (the bench/replay schema;
    /// a regular file there is replaced).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The demo's table: where it is, how many rows, and how to make it.
struct DemoTable {
    path: PathBuf,
    rows: u64,
    /// `None`: the GGUF IQ4_NL file.
    encoding: Option<CkptEncoding>,
}

/// Files of a demo checkpoint.
const DEMO_FILES: usize = 4;

impl DemoTable {
    /// The table of `size` bytes in `dir` for `a`'s format and encoding.
    fn of(a: &Args, dir: &Path) -> Result<DemoTable> {
        let encoding = match a.format {
            FormatArg::Gguf => None,
            FormatArg::Safetensors => {
                Some(CkptEncoding::from_name(&a.encoding).with_context(|| {
                    format!(
                        "unknown --encoding {:?} (fp8, fp8-row, bf16, nvfp4, mlx4)",
                        a.encoding
                    )
                })?)
            }
        };
        let row_bytes = match encoding {
            Some(e) => e.row_bytes(),
            None => GgmlType::IQ4_NL
                .row_bytes(QWEN_ROW_ELEMS)
                .expect("160 is whole IQ4_NL blocks"),
        };
        let mut rows = (a.size / row_bytes).max(1024);
        if let Some(e) = encoding {
            // Whole shards: the rows the checkpoint writer will write.
            rows = CkptSpec::new(e, rows, DEMO_FILES, 0).layout()?.rows;
        }
        let path = match encoding {
            Some(e) => dir.join(format!("demo-qwen4exp-{}-{rows}", e.name())),
            None => dir.join(format!("demo-qwen4exp-IQ4_NL-{rows}.gguf")),
        };
        Ok(DemoTable {
            path,
            rows,
            encoding,
        })
    }

    /// Whether the table at `path` is there with the expected geometry.
    fn is_current(&self) -> bool {
        let want = match self.encoding {
            Some(e) => pleio::layout::RowFormat::Encoded(e.encoding()),
            None => pleio::layout::RowFormat::Ggml(GgmlType::IQ4_NL),
        };
        pleio::Table::open(&self.path).is_ok_and(|t| t.rows() == self.rows && t.ty() == want)
    }

    /// Reuses the cached table if it has the expected geometry, else
    /// writes it.
    fn ensure(&self) -> Result<()> {
        if self.is_current() {
            eprintln!("using cached table {}", self.path.display());
            return Ok(());
        }
        match self.encoding {
            None => ensure_table(&self.path, self.rows),
            Some(e) => self.write_checkpoint(e),
        }
    }

    fn write_checkpoint(&self, e: CkptEncoding) -> Result<()> {
        if self.path.exists() {
            bail!(
                "{} exists but is not a {} checkpoint of {} rows: remove it, or pass another --dir",
                self.path.display(),
                e.name(),
                self.rows
            );
        }
        let spec = CkptSpec::new(e, self.rows, DEMO_FILES, 0);
        let bytes = self.rows.saturating_mul(e.row_bytes());
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        check_free(dir, bytes)?;
        eprintln!(
            "writing the demo checkpoint {} ({}, once; later runs reuse it)",
            self.path.display(),
            human_bytes(bytes)
        );
        let bar = byte_progress(bytes, "synth");
        let out = outfile::OutDir::create(&self.path)?;
        write_checkpoint_into(&spec, out.path(), &self.path, &mut |d| bar.set_position(d))
            .with_context(|| format!("writing {}", self.path.display()))?;
        bar.finish_and_clear();
        out.commit()?;
        Ok(())
    }

    /// Deletes the table (`--clean`).
    fn remove(&self) -> Result<()> {
        let r = if self.encoding.is_some() {
            std::fs::remove_dir_all(&self.path)
        } else {
            std::fs::remove_file(&self.path)
        };
        r.with_context(|| format!("removing {}", self.path.display()))
    }
}

/// Refuses to write `bytes` into `dir` when its file system has less free.
fn check_free(dir: &Path, bytes: u64) -> Result<()> {
    if let Some(free) = pleio_lab::os::free_bytes(dir) {
        if free < bytes.saturating_add(64 << 20) {
            bail!(
                "the demo table needs {} in {} but only {} is free: pass a smaller --size or another --dir",
                human_bytes(bytes),
                dir.display(),
                human_bytes(free)
            );
        }
    }
    Ok(())
}

fn cache_dir(dir: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(d) = dir {
        return Ok(d);
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("pleio"));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".cache").join("pleio")),
        None => bail!("no cache directory: set HOME or XDG_CACHE_HOME, or pass --dir"),
    }
}

/// Writes the GGUF demo table of `rows` IQ4_NL rows at `path`.
fn ensure_table(path: &Path, rows: u64) -> Result<()> {
    let spec = SynthSpec::qwen(GgmlType::IQ4_NL, rows, 0);
    let bytes = spec.table_bytes()?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    check_free(dir, bytes)?;
    eprintln!(
        "writing the demo table {} ({}, once; later runs reuse it)",
        path.display(),
        human_bytes(bytes)
    );
    let out = OutFile::create(path, Replace::Always)?;
    let file = out.file().try_clone()?;
    let bar = byte_progress(bytes, "synth");
    let sink = spec
        .write(BufWriter::with_capacity(4 << 20, file), &mut |d| {
            bar.set_position(d)
        })
        .with_context(|| format!("writing {}", path.display()))?;
    bar.finish_and_clear();
    sink.into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", path.display()))?;
    out.commit()
}

/// Decode-phase floor passes per round (a pass is 64 steps of at most 16
/// reads: short).
const DECODE_PASSES_PER_ROUND: usize = 3;

/// Floor reads per 16-row batch list per round (1792-row lists get one).
const SMALL_BATCH_REPS: usize = 3;

/// The demo's floor figures, sampled in rounds: one before the replays and
/// one after each strategy's cold and warm replays. A shared virtual disk's latency drifts from
/// second to second (the median of 30 16-row reads taken within one second
/// moves by 30% between runs a few seconds apart), so samples spread over
/// the whole run are what makes two runs' floors agree.
struct FloorRounds {
    floor: Floor,
    prefill: PhaseSamples,
    decode: PhaseSamples,
    /// Per bench batch size, its row lists and floor reads so far.
    batches: Vec<(usize, Vec<Vec<u64>>, Vec<f64>)>,
}

impl FloorRounds {
    fn new(floor: Floor, plan: &ReplayPlan, lists: Vec<(usize, Vec<Vec<u64>>)>) -> FloorRounds {
        let ubs: Vec<&[u64]> = plan.ubatches().collect();
        let steps: Vec<&[u64]> = plan.decode_steps().collect();
        FloorRounds {
            prefill: floor.phase_samples(&ubs),
            decode: floor.phase_samples(&steps),
            floor,
            batches: lists.into_iter().map(|(n, l)| (n, l, Vec::new())).collect(),
        }
    }

    /// One round: [`DECODE_PASSES_PER_ROUND`] decode passes, floor reads of
    /// the bench's batch lists, then a prefill pass (the latency-bound reads
    /// first, before the round's own burst of 8192 tokens' reads).
    fn round(&mut self) -> Result<()> {
        for _ in 0..DECODE_PASSES_PER_ROUND {
            self.floor.pass(&mut self.decode)?;
        }
        for (n, lists, us) in &mut self.batches {
            let reps = if *n <= 16 { SMALL_BATCH_REPS } else { 1 };
            us.extend(self.floor.time_reads(lists, reps)?);
        }
        self.floor.pass(&mut self.prefill)?;
        Ok(())
    }

    /// The replay floor, after adding the batch samples to `report`'s
    /// `limit` arms.
    fn finish(self, report: &mut Report) -> ReplayFloor {
        for (n, _, us) in &self.batches {
            report.add_floor_samples(*n, us);
        }
        ReplayFloor {
            prefill: self.prefill.floor(),
            decode: self.decode.floor(),
        }
    }
}

/// One strategy's replays.
struct Replays {
    strategy: Strategy,
    cold: ReplayReport,
    warm: ReplayReport,
}

pub fn run(a: Args) -> Result<()> {
    let started = Instant::now();
    if let Some(out) = &a.json {
        if out.as_os_str() == "-" {
            bail!("--json needs a file name: the demo's summary already goes to standard output");
        }
        outfile::check(out, Replace::Always)?;
    }
    let dir = cache_dir(a.dir.clone())?;
    let latency_svg = dir.join("demo-latency.svg");
    let ubatch_svg = dir.join("demo-ubatches.svg");
    // Chart paths are checked before the work, not refused at its end.
    outfile::check_chart(&latency_svg)?;
    outfile::check_chart(&ubatch_svg)?;
    let table = DemoTable::of(&a, &dir)?;
    table.ensure()?;
    let path = table.path.clone();
    // `--clean` removes the table whatever happens after it was made.
    let result = measure(&a, &path, &latency_svg, &ubatch_svg);
    if a.clean {
        table.remove()?;
        println!("removed {}", path.display());
    } else if result.is_ok() {
        println!("table:  {} (kept; --clean removes it)", path.display());
    }
    result?;
    eprintln!("demo took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The demo's measurements, summary, charts and JSON on the table at
/// `path`.
fn measure(a: &Args, path: &Path, latency_svg: &Path, ubatch_svg: &Path) -> Result<()> {
    let path = path.to_path_buf();
    let strategies = a
        .strategies
        .clone()
        .unwrap_or_else(|| Strategy::ALL.to_vec());

    // 1. Cold gathers of one decode token (16 rows) and a 1792-row batch.
    let bench_cfg = BenchConfig {
        rows: vec![16, 1792],
        strategies: strategies.clone(),
        batches: a.batches,
        cold: ColdMode::Evict,
        seed: 1,
        limit: true,
        dtype: pleio::Dtype::F32,
    };
    let (mut report, batch_lists) = {
        let bench = Bench::open(&path, None)
            .and_then(|b| b.with_cache_budget(a.budget))
            .with_context(|| path.display().to_string())?;
        let pb = step_progress(0, "cold gathers");
        let r = bench.run(&bench_cfg, &mut |p| {
            pb.set_length(p.total);
            pb.set_position(p.done);
            pb.set_message(p.phase.to_string());
        })?;
        pb.finish_and_clear();
        let lists: Vec<(usize, Vec<Vec<u64>>)> = bench_cfg
            .rows
            .iter()
            .map(|&n| (n, bench.row_lists(&bench_cfg, n)))
            .collect();
        (r, lists)
    };

    // 2. The bundled corpus, cold and warm, through every strategy.
    let tok = QwenTokenizer::shared()?;
    let mut tokens = corpus_tokens(tok, false)?;
    tokens.truncate(a.tokens.saturating_add(a.decode));
    let mut replays = Vec::new();
    let replay_cfg = |strategy: Strategy, cold: bool| ReplayConfig {
        ubatch: 512,
        prefill: None,
        decode: a.decode,
        strategy,
        cold,
        ..ReplayConfig::default()
    };
    let open_replayer =
        || -> Result<Replayer> { Ok(Replayer::open(&path)?.with_cache(Some(a.budget), None)?) };
    // The floors (the replay's, every strategy's plan being the same, and
    // more of the 16- and 1792-row batches'), at the queue depth the
    // bench's sweep chose, sampled in rounds between the replays.
    let mut floors = match &report.floor {
        Some(sweep) => {
            let replayer = open_replayer()?;
            let floor = Floor::open(replayer.reader(), pleio::sys::page_size(), sweep.best)
                .context("the device floor")?;
            let plan = replayer.plan(&tokens, &replay_cfg(Strategy::Fault, true))?;
            eprintln!("measuring the device floor (in rounds between the replays)");
            let mut f = FloorRounds::new(floor, &plan, batch_lists);
            f.round()?;
            Some(f)
        }
        None => None,
    };
    let pb = step_progress(
        2 * report_strategies(&report).len() as u64,
        "corpus replays",
    );
    for st in report_strategies(&report) {
        let replayer = open_replayer()?;
        let run = |cold: bool| -> Result<ReplayReport> {
            pb.set_message(format!("{} {}", if cold { "cold" } else { "warm" }, st));
            let cfg = replay_cfg(st, cold);
            let plan = replayer.plan(&tokens, &cfg)?;
            let r = replayer.run(&plan, &cfg)?;
            pb.inc(1);
            Ok(r)
        };
        let cold = run(true)?;
        if let Some(f) = &mut floors {
            f.round()?;
        }
        // The cold run evicted the prefill's pages again before its decode
        // steps; one unmeasured pass brings the whole stream in, so the
        // measured warm pass finds it resident.
        run(false)?;
        let warm = run(false)?;
        if cold.checksum != warm.checksum {
            bail!("{st}: cold and warm replays gathered different floats");
        }
        replays.push(Replays {
            strategy: st,
            cold,
            warm,
        });
        if let Some(f) = &mut floors {
            f.round()?;
        }
    }
    pb.finish_and_clear();
    let replay_floor = floors.map(|f| f.finish(&mut report));
    if let Some(first) = replays.first() {
        if let Some(r) = replays
            .iter()
            .find(|r| r.cold.checksum != first.cold.checksum)
        {
            bail!(
                "{} and {} gathered different floats for the same stream",
                first.strategy,
                r.strategy
            );
        }
    }

    print_summary(&path, &report, &replays, replay_floor.as_ref(), a.budget);
    charts(&report, &replays, latency_svg, ubatch_svg)?;
    println!(
        "\ncharts: {}\n        {}",
        latency_svg.display(),
        ubatch_svg.display()
    );
    if let Some(out) = &a.json {
        let j = to_json(&path, &report, &replays, replay_floor.as_ref(), a.budget);
        write_file(out, Replace::Always, |w| {
            serde_json::to_writer_pretty(&mut *w, &j)?;
            writeln!(w)
        })?;
        println!("json:   {}", out.display());
    }
    Ok(())
}

/// The strategies the bench measured, in its order (fault first).
fn report_strategies(r: &Report) -> Vec<Strategy> {
    let mut out: Vec<Strategy> = Vec::new();
    for arm in &r.arms {
        if let Ok(s) = arm.strategy.parse::<Strategy>() {
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

fn arm<'a>(r: &'a Report, strategy: &str, rows: usize, cold: bool) -> Option<&'a Arm> {
    r.arms
        .iter()
        .find(|a| a.strategy == strategy && a.rows == rows && a.cold == cold)
}

fn ms(us: Option<f64>) -> String {
    us.map_or("-".into(), |u| format!("{:.2}", u / 1e3))
}

fn tps(r: &ReplayReport, prefill: bool) -> Option<f64> {
    if prefill {
        r.prefill.tokens_per_s()
    } else {
        r.decode.tokens_per_s()
    }
}

fn rate(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.0}"))
}

/// A cold replay phase's gather time over the floor's.
fn floor_ratio(r: &ReplayReport, f: Option<&ReplayFloor>, prefill: bool) -> Option<f64> {
    let f = f?;
    if prefill {
        r.prefill.ratio_to_floor(&f.prefill)
    } else {
        r.decode.ratio_to_floor(&f.decode)
    }
}

/// Floor tokens/s of a phase.
fn floor_tps(r: &ReplayReport, f: Option<&ReplayFloor>, prefill: bool) -> Option<f64> {
    let f = f?;
    if prefill {
        f.prefill.tokens_per_s(r.prefill.tokens)
    } else {
        f.decode.tokens_per_s(r.decode.tokens)
    }
}

fn print_summary(
    path: &Path,
    report: &Report,
    replays: &[Replays],
    floor: Option<&ReplayFloor>,
    budget: u64,
) {
    let t = &report.table;
    println!(
        "pleio demo: {} ({} rows of {} bytes, {} {}), page cache evicted before every cold run",
        path.display(),
        t.rows(),
        t.row_bytes(),
        human_bytes(t.bytes()),
        t.ty()
    );
    println!(
        "machine: {}, {} cpus, {} RAM, kernel {}\n",
        report.machine.cpu,
        report.machine.cpus,
        human_bytes(report.machine.mem_bytes),
        report.machine.kernel
    );
    let row = |cells: [&str; 10]| {
        println!(
            "{:<13} {:>13} {:>8} {:>13} {:>12} {:>12} {:>12} {:>12} {:>11} {:>10}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8],
            cells[9]
        )
    };
    row([
        "strategy",
        "prefill tok/s",
        "vs",
        "prefill tok/s",
        "decode tok/s",
        "cold 16 rows",
        "cold 1792",
        "warm 16 rows",
        "bytes read",
        "peak RSS",
    ]);
    row([
        "", "cold", "floor", "warm", "cold", "ms", "rows ms", "us", "cold run", "",
    ]);
    for r in replays {
        let name = r.strategy.name();
        let label = if r.strategy == Strategy::Cached {
            format!(
                "cached {}",
                human_bytes(budget).replace(".00", "").replace(' ', "")
            )
        } else {
            name.to_string()
        };
        let read = r.cold.prefill.read_bytes.zip(r.cold.decode.read_bytes);
        row([
            &label,
            &rate(tps(&r.cold, true)),
            &times(floor_ratio(&r.cold, floor, true)),
            &rate(tps(&r.warm, true)),
            &rate(tps(&r.cold, false)),
            &ms(arm(report, name, 16, true).map(|a| a.mean_us)),
            &ms(arm(report, name, 1792, true).map(|a| a.mean_us)),
            &arm(report, name, 16, false).map_or("-".into(), |a| format!("{:.1}", a.mean_us)),
            &read.map_or("-".into(), |(p, d)| human_bytes(p + d)),
            &r.cold
                .peak_rss
                .max(r.warm.peak_rss)
                .map_or("-".into(), human_bytes),
        ]);
    }
    let first = replays.first().map(|r| &r.cold);
    row([
        "limit",
        &rate(first.and_then(|r| floor_tps(r, floor, true))),
        "",
        "",
        &rate(first.and_then(|r| floor_tps(r, floor, false))),
        &ms(arm(report, "limit", 16, true).map(|a| a.median_us)),
        &ms(arm(report, "limit", 1792, true).map(|a| a.median_us)),
        "",
        "",
        "",
    ]);
    if let Some(sweep) = &report.floor {
        let n = |rows| arm(report, "limit", rows, true).map_or(0, |a| a.samples);
        let passes = |f: fn(&ReplayFloor) -> usize| floor.map_or(0, f);
        println!(
            "limit: the device floor, medians: the same rows' distinct extents read cold with O_DIRECT at queue depth {}, \
             sampled over the whole run ({} and {} reads of the 16- and 1792-row batches, {} prefill and {} decode passes)",
            sweep.best,
            n(16),
            n(1792),
            passes(|f| f.prefill.timing.samples),
            passes(|f| f.decode.timing.samples),
        );
    }
    if let Some(v) = verdict(replays, report, floor) {
        println!("\n{v}");
    }
    let noise = noisy(report, replays, floor);
    if !noise.is_empty() {
        println!(
            "\nnote: noisy run (the floor should be the fastest figure): {}; rerun on an idle machine",
            noise.join("; ")
        );
    }
}

fn times(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}x"))
}

/// Where a floor figure came out slower than a strategy's: signs of a
/// noisy machine (the floor reads the same bytes the least costly way).
/// A strategy within 5% of the floor ties with it: `uring-direct` and
/// `cached` read a cold batch's rows with the floor's very requests, so a
/// run where they come out a hair faster is not noisy.
const TIE: f64 = 0.95;

fn noisy(report: &Report, replays: &[Replays], floor: Option<&ReplayFloor>) -> Vec<String> {
    let mut out = Vec::new();
    let mut sizes: Vec<usize> = report.arms.iter().map(|a| a.rows).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for n in sizes {
        let Some(limit) = arm(report, "limit", n, true) else {
            continue;
        };
        let fastest = report_strategies(report)
            .into_iter()
            .filter_map(|s| arm(report, s.name(), n, true))
            .min_by(|a, b| a.mean_us.total_cmp(&b.mean_us));
        if let Some(f) = fastest.filter(|f| f.mean_us < TIE * limit.median_us) {
            out.push(format!(
                "the {n}-row floor ({} ms) is more than 5% slower than `{}` ({} ms)",
                ms(Some(limit.median_us)),
                f.strategy,
                ms(Some(f.mean_us))
            ));
        }
    }
    for (prefill, phase) in [(true, "prefill"), (false, "decode")] {
        let best = replays
            .iter()
            .filter_map(|r| tps(&r.cold, prefill).map(|t| (r, t)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((r, t)) = best {
            if let Some(f) = floor_tps(&r.cold, floor, prefill).filter(|&f| f < TIE * t) {
                out.push(format!(
                    "the cold {phase} floor ({f:.0} tokens/s) is more than 5% slower than `{}` ({t:.0} tokens/s)",
                    r.strategy
                ));
            }
        }
    }
    out
}

/// One sentence: the best strategy on cold prefill, its gain over faults
/// and its distance from the floor.
fn verdict(replays: &[Replays], report: &Report, floor: Option<&ReplayFloor>) -> Option<String> {
    let fault = replays.iter().find(|r| r.strategy == Strategy::Fault)?;
    let fault_tps = tps(&fault.cold, true)?;
    let best = replays
        .iter()
        .filter_map(|r| tps(&r.cold, true).map(|t| (r, t)))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let name = best.0.strategy.name();
    let gather = match (
        arm(report, name, 1792, true),
        arm(report, "fault", 1792, true),
    ) {
        (Some(b), Some(f)) if b.mean_us > 0.0 => {
            format!(
                " and gathers 1792 cold rows {:.1}x faster ({} vs {} ms)",
                f.mean_us / b.mean_us,
                ms(Some(b.mean_us)),
                ms(Some(f.mean_us))
            )
        }
        _ => String::new(),
    };
    let to_floor = floor_ratio(&best.0.cold, floor, true).map_or(String::new(), |r| {
        format!(" Its cold prefill takes {r:.2}x the device floor's time.")
    });
    Some(format!(
        "best: `{name}` prefills the cold corpus at {:.0} tokens/s, {:.1}x plain mmap faults ({:.0} tokens/s){gather}.{to_floor}",
        best.1,
        best.1 / fault_tps,
        fault_tps
    ))
}

fn charts(report: &Report, replays: &[Replays], latency: &Path, ubatch: &Path) -> Result<()> {
    let sizes: Vec<usize> = {
        let mut s: Vec<usize> = report.arms.iter().map(|a| a.rows).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let series_of = |name: &str| -> Vec<(u64, f64)> {
        sizes
            .iter()
            .filter_map(|&n| arm(report, name, n, true).map(|a| (n as u64, a.mean_us)))
            .collect()
    };
    let series: Vec<(String, Vec<(u64, f64)>)> = report_strategies(report)
        .iter()
        .map(|s| (s.name().to_string(), series_of(s.name())))
        .collect();
    let limit = series_of("limit");
    plot::latency_chart(
        latency,
        "Cold gather latency per strategy (mean of the batches)",
        &series,
        (!limit.is_empty()).then_some(limit.as_slice()),
    )?;
    let per_ubatch: Vec<(String, Vec<f64>)> = replays
        .iter()
        .map(|r| {
            let v = r
                .cold
                .ubatches
                .iter()
                .map(|u| u.gather.as_secs_f64() * 1e3)
                .collect();
            (r.strategy.name().to_string(), v)
        })
        .collect();
    plot::ubatch_chart(
        ubatch,
        "Cold corpus prefill: gather latency per 512-token ubatch",
        &per_ubatch,
    )
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn to_json(
    path: &Path,
    report: &Report,
    replays: &[Replays],
    floor: Option<&ReplayFloor>,
    budget: u64,
) -> Json {
    let mut j = super::bench::to_json(report);
    j["command"] = json!("demo");
    j["file"]["path"] = json!(path.display().to_string());
    let first = replays.first().map(|r| &r.cold);
    j["replay_floor"] = match floor {
        Some(f) => json!({
            "prefill": report::phase_floor_json(&f.prefill),
            "decode": report::phase_floor_json(&f.decode),
            "prefill_tokens_per_s": first.and_then(|r| floor_tps(r, Some(f), true)),
            "decode_tokens_per_s": first.and_then(|r| floor_tps(r, Some(f), false)),
        }),
        None => Json::Null,
    };
    j["noisy"] = json!(noisy(report, replays, floor));
    j["replays"] = replays
        .iter()
        .flat_map(|r| {
            [(&r.cold, true), (&r.warm, false)].map(|(rep, cold)| {
                let f = floor.filter(|_| cold);
                json!({
                    "strategy": r.strategy.name(),
                    "cache_budget_bytes": (r.strategy == Strategy::Cached).then_some(budget),
                    "cold": cold,
                    "prefill_tokens": rep.prefill.tokens,
                    "prefill_tokens_per_s": tps(rep, true),
                    "prefill_gather_s": secs(rep.prefill.gather),
                    "prefill_ratio_to_floor": floor_ratio(rep, f, true),
                    "decode_steps": rep.decode.steps,
                    "decode_tokens_per_s": tps(rep, false),
                    "decode_ratio_to_floor": floor_ratio(rep, f, false),
                    "read_bytes": rep.prefill.read_bytes.zip(rep.decode.read_bytes).map(|(a, b)| a + b),
                    "peak_rss_bytes": rep.peak_rss,
                    "checksum": format!("{:016x}", rep.checksum),
                })
            })
        })
        .collect();
    j
}
