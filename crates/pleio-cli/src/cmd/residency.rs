//! `pleio residency`: how much of a table is in the page cache, and where.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use pleio::layout::Layout;
use pleio::model::Model;
use pleio_lab::residency::{scan_path, Residency, DEFAULT_BUCKETS};
use serde_json::{json, Value as Json};

use crate::outfile;
use crate::output::human_bytes;
use crate::plot;

/// Show how much of the PLE table (or `--tensor`) is in the page cache:
/// percentage, bytes, and a heat strip along the table. The file is
/// snapshotted on a fresh mapping before it is opened (opening reads the
/// header, and the kernel reads around it), so the figures are the cache as
/// it was: with `mincore` (every page) where the kernel shows this user the
/// file's residency (owner, root, or may write it), else by sampling pages
/// with cache-only reads (estimates; the pages such a read makes the kernel
/// load are dropped again). Either way the cache is left as it was found.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file, or any shard of a split set.
    file: PathBuf,
    /// Tensor to scan instead of `per_layer_token_embd.weight`.
    #[arg(long)]
    tensor: Option<String>,
    /// Cells of the heat strip (each a slice of the table's pages).
    #[arg(long, default_value_t = DEFAULT_BUCKETS)]
    buckets: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also draw the heat strip as an SVG chart (a regular file there is
    /// replaced; symbolic links and special files are not).
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<PathBuf>,
}

/// Shades of the text heat strip, from none resident to all resident.
const SHADES: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

pub fn run(a: Args) -> Result<()> {
    if a.buckets == 0 {
        bail!("--buckets must be at least 1");
    }
    if let Some(out) = &a.plot {
        outfile::check_chart(out)?;
    }
    let (model, table, r) = scan_path(&a.file, a.tensor.as_deref(), a.buckets)?;
    if let Some(out) = &a.plot {
        let title = format!(
            "page-cache residency of {}: {} ({} of {})",
            table.name(),
            percent(r.fraction()),
            human_bytes(r.resident_bytes),
            human_bytes(r.total_bytes)
        );
        plot::heat_strip(out, &title, &r.buckets)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report(&model, &table, &r))?
        );
    } else {
        print_text(&model, &table, &r);
        if let Some(out) = &a.plot {
            println!("chart: {}", out.display());
        }
    }
    Ok(())
}

/// `12.3%`, with small non-zero fractions kept visible.
fn percent(f: f64) -> String {
    let p = f * 100.0;
    if p > 0.0 && p < 0.1 {
        "<0.1%".to_owned()
    } else {
        format!("{p:.1}%")
    }
}

/// One character per bucket: blank for none resident, a full block for
/// all, at least the lowest block for any, `?` for a bucket not asked.
pub fn strip(buckets: &[f32]) -> String {
    let top = (SHADES.len() - 1) as f32;
    buckets
        .iter()
        .map(|&f| {
            if f.is_nan() {
                return '?';
            }
            let f = f.clamp(0.0, 1.0);
            let level = if f > 0.0 {
                ((f * top).round() as usize).max(1)
            } else {
                0
            };
            SHADES[level]
        })
        .collect()
}

fn report(model: &Model, table: &Layout, r: &Residency) -> Json {
    let path = model
        .shards()
        .get(table.shard())
        .map(|s| s.path().display().to_string());
    json!({
        "file": path,
        "tensor": table.name(),
        "offset": r.range.start,
        "bytes": r.total_bytes,
        "page_size": r.page_size,
        "pages": r.pages,
        "resident_pages": r.resident_pages,
        "resident_bytes": r.resident_bytes,
        "resident_fraction": r.fraction(),
        "method": r.method,
        "probed_pages": r.probed_pages,
        "exact": r.is_exact(),
        "buckets": r.buckets,
    })
}

fn print_text(model: &Model, table: &Layout, r: &Residency) {
    let path = model
        .shards()
        .get(table.shard())
        .map(|s| s.path().display().to_string())
        .unwrap_or_default();
    println!(
        "table: {} in {path}, bytes {}..{} ({}, {} pages of {})",
        table.name(),
        r.range.start,
        r.range.end,
        human_bytes(r.total_bytes),
        r.pages,
        human_bytes(r.page_size)
    );
    println!(
        "resident: {}{} ({} of {}, {} of {} pages)",
        if r.is_exact() { "" } else { "about " },
        percent(r.fraction()),
        human_bytes(r.resident_bytes),
        human_bytes(r.total_bytes),
        r.resident_pages,
        r.pages
    );
    if r.is_exact() {
        println!("asked: every page, with {}", r.method);
    } else {
        println!(
            "asked: {} sampled pages with cache-only reads (the kernel hides this file's \
             page-cache residency from a user who neither owns nor may write it)",
            r.probed_pages
        );
    }
    if !r.buckets.is_empty() {
        let per = r.pages.div_ceil(r.buckets.len() as u64) * r.page_size;
        println!(
            "heat ({} cells of about {} each, table start to end; ' ' none resident, '█' all):",
            r.buckets.len(),
            human_bytes(per)
        );
        println!("|{}|", strip(&r.buckets));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_shades_and_keeps_any_residency_visible() {
        assert_eq!(strip(&[0.0, 0.001, 0.5, 1.0, 2.0, f32::NAN]), " ▁▄██?");
        assert_eq!(percent(0.0), "0.0%");
        assert_eq!(percent(0.0004), "<0.1%");
        assert_eq!(percent(0.5), "50.0%");
    }
}
