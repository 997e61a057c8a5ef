//! `pleio residency`: how much of a table is in the page cache, and where.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use pleio::layout::Layout;
use pleio_lab::residency::{scan_checkpoint_layer, scan_path, Residency, DEFAULT_BUCKETS};
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
///
/// A safetensors checkpoint (directory, index, one file, ple-store.json) is
/// shown file by file: in each file holding the table, the bytes from its
/// first shard to its last (other tensors between shards included).
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (or any shard of a split set), or a safetensors
    /// checkpoint: its directory, index, one file, or a ple-store.json.
    file: PathBuf,
    #[command(flatten)]
    layer: crate::table_args::LayerArg,
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
    crate::table_args::files_only(&a.file, "residency")?;
    if a.buckets == 0 {
        bail!("--buckets must be at least 1");
    }
    if let Some(out) = &a.plot {
        outfile::check_chart(out)?;
    }
    let (table, scans) = if pleio::checkpoint::is_checkpoint_path(&a.file) {
        if a.tensor.is_some() {
            bail!(
                "{}: --tensor applies to GGUF files; a checkpoint shows its PLE table",
                a.file.display()
            );
        }
        scan_checkpoint_layer(&a.file, a.layer.layer, a.buckets)?
    } else {
        let (model, table, r) = scan_path(&a.file, a.tensor.as_deref(), a.buckets)?;
        if a.layer.layer.is_some() {
            // After the scan (which saw the cache as it was): checks that
            // the file has that PLE layer, the error naming those it has.
            a.layer.open(&a.file, a.tensor.as_deref())?;
        }
        let path = model
            .shards()
            .get(table.shard())
            .map(|s| s.path().to_path_buf())
            .unwrap_or_default();
        (table, vec![(path, r)])
    };
    if let Some(out) = &a.plot {
        let resident: u64 = scans.iter().map(|(_, r)| r.resident_bytes).sum();
        let total: u64 = scans.iter().map(|(_, r)| r.total_bytes).sum();
        let buckets: Vec<f32> = scans.iter().flat_map(|(_, r)| r.buckets.clone()).collect();
        let title = format!(
            "page-cache residency of {}: {} ({} of {}){}",
            table.name(),
            percent(resident as f64 / total.max(1) as f64),
            human_bytes(resident),
            human_bytes(total),
            if scans.len() > 1 {
                format!(", {} files one after another", scans.len())
            } else {
                String::new()
            }
        );
        plot::heat_strip(out, &title, &buckets)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    if a.json {
        let reports: Vec<Json> = scans
            .iter()
            .map(|(p, r)| report(&p.display().to_string(), &table, r))
            .collect();
        let j = if reports.len() == 1 {
            reports.into_iter().next().unwrap_or_default()
        } else {
            json!({"tensor": table.name(), "files": reports})
        };
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        for (p, r) in &scans {
            print_text(&p.display().to_string(), &table, r);
        }
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

fn report(path: &str, table: &Layout, r: &Residency) -> Json {
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

fn print_text(path: &str, table: &Layout, r: &Residency) {
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
