//! `pleio gather`: decode rows of a table to little-endian f32.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::ValueEnum;
use pleio::fetch::{GatherStats, Strategy, Table};
use pleio::model::Model;
use pleio::CachePolicy;
use serde_json::json;

use crate::output::write_atomic;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Raw little-endian f32, rows back to back.
    Raw,
    /// NumPy `.npy`, shape `(rows, row_elems)`, dtype `<f4`.
    Npy,
}

/// Gather rows of a table (the PLE table by default) and write them as
/// little-endian f32 in request order, duplicates repeated.
///
/// A row out of range is an error naming the row and the limit (exit status
/// 2), and no output file is left behind.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file, or any shard of a split set.
    file: PathBuf,
    /// Row ids, comma-separated (e.g. 1,5,9).
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with = "rows_file",
        required_unless_present = "rows_file"
    )]
    rows: Vec<u64>,
    /// File of row ids separated by whitespace or commas (or a JSON array).
    #[arg(long)]
    rows_file: Option<PathBuf>,
    /// Any 2-D tensor to read instead of `per_layer_token_embd.weight`.
    #[arg(long)]
    tensor: Option<String>,
    /// How row bytes are brought in.
    #[arg(long, default_value = "auto")]
    strategy: Strategy,
    /// Row cache budget of the `cached` strategy (e.g. 256M).
    #[arg(long, value_name = "SIZE", value_parser = pleio_lab::units::parse_quantity_arg)]
    budget: Option<u64>,
    /// Eviction policy of the row cache (lru, clock, sieve, s3-fifo).
    #[arg(long, value_name = "POLICY")]
    cache_policy: Option<CachePolicy>,
    /// Output format.
    #[arg(long, value_enum, default_value = "raw")]
    format: Format,
    /// Overwrite an existing output file.
    #[arg(long)]
    force: bool,
    /// Print what the gather did (as JSON with --json).
    #[arg(long)]
    stats: bool,
    /// Print the stats as JSON.
    #[arg(long)]
    json: bool,
    /// Output file.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

/// Parses row ids separated by whitespace and/or commas, with optional
/// surrounding `[` `]` (so a JSON array works too).
pub fn parse_row_list(text: &str, source: &str) -> Result<Vec<u64>> {
    let body = text.trim();
    let body = body
        .strip_prefix('[')
        .and_then(|b| b.strip_suffix(']'))
        .unwrap_or(body);
    body.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            s.parse::<u64>()
                .with_context(|| format!("{source}: item {} ({s:?}) is not a row id", i + 1))
        })
        .collect()
}

pub fn run(a: Args) -> Result<()> {
    let rows = match &a.rows_file {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            parse_row_list(&text, &p.display().to_string())?
        }
        None => a.rows.clone(),
    };
    let model = Arc::new(Model::open(&a.file)?);
    let mut reader = Table::of_tensor_or_ple(model, a.tensor.as_deref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?
        .with_detailed_stats(a.stats || a.json);
    if let Some(b) = a.budget {
        reader = reader.with_budget(b)?;
    }
    if let Some(p) = a.cache_policy {
        reader = reader.with_cache_policy(p);
    }
    let elems = reader.row_elems();
    let mut out = vec![0f32; rows.len() * elems];
    // Every id is checked before any output is created.
    let stats = reader.gather_with(a.strategy, &rows, &mut out)?;
    write_atomic(&a.output, a.force, |w| {
        if a.format == Format::Npy {
            write_npy_header(w, rows.len(), elems)?;
        }
        let mut buf = Vec::with_capacity(out.len().min(1 << 18) * 4);
        for chunk in out.chunks(1 << 18) {
            buf.clear();
            buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
            w.write_all(&buf)?;
        }
        Ok(())
    })?;
    if a.stats || a.json {
        print_stats(&a, &reader, &stats);
    }
    Ok(())
}

/// Prints what the gather did: one JSON object with `--json`, else lines.
fn print_stats(a: &Args, reader: &Table, stats: &GatherStats) {
    let table = reader.layout();
    if a.json {
        let j = json!({
            "strategy": a.strategy.name(),
            "tensor": table.name(),
            "rows": stats.rows,
            "bytes": stats.bytes,
            "distinct_pages": stats.pages,
            "runs_advised": stats.runs_advised,
            "advice_syscalls": stats.advice_syscalls,
            "advice_failures": stats.advice_failures,
            "major_faults": stats.major_faults,
            "cold_rows": stats.cold_rows,
            "found_resident": stats.found_resident,
            "read_requests": stats.read_requests,
            "read_bytes": stats.read_bytes,
            "backend": stats.backend,
            "fallback": stats.fallback,
            "rearmed": stats.rearmed,
            "cache_hits": stats.cache_hits,
            "cache_misses": stats.cache_misses,
            "cache_evictions": stats.cache_evictions,
            "cache_bytes": stats.cache_bytes,
            "cache_budget": (a.strategy == Strategy::Cached).then(|| reader.cache_budget()),
            "output": a.output.display().to_string(),
        });
        println!("{j}");
        return;
    }
    let opt = |v: Option<u64>| v.map_or_else(|| "n/a".to_string(), |v| v.to_string());
    println!(
        "gathered {} rows ({} row bytes) of {} with strategy {} into {}",
        stats.rows,
        stats.bytes,
        table.name(),
        a.strategy,
        a.output.display()
    );
    println!("  rows requested   {}", stats.rows);
    println!("  distinct pages   {}", opt(stats.pages));
    println!("  runs advised     {}", stats.runs_advised);
    println!("  advice syscalls  {}", stats.advice_syscalls);
    println!("  advice failures  {}", stats.advice_failures);
    println!("  major faults     {}", opt(stats.major_faults));
    println!("  rows read cold   {}", stats.cold_rows);
    println!(
        "  found resident   {} (auto: unknown rows mincore found cached)",
        stats.found_resident
    );
    println!(
        "  read requests    {} ({} bytes)",
        stats.read_requests, stats.read_bytes
    );
    println!(
        "  backend          {}{}",
        stats.backend.unwrap_or("none (mapped)"),
        if stats.fallback { " (fallback)" } else { "" }
    );
    if stats.rearmed {
        println!("  rearmed          yes (auto found pages evicted behind its back)");
    }
    if a.strategy == Strategy::Cached {
        println!(
            "  row cache        {} hits, {} misses (read from the device), {} evictions, {} of {} budget held",
            stats.cache_hits,
            stats.cache_misses,
            stats.cache_evictions,
            stats.cache_bytes.map_or_else(|| "n/a".into(), crate::output::human_bytes),
            crate::output::human_bytes(reader.cache_budget())
        );
    }
}

/// NumPy format 1.0 header for a C-order `<f4` array of `(rows, cols)`.
fn write_npy_header(w: &mut dyn Write, rows: usize, cols: usize) -> std::io::Result<()> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // magic(6) + version(2) + len(2) + dict + padding + '\n' is a multiple of 64.
    let unpadded = 10 + dict.len() + 1;
    let pad = unpadded.div_ceil(64) * 64 - unpadded;
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&((dict.len() + pad + 1) as u16).to_le_bytes())?;
    w.write_all(dict.as_bytes())?;
    w.write_all(&vec![b' '; pad])?;
    w.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_lists_parse_in_every_form() {
        assert_eq!(parse_row_list("1,5 9\n2", "x").unwrap(), vec![1, 5, 9, 2]);
        assert_eq!(parse_row_list("[3, 4]", "x").unwrap(), vec![3, 4]);
        assert_eq!(parse_row_list("  ", "x").unwrap(), Vec::<u64>::new());
        let e = parse_row_list("1,-2", "f.txt").unwrap_err().to_string();
        assert!(e.contains("f.txt") && e.contains("item 2"), "{e}");
    }

    #[test]
    fn npy_header_is_aligned() {
        let mut v = Vec::new();
        write_npy_header(&mut v, 3, 160).unwrap();
        assert_eq!(v.len() % 64, 0);
        assert!(v.ends_with(b"\n"));
    }
}
