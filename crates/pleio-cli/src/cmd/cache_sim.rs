//! `pleio cache-sim`: hit rates of the row cache's eviction policies on a
//! token stream's row ids, by simulation (no I/O).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use pleio::layout::Layout;
use pleio::model::Model;
use pleio::CachePolicy;
use pleio_lab::cache_sim::{read_alignment, simulate, SimResult};
use pleio_lab::replay::{ReplayConfig, Replayer};
use serde_json::json;

use super::rows::Input;
use crate::output::{human_bytes, InFile};

/// Compare the row cache's eviction policies on a token stream: the
/// stream is mapped to row ids and cut into prefill ubatches and decode
/// steps as `pleio replay` does, then run through the cache's own
/// bookkeeping at each budget (same sizing, shards and order of work as the
/// `cached` strategy, no reads), reporting the hit rate over each gather's
/// distinct rows.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (or any shard of a split set) with a PLE table.
    file: PathBuf,
    #[command(flatten)]
    input: Input,
    /// Tokens per prefill ubatch.
    #[arg(long, default_value_t = 512)]
    ubatch: usize,
    /// Decode steps of one token each (the stream's last tokens).
    #[arg(long, default_value_t = 64)]
    decode: usize,
    /// Cache budgets, comma-separated (e.g. 64M,256M,1G).
    #[arg(long, value_delimiter = ',', default_value = "64M,256M,1G",
          value_parser = pleio_lab::units::parse_quantity_arg)]
    budgets: Vec<u64>,
    /// Policies, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "lru,clock,sieve,s3-fifo")]
    policies: Vec<CachePolicy>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    crate::table_args::files_only(&a.file, "cache-sim")?;
    let model = Arc::new(Model::open(&a.file)?);
    let table = Layout::of_ple(&model).in_file(&a.file)?;
    let replayer = Replayer::new(model, table).in_file(&a.file)?;
    let tokens = a.input.load(replayer.mapper())?;
    let cfg = ReplayConfig {
        ubatch: a.ubatch,
        decode: a.decode,
        ..ReplayConfig::default()
    };
    let plan = replayer.plan(&tokens, &cfg).in_file(&a.file)?;
    let gathers: Vec<&[u64]> = plan.ubatches().chain(plan.decode_steps()).collect();
    let mut distinct = plan.rows.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let t = replayer.reader().layout();
    let align = read_alignment(replayer.reader());
    let mut results: Vec<SimResult> = Vec::new();
    for &budget in &a.budgets {
        for &p in &a.policies {
            let r = simulate(gathers.iter().copied(), budget, t, align, p)
                .with_context(|| format!("budget {}", human_bytes(budget)))?;
            results.push(r);
        }
    }
    if a.json {
        let j = json!({
            "run": crate::report::run_json(),
            "tokens": tokens.len(),
            "gathers": gathers.len(),
            "row_ids": plan.rows.len(),
            "distinct_rows": distinct.len(),
            "row_bytes": t.row_bytes(),
            "align": align,
            "results": results.iter().map(|r| json!({
                "policy": r.policy.name(),
                "budget_bytes": r.budget,
                "capacity_rows": r.capacity,
                "lookups": r.lookups,
                "hits": r.hits,
                "misses": r.misses(),
                "evictions": r.evictions,
                "hit_rate": r.hit_rate(),
            })).collect::<Vec<_>>(),
        });
        println!("{j}");
        return Ok(());
    }
    println!(
        "{}: {} tokens, {} gathers ({} ubatches of {}, {} decode steps), {} row ids, {} distinct ({} B rows, {})",
        a.file.display(),
        tokens.len(),
        gathers.len(),
        plan.ubatches().count(),
        a.ubatch,
        plan.decode_steps().count(),
        plan.rows.len(),
        distinct.len(),
        t.row_bytes(),
        human_bytes(distinct.len() as u64 * t.row_bytes()),
    );
    println!();
    println!("| budget | policy | capacity rows | hit rate | misses | evictions |");
    println!("|---:|---|---:|---:|---:|---:|");
    for r in &results {
        println!(
            "| {} | {} | {} | {:.2}% | {} | {} |",
            human_bytes(r.budget),
            r.policy,
            r.capacity,
            100.0 * r.hit_rate(),
            r.misses(),
            r.evictions
        );
    }
    Ok(())
}
