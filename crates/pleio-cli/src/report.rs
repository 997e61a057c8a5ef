//! The one report schema (`pleio-report/1`) of `bench`, `replay` and `demo`
//! `--json`, the memory-capped child runs behind `--mem-cap`, and the charts
//! drawn from a report.
//!
//! Every report starts with the same envelope (`schema`, `command`,
//! `machine`, `file`, `table`); commands add `arms`, `replays` and, when
//! capped, `mem_cap`. Charts are drawn from the JSON so capped runs (whose
//! figures come from the children's reports) and plain runs share one path.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use pleio::Layout;
use pleio_lab::bench::Machine;
use pleio_lab::cgroup::{CgroupVersion, MemCap, MemUsage};
use pleio_lab::floor::{DepthSweep, PhaseFloor, Timing};
use pleio_lab::os::load_average;
use serde_json::{json, Value as Json};

use crate::output::human_bytes;
use crate::plot;

/// The schema tag every report carries.
pub const SCHEMA: &str = "pleio-report/1";

/// `{"schema", "command", "machine", "file", "table"}`: the part every
/// report shares.
pub fn envelope(command: &str, machine: &Machine, file: &Path, t: &Layout) -> Json {
    let file_bytes = std::fs::metadata(file).map(|m| m.len()).ok();
    json!({
        "schema": SCHEMA,
        "command": command,
        "run": run_json(),
        "machine": {
            "cpu": machine.cpu,
            "cpus": machine.cpus,
            "mem_bytes": machine.mem_bytes,
            "kernel": machine.kernel,
            "page_bytes": machine.page_bytes,
        },
        "file": {"path": file.display().to_string(), "bytes": file_bytes},
        "table": {
            "name": t.name(),
            "type": t.ty().to_string(),
            "rows": t.rows(),
            "row_bytes": t.row_bytes(),
            "row_elems": t.row_elems(),
            "bytes": t.bytes(),
            "offset": t.offset(),
        },
    })
}

/// When this process started and the load average then (see [`mark_start`]).
static START: OnceLock<(SystemTime, Instant, Option<[f64; 3]>)> = OnceLock::new();

/// Notes the start time and load average; `main` calls it first, so a
/// report's `run.load_start` is the load before the work began.
pub fn mark_start() {
    START.get_or_init(|| (SystemTime::now(), Instant::now(), load_average()));
}

/// `{"argv", "commit", "started_unix", "seconds", "load_start", "load_end"}`:
/// the command line, the commit the binary was built from (`-dirty` when
/// it had uncommitted changes), when it started (Unix seconds), how long it
/// had run when the report was written, and the 1/5/15-minute load
/// averages at start and at that moment.
pub fn run_json() -> Json {
    mark_start();
    let (started, t0, load_start) =
        START
            .get()
            .copied()
            .unwrap_or((SystemTime::now(), Instant::now(), None));
    json!({
        "argv": std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>(),
        // The PLEIO_* settings the run had (the segment directory, ...), so
        // its command can be repeated as it was run.
        "env": std::env::vars_os()
            .filter(|(k, _)| k.to_string_lossy().starts_with("PLEIO_"))
            .map(|(k, v)| (k.to_string_lossy().into_owned(), Json::from(v.to_string_lossy().into_owned())))
            .collect::<serde_json::Map<_, _>>(),
        "commit": env!("PLEIO_GIT_COMMIT"),
        "started_unix": started.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "seconds": t0.elapsed().as_secs_f64(),
        "load_start": load_start,
        "load_end": load_average(),
    })
}

/// `{"queue_depth", "block_bytes", "page_bytes", "sweep": {"rows", "rounds", "depths":
/// [{"queue_depth", "samples", "median_us", "mean_us", "p99_us",
/// "extents"}]}}`: the floor's queue depth and the sweep that chose it.
pub fn floor_json(s: &DepthSweep) -> Json {
    json!({
        "queue_depth": s.best,
        "block_bytes": s.grain.block,
        "page_bytes": s.grain.page,
        "sweep": {
            "rows": s.rows,
            "rounds": s.rounds,
            "depths": s.points.iter().map(|p| {
                let mut j = timing_json(&p.timing, 1.0, "us");
                j["queue_depth"] = json!(p.queue_depth);
                j["extents"] = json!(p.extents);
                j
            }).collect::<Vec<_>>(),
        },
    })
}

/// One line: the floor's queue depth and the sweep's median per depth.
pub fn sweep_text(s: &DepthSweep) -> String {
    let points: Vec<String> = s
        .points
        .iter()
        .map(|p| format!("QD{} {:.2} ms", p.queue_depth, p.timing.median_us / 1e3))
        .collect();
    format!(
        "device floor: distinct extents ({} B blocks, contiguous pages merged) read with O_DIRECT \
         at queue depth {}, the fastest median of {} batches of {} random rows: {}",
        s.grain.block,
        s.best,
        s.rounds,
        s.rows,
        points.join(", ")
    )
}

/// `{"samples", "median_<unit>", "mean_<unit>", "p99_<unit>"}` of `t`
/// (microseconds) divided by `div`.
fn timing_json(t: &Timing, div: f64, unit: &str) -> Json {
    let mut j = json!({"samples": t.samples});
    j[format!("median_{unit}")] = json!(t.median_us / div);
    j[format!("mean_{unit}")] = json!(t.mean_us / div);
    j[format!("p99_{unit}")] = json!(t.p99_us / div);
    j
}

/// A phase floor's details: `{"samples" (passes), "median_ms" (the floor),
/// "mean_ms", "p99_ms" (of whole passes), "steps", "extents", "bytes",
/// "queue_depth"}`.
pub fn phase_floor_json(f: &PhaseFloor) -> Json {
    let mut j = timing_json(&f.timing, 1e3, "ms");
    j["steps"] = json!(f.steps);
    j["extents"] = json!(f.extents);
    j["bytes"] = json!(f.bytes);
    j["queue_depth"] = json!(f.queue_depth);
    j
}

/// How a capped child ended.
pub struct CappedRun {
    /// What the child measured (a strategy name).
    pub label: String,
    /// The group's memory use over the child's life.
    pub usage: MemUsage,
    /// The child's exit status.
    pub status: ExitStatus,
    /// The child's report, when it finished and wrote one.
    pub report: Option<Json>,
    /// The child's stderr (its error message when it failed).
    pub stderr: String,
}

impl CappedRun {
    /// `finished`, `oom-killed` or `failed`.
    pub fn outcome(&self) -> &'static str {
        if self.usage.oom_kills > 0 {
            "oom-killed"
        } else if self.status.success() && self.report.is_some() {
            "finished"
        } else {
            "failed"
        }
    }

    /// The `mem_cap.runs[]` entry.
    pub fn to_json(&self) -> Json {
        let u = &self.usage;
        json!({
            "strategy": self.label,
            "outcome": self.outcome(),
            "exit_code": self.status.code(),
            "limit_bytes": u.limit_bytes,
            "peak_bytes": u.peak_bytes,
            "limit_hits": u.limit_hits,
            "oom_kills": u.oom_kills,
            "within_cap": u.within_cap(),
            "error": (self.outcome() == "failed").then(|| last_line(&self.stderr)),
        })
    }

    /// One line: outcome, peak against the cap, limit hits.
    pub fn summary(&self) -> String {
        let u = &self.usage;
        let mut s = format!(
            "{}: {}, peak {} of {} cap, {} limit hits",
            self.label,
            self.outcome(),
            u.peak_bytes.map_or_else(|| "n/a".into(), human_bytes),
            human_bytes(u.limit_bytes),
            u.limit_hits
        );
        if self.outcome() == "failed" {
            s += &format!(" ({})", last_line(&self.stderr));
        }
        s
    }
}

fn last_line(s: &str) -> String {
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}

/// `{"bytes", "cgroup", "runs": [..]}`.
pub fn mem_cap_json(cap: u64, version: CgroupVersion, runs: &[CappedRun]) -> Json {
    json!({
        "bytes": cap,
        "cgroup": match version { CgroupVersion::V1 => "v1", CgroupVersion::V2 => "v2" },
        "runs": runs.iter().map(CappedRun::to_json).collect::<Vec<_>>(),
    })
}

/// This command's arguments (after the program name) without the given
/// options: `(name, takes_value)`, in both `--name value` and `--name=value`
/// forms.
pub fn args_without(drop: &[(&str, bool)]) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        let s = arg.to_string_lossy();
        if let Some(&(_, takes_value)) = drop
            .iter()
            .find(|(name, _)| s == *name || s.starts_with(&format!("{name}=")))
        {
            if takes_value && !s.contains('=') {
                args.next();
            }
            continue;
        }
        out.push(arg);
    }
    out
}

/// Checks that a memory cap can be made here (root, a memory controller)
/// before any work starts; returns the interface in use.
pub fn probe_cap(cap: u64) -> Result<CgroupVersion> {
    let probe = MemCap::new(cap).context("--mem-cap")?;
    let version = probe.version();
    probe.remove().context("--mem-cap")?;
    Ok(version)
}

/// Runs this program again with `args` inside a fresh memory cgroup capped
/// at `cap`, after evicting `file` from the page cache (pages cached and
/// charged elsewhere would not count against the cap), and collects the
/// child's report (the JSON it prints on stdout) and the group's memory use.
pub fn run_capped(cap: u64, label: &str, file: &Path, args: &[OsString]) -> Result<CappedRun> {
    let f = File::open(file).with_context(|| file.display().to_string())?;
    let len = f.metadata()?.len();
    pleio::sys::evict(&f, 0..len)
        .with_context(|| format!("evicting {} before a capped run", file.display()))?;
    drop(f);
    let group = MemCap::new(cap).context("--mem-cap")?;
    let exe = std::env::current_exe().context("finding this program to run it capped")?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    group.confine(&mut cmd).context("--mem-cap")?;
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().context("running the capped child")?;
    let usage = group.usage().context("--mem-cap")?;
    group.remove().context("--mem-cap")?;
    let report = status
        .success()
        .then(|| serde_json::from_slice::<Json>(&stdout).ok())
        .flatten();
    Ok(CappedRun {
        label: label.to_string(),
        usage,
        status,
        report,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// `OUT.svg` -> `OUT-warm.svg`.
pub fn warm_path(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or_else(|| "chart".into(), |s| s.to_string_lossy().into_owned());
    let ext = out
        .extension()
        .map_or_else(|| "svg".into(), |s| s.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}-warm.{ext}"))
}

/// Mean latency (us) per batch size of one strategy's cold or warm arms.
fn arm_series(arms: &[Json], strategy: &str, cold: bool) -> Vec<(u64, f64)> {
    let mut pts: Vec<(u64, f64)> = arms
        .iter()
        .filter(|a| a["strategy"] == strategy && a["cold"] == cold)
        .filter_map(|a| Some((a["rows"].as_u64()?, a["mean_us"].as_f64()?)))
        .collect();
    pts.sort_by_key(|p| p.0);
    pts
}

/// The strategies of a report's arms, in order, without `limit`.
fn arm_strategies(arms: &[Json]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in arms {
        if let Some(s) = a["strategy"].as_str() {
            if s != "limit" && !out.iter().any(|o| o == s) {
                out.push(s.to_string());
            }
        }
    }
    out
}

/// Draws a bench report's cold arms to `out` (with `limit` as the reference
/// line) and, when it has warm arms, those to `OUT-warm.svg`; returns the
/// paths written.
pub fn bench_charts(report: &Json, out: &Path) -> Result<Vec<PathBuf>> {
    let empty = Vec::new();
    let arms = report["arms"].as_array().unwrap_or(&empty);
    let names = arm_strategies(arms);
    let mut written = Vec::new();
    for cold in [true, false] {
        let series: Vec<(String, Vec<(u64, f64)>)> = names
            .iter()
            .map(|s| (s.clone(), arm_series(arms, s, cold)))
            .filter(|(_, pts)| !pts.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let (path, title) = if cold {
            (out.to_path_buf(), "Cold gather latency per strategy (mean)")
        } else {
            (warm_path(out), "Warm gather latency per strategy (mean)")
        };
        let limit = arm_series(arms, "limit", true);
        let limit = (cold && !limit.is_empty()).then_some(limit.as_slice());
        plot::latency_chart(&path, title, &series, limit)?;
        written.push(path);
    }
    if written.is_empty() {
        bail!("no arms measured: nothing to plot");
    }
    Ok(written)
}

/// Draws the per-ubatch gather latency of every replay in a report.
pub fn replay_chart(report: &Json, out: &Path) -> Result<()> {
    let empty = Vec::new();
    let series: Vec<(String, Vec<f64>)> = report["replays"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|r| {
            let mut name = r["strategy"].as_str().unwrap_or("?").to_string();
            if let Some(k) = r["pass"].as_u64().filter(|&k| k > 1) {
                name += &format!(" pass {k}");
            }
            if r["cold"] == true {
                name += " (cold)";
            }
            let ms = r["ubatches"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .filter_map(|u| u["gather_ms"].as_f64())
                .collect();
            (name, ms)
        })
        .collect();
    plot::ubatch_chart(out, "Prefill gather latency per ubatch", &series)
}
