//! `pleio cache`: the machine-wide row caches (strategy `shared`) on this
//! machine: list them, show their counters, remove them.

use std::path::PathBuf;

use anyhow::{Context, Result};
use pleio::cache::segment::{self, Segment, SegmentError, SegmentInfo};
use serde_json::json;

use crate::output::human_bytes;

/// Inspect or remove the machine-wide row caches of strategy `shared`
/// (segments in `/dev/shm`, or `PLEIO_SHM_DIR`).
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// List the segments: table, size, rows held, attached processes.
    Ls(Pick),
    /// Show each segment's counters: hits, misses, device reads and bytes,
    /// evictions, waits, attached processes.
    Stats(Pick),
    /// Remove segments (all when none is named): attached processes move to
    /// a new one at their next gather. A segment of another pleio build's
    /// layout is unlinked.
    Rm {
        /// Segment files or names (`pleio-...`); all when omitted.
        segments: Vec<PathBuf>,
    },
}

#[derive(clap::Args)]
struct Pick {
    /// Segment files or names (`pleio-...`); all when omitted.
    segments: Vec<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    match a.command {
        Sub::Ls(p) => show(&p, false),
        Sub::Stats(p) => show(&p, true),
        Sub::Rm { segments } => {
            for path in pick(&segments)? {
                let note = match Segment::inspect(&path) {
                    Ok(s) => {
                        s.remove()
                            .with_context(|| format!("removing {}", path.display()))?;
                        String::new()
                    }
                    // Another build's layout: no process of this build
                    // can use it, so it is only unlinked (its own
                    // processes keep their mapping until they exit).
                    Err(SegmentError::Version { found, .. }) => {
                        std::fs::remove_file(&path)
                            .with_context(|| format!("removing {}", path.display()))?;
                        format!(" (layout version {found})")
                    }
                    Err(e) => return Err(e.into()),
                };
                println!("removed {}{note}", path.display());
            }
            Ok(())
        }
    }
}

/// The named segments (a bare name is looked for in the segment
/// directory), or every segment there.
fn pick(named: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let dir = segment::shm_dir();
    if named.is_empty() {
        return segment::list(&dir).with_context(|| format!("listing {}", dir.display()));
    }
    Ok(named
        .iter()
        .map(|p| {
            if p.components().count() == 1 {
                dir.join(p)
            } else {
                p.clone()
            }
        })
        .collect())
}

fn show(p: &Pick, stats: bool) -> Result<()> {
    let mut infos = Vec::new();
    let mut bad = Vec::new();
    for path in pick(&p.segments)? {
        match Segment::inspect(&path) {
            Ok(s) => infos.push(s.info()),
            Err(e) if p.segments.is_empty() => bad.push((path, e.to_string())),
            Err(e) => return Err(e.into()),
        }
    }
    let dir = segment::shm_dir();
    if p.json {
        let j = json!({
            "run": crate::report::run_json(),
            "dir": dir,
            "dir_tmpfs_huge": tmpfs_huge(&dir),
            "segments": infos.iter().map(to_json).collect::<Vec<_>>(),
            "unreadable": bad.iter().map(|(p, e)| json!({"path": p, "error": e})).collect::<Vec<_>>(),
        });
        println!("{j}");
        return Ok(());
    }
    if infos.is_empty() && bad.is_empty() {
        println!("no shared row caches in {}", dir.display());
    }
    match tmpfs_huge(&dir).as_deref() {
        Some("always" | "within_size") => {}
        Some(h) => println!(
            "{}: tmpfs with huge={h}: segments use 4 KiB pages (with huge=within_size, hits \
             are faster: docs/cache.md, \"Layout and huge pages\")",
            dir.display()
        ),
        None => println!("{}: not a tmpfs", dir.display()),
    }
    for i in &infos {
        print_one(i, stats);
    }
    for (path, e) in &bad {
        println!("{}: cannot read: {e}", path.display());
    }
    Ok(())
}

fn print_one(i: &SegmentInfo, stats: bool) {
    println!("{}", i.path.display());
    println!("  table      {}", i.label);
    println!(
        "  size       {} of a {} budget: {} slots of {} B rows, {} held ({})",
        human_bytes(i.bytes),
        human_bytes(i.budget),
        i.slots,
        i.row_bytes,
        i.resident,
        human_bytes(i.resident * i.row_bytes)
    );
    println!("  attached   {}", pids(&i.attached));
    if stats {
        let s = &i.stats;
        let lookups = s.hits + s.misses + s.uncached;
        println!(
            "  rows       {} hits, {} misses, {} read uncached ({:.1}% hits)",
            s.hits,
            s.misses,
            s.uncached,
            if lookups == 0 {
                0.0
            } else {
                100.0 * s.hits as f64 / lookups as f64
            }
        );
        println!(
            "  device     {} reads, {}",
            s.reads,
            human_bytes(s.bytes_read)
        );
        println!(
            "  slots      {} evictions, {} waits for another process, {} taken back from dead ones",
            s.evictions, s.waits, s.reclaims
        );
    }
}

/// The `huge=` option of the tmpfs holding `dir` (`never` when not given),
/// or `None` when `dir` is not on a tmpfs (or the OS does not tell).
fn tmpfs_huge(dir: &std::path::Path) -> Option<String> {
    let m = pleio_lab::os::mount_of(dir).filter(|m| m.fstype == "tmpfs")?;
    Some(m.option("huge").unwrap_or("never").to_owned())
}

fn pids(p: &[u32]) -> String {
    if p.is_empty() {
        return "none".into();
    }
    let v: Vec<String> = p.iter().map(u32::to_string).collect();
    format!("{} (pids {})", p.len(), v.join(", "))
}

fn to_json(i: &SegmentInfo) -> serde_json::Value {
    let s = &i.stats;
    json!({
        "path": i.path,
        "table": i.label,
        "bytes": i.bytes,
        "budget_bytes": i.budget,
        "slots": i.slots,
        "resident_rows": i.resident,
        "row_bytes": i.row_bytes,
        "rows": i.rows,
        "attached_pids": i.attached,
        "hits": s.hits,
        "misses": s.misses,
        "uncached": s.uncached,
        "reads": s.reads,
        "bytes_read": s.bytes_read,
        "evictions": s.evictions,
        "waits": s.waits,
        "reclaims": s.reclaims,
    })
}
