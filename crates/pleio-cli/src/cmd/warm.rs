//! `pleio warm`: read the rows a profile says are hot before they are
//! needed, and say how much of a held-out text they cover.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use pleio::fetch::{rank_by_frequency, Strategy};
use pleio::ngram::{ModelRows, RowMapper};
use pleio::CachePolicy;
use serde_json::json;

use super::rows::{encode, tokenizer_for};
use crate::lists::{read_bounded_text, read_row_list, MAX_ROW_IDS};
use crate::output::{human_bytes, step_progress, InFile};

/// Prewarm a table from a profile: the row ids of the profile's texts
/// (each file its own sequence) ranked by how often they occur, hottest
/// first, read at the device's full queue depth until `--budget` is used.
///
/// For `--strategy cached` the rows fill a row cache of `--budget` bytes.
/// That cache lives in this process only, so here it measures what a
/// prewarm costs and covers; an engine calls `Table::prewarm` at startup
/// on the handle it serves from. For `--strategy shared` the rows fill the
/// machine-wide row cache (created with `--budget` bytes if there is none),
/// which is kept when this process exits, for the engine processes to
/// attach to. For every other strategy (default `auto`)
/// the rows' pages are read into the page cache, where later processes
/// find them. `--held-out-text` / `--held-out-rows` report the share of
/// another stream's row ids the warm set covers.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (or any shard of a split set) with a PLE table, or a
    /// safetensors checkpoint: its directory, index, one file, or a
    /// ple-store.json.
    file: PathBuf,
    #[command(flatten)]
    layer: crate::table_args::LayerArg,
    /// Memory to fill: the row cache's budget (`cached`) or bytes of page
    /// cache (e.g. 256M).
    #[arg(long, value_name = "SIZE", value_parser = pleio_lab::units::parse_quantity_arg)]
    budget: u64,
    /// Profile texts, tokenized with the model's tokenizer (qwen4exp).
    #[arg(
        long = "from-text",
        value_name = "FILE",
        required_unless_present = "from_rows"
    )]
    from_text: Vec<PathBuf>,
    /// A profile of row ids (whitespace/comma separated or a JSON array;
    /// repeats count as frequency).
    #[arg(long = "from-rows", value_name = "FILE", conflicts_with = "from_text")]
    from_rows: Option<PathBuf>,
    /// Where the rows go: `cached` (this process's row cache) or any other
    /// strategy (the page cache).
    #[arg(long, default_value = "auto")]
    strategy: Strategy,
    /// Eviction policy of the row cache.
    #[arg(long, value_name = "POLICY")]
    cache_policy: Option<CachePolicy>,
    /// Held-out texts whose rows' coverage by the warm set is reported.
    #[arg(long = "held-out-text", value_name = "FILE")]
    held_out_text: Vec<PathBuf>,
    /// Held-out row ids whose coverage is reported.
    #[arg(long = "held-out-rows", value_name = "FILE")]
    held_out_rows: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// The row ids of `texts`, each mapped as its own sequence.
fn text_rows(rows: &ModelRows, texts: &[PathBuf]) -> Result<Vec<u64>> {
    let tok = tokenizer_for(rows)?;
    let mut out = Vec::new();
    for p in texts {
        let text = read_bounded_text(p, "--from-text/--held-out-text")?;
        let tokens = encode(tok, &text, false).with_context(|| p.display().to_string())?;
        rows.sequence()
            .map_tokens(&tokens, &mut out)
            .with_context(|| p.display().to_string())?;
    }
    Ok(out)
}

fn row_file(p: &PathBuf) -> Result<Vec<u64>> {
    let f = std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?;
    read_row_list(f, &p.display().to_string(), MAX_ROW_IDS)
}

pub fn run(a: Args) -> Result<()> {
    crate::table_args::files_only(&a.file, "warm")?;
    let mut table = a
        .layer
        .open(&a.file, None)
        .in_file(&a.file)?
        .with_strategy(a.strategy);
    if a.strategy == Strategy::Cached {
        table = table.with_budget(a.budget)?;
        if let Some(p) = a.cache_policy {
            table = table.with_cache_policy(p);
        }
    }
    if a.strategy == Strategy::Shared {
        // The machine-wide cache, created with this budget if new, and
        // kept after this process exits: later processes find the rows.
        table = table.with_budget(a.budget)?;
        table.keep_shared_cache();
    }
    let mapper = || table.row_ids();
    let profile = match &a.from_rows {
        Some(p) => row_file(p)?,
        None => text_rows(&mapper()?, &a.from_text)?,
    };
    if profile.is_empty() {
        bail!("the profile has no rows");
    }
    let held_out = match &a.held_out_rows {
        Some(p) => {
            let ids = row_file(p)?;
            // An id past the table would count as "not covered" and skew
            // the share without a word: refuse it, naming it.
            let rows = table.rows();
            if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id >= rows) {
                bail!(
                    "{}: row id {id} (entry {}) is out of range: the table has {rows} rows",
                    p.display(),
                    i + 1
                );
            }
            ids
        }
        None if !a.held_out_text.is_empty() => text_rows(&mapper()?, &a.held_out_text)?,
        None => Vec::new(),
    };
    let ranked = rank_by_frequency(&profile);
    let bar = step_progress(0, "warm");
    let rep = table.prewarm(&ranked, a.budget, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let rep = rep?;
    let set: HashSet<u64> = rep.set.iter().copied().collect();
    let covered = held_out.iter().filter(|r| set.contains(r)).count();
    let mut held_distinct = held_out.clone();
    held_distinct.sort_unstable();
    held_distinct.dedup();
    let covered_distinct = held_distinct.iter().filter(|r| set.contains(r)).count();
    let profile_covered = profile.iter().filter(|r| set.contains(r)).count();
    let share = |n: usize, d: usize| (d > 0).then(|| n as f64 / d as f64);
    let secs = rep.elapsed.as_secs_f64();
    if a.json {
        let j = json!({
            "run": crate::report::run_json(),
            "file": a.file.display().to_string(),
            "strategy": a.strategy.name(),
            "target": rep.target,
            "budget_bytes": a.budget,
            "profile_rows": profile.len(),
            "profile_distinct_rows": ranked.len(),
            "warm_rows": rep.rows,
            "rows_read": rep.rows_read,
            "pages": rep.pages,
            "read_requests": rep.read_requests,
            "read_bytes": rep.read_bytes,
            "seconds": secs,
            "profile_coverage": share(profile_covered, profile.len()),
            "held_out_rows": held_out.len(),
            "held_out_coverage": share(covered, held_out.len()),
            "held_out_distinct_coverage": share(covered_distinct, held_distinct.len()),
            "cache": table.cache_counters().map(|c| json!({
                "rows": c.rows, "resident_bytes": c.resident_bytes, "capacity_rows": c.capacity,
            })),
        });
        println!("{j}");
        return Ok(());
    }
    println!(
        "{}: profile of {} row ids ({} distinct); warmed the hottest {} into the {} ({} budget)",
        a.file.display(),
        profile.len(),
        ranked.len(),
        rep.rows,
        rep.target,
        human_bytes(a.budget)
    );
    println!(
        "  read {} rows: {} in {} requests, {:.2} s ({:.0} rows/s){}",
        rep.rows_read,
        human_bytes(rep.read_bytes),
        rep.read_requests,
        secs,
        rep.rows_read as f64 / secs.max(1e-9),
        rep.pages
            .map_or_else(String::new, |p| format!(", {p} pages"))
    );
    println!(
        "  the warm set covers {:.1}% of the profile's row ids",
        100.0 * share(profile_covered, profile.len()).unwrap_or(0.0)
    );
    if !held_out.is_empty() {
        println!(
            "  held-out: {:.1}% of its {} row ids ({:.1}% of its {} distinct rows) are in the warm set",
            100.0 * share(covered, held_out.len()).unwrap_or(0.0),
            held_out.len(),
            100.0 * share(covered_distinct, held_distinct.len()).unwrap_or(0.0),
            held_distinct.len()
        );
    }
    if let Some(c) = table.cache_counters() {
        println!(
            "  row cache: {} rows, {} of {} (it lives in this process: an engine prewarms the handle it serves from)",
            c.rows,
            human_bytes(c.resident_bytes),
            human_bytes(c.budget)
        );
    }
    Ok(())
}
