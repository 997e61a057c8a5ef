//! `pleio gather`: decode rows of a table to little-endian f32 (or bf16,
//! f16, or the stored bytes).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use pleio::fetch::{GatherStats, Strategy, Table};
use pleio::CachePolicy;
use pleio::{Dtype, Rounding};
use serde_json::json;

use crate::lists::{read_row_list, MAX_ROW_IDS};
use crate::outfile::{self, OutFile, Replace};
use crate::output::InFile;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Raw little-endian values of `--dtype`, rows back to back.
    Raw,
    /// NumPy `.npy`: shape `(rows, row_elems)`, dtype `<f4` (f32), `<f2`
    /// (f16) or `<u2` (bf16 bit patterns: view as `ml_dtypes.bfloat16`);
    /// with `--dtype raw`, `|u1` of shape `(rows, row_bytes)`.
    Npy,
}

/// Most rows decoded per gather call: the ids are gathered and written in
/// chunks of at most this many rows and [`CHUNK_BYTES`] decoded bytes, so
/// memory stays bounded whatever the number of ids.
pub const CHUNK_ROWS: usize = 1 << 16;

/// Most decoded bytes held per chunk (64 MiB).
const CHUNK_BYTES: u64 = 64 << 20;

/// Largest decoded row gather accepts (1 GiB): a bigger row is an error
/// before any output is created.
const MAX_ROW_OUT_BYTES: u64 = 1 << 30;

/// Gather rows of a table (the PLE table by default) and write them as
/// little-endian f32 (or `--dtype` bf16, f16, raw) in request order,
/// duplicates repeated.
///
/// The table is a GGUF file or a safetensors checkpoint (its directory,
/// model.safetensors.index.json, one .safetensors file, or a
/// ple-store.json). bf16 and f16 are rounded to nearest even from the
/// exact f32 value, or by an engine's rule (--rounding); raw is each row's stored bytes (for a checkpoint row of
/// several parts, its parts concatenated: NVFP4 nibbles then block scales;
/// MLX words, scales, biases).
///
/// Every id is checked before the output is created: a row out of range is
/// an error naming the row and the limit (exit status 2), and nothing is
/// written. An empty row list is an error too (no empty output is made).
/// At most 67108864 ids per run; rows are gathered and written in chunks of
/// up to 65536 rows (and 64 MiB decoded), so memory stays bounded.
///
/// The output is written under a temporary name beside it and renamed into
/// place when complete; an existing file is replaced only with --force,
/// and only if no other writer replaced it meanwhile. `-` is standard
/// output; character devices and FIFOs (also through a symbolic link, such
/// as /dev/stdout on a pipe) are written directly; other symbolic links are
/// refused, never replaced.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (or any shard of a split set), or a safetensors
    /// checkpoint: its directory, index, one file, or a ple-store.json;
    /// or a table published to Redis, redis://HOST:PORT/NAME or
    /// rediss://... over TLS (docs/remote.md).
    file: PathBuf,
    /// Row ids, comma-separated (e.g. 1,5,9).
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with = "rows_file",
        required_unless_present = "rows_file"
    )]
    rows: Vec<u64>,
    /// File of row ids separated by whitespace or commas (or a JSON array);
    /// `-` reads standard input. At most 67108864 ids.
    #[arg(long)]
    rows_file: Option<PathBuf>,
    /// Any 2-D tensor to read instead of `per_layer_token_embd.weight`.
    #[arg(long)]
    tensor: Option<String>,
    #[command(flatten)]
    layer: crate::table_args::LayerArg,
    /// How row bytes are brought in.
    #[arg(long, default_value = "auto")]
    strategy: Strategy,
    /// Row cache budget of the `cached` strategy, or of the machine-wide
    /// cache `shared` creates if none exists yet (e.g. 256M).
    #[arg(long, value_name = "SIZE", value_parser = pleio_lab::units::parse_quantity_arg)]
    budget: Option<u64>,
    /// Eviction policy of the row cache (lru, clock, sieve, s3-fifo).
    #[arg(long, value_name = "POLICY")]
    cache_policy: Option<CachePolicy>,
    /// Output format.
    #[arg(long, value_enum, default_value = "raw")]
    format: Format,
    /// Output element type: f32, bf16, f16, or raw (the stored bytes).
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
    /// How values are rounded to --dtype (raw is never affected):
    ///   exact:       the exact value, rounded once (every table; the default).
    ///   vllm/sglang: FP8 tables: dtype(e4m3 * dtype(scale)), the scale rounded first (f32: exact).
    ///   mlx:         MLX 4-bit: mlx's bf16(bf16(scale * q) + bias), then cast to --dtype.
    /// A rule that does not apply to the table's encoding is an error.
    #[arg(long, default_value = "exact", verbatim_doc_comment)]
    rounding: Rounding,
    /// Overwrite an existing output file.
    #[arg(long)]
    force: bool,
    /// Print what the gather did (as JSON with --json; on stderr when the
    /// output is standard output).
    #[arg(long)]
    stats: bool,
    /// Print the stats as JSON.
    #[arg(long)]
    json: bool,
    /// Output file (`-`: standard output).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

/// The row ids of `--rows` or `--rows-file`, at most [`MAX_ROW_IDS`].
fn row_ids(a: &Args) -> Result<Vec<u64>> {
    let rows = match &a.rows_file {
        Some(p) if p == Path::new("-") => {
            read_row_list(std::io::stdin().lock(), "standard input", MAX_ROW_IDS)?
        }
        Some(p) => {
            let f = File::open(p).with_context(|| format!("reading {}", p.display()))?;
            read_row_list(f, &p.display().to_string(), MAX_ROW_IDS)?
        }
        None if a.rows.len() > MAX_ROW_IDS => {
            bail!("--rows: more than {MAX_ROW_IDS} ids, the most one list may hold")
        }
        None => a.rows.clone(),
    };
    if rows.is_empty() {
        bail!("no row ids to gather: the row list is empty (pleio writes no empty output)");
    }
    Ok(rows)
}

/// Rows per chunk for rows of `row_out` decoded bytes.
fn chunk_rows(row_out: u64) -> usize {
    usize::try_from(CHUNK_BYTES / row_out.max(1))
        .unwrap_or(usize::MAX)
        .clamp(1, CHUNK_ROWS)
}

pub fn run(a: Args) -> Result<()> {
    let rows = row_ids(&a)?;
    let replace = Replace::IfForced(a.force);
    outfile::check(&a.output, replace)?;
    // The error names the file (and the tensor) itself.
    let mut reader = a
        .layer
        .options(a.tensor.as_deref())
        .rounding(a.rounding)
        .open(&a.file)?
        .with_detailed_stats(a.stats || a.json);
    if let Some(b) = a.budget {
        reader = reader.with_budget(b)?;
    }
    if let Some(p) = a.cache_policy {
        reader = reader.with_cache_policy(p);
    }
    let t = reader.layout();
    // Every id is checked before any output is created.
    t.check_rows(&rows).in_file(&a.file)?;
    let row_out = reader
        .out_bytes(a.dtype, 1)
        .map(|b| b as u64)
        .filter(|&b| b <= MAX_ROW_OUT_BYTES)
        .with_context(|| {
            format!(
                "{}: tensor {:?}: a row of {} elements decodes to more than {} GiB, \
                 the most pleio gathers at once",
                a.file.display(),
                t.name(),
                t.row_elems(),
                MAX_ROW_OUT_BYTES >> 30
            )
        })?;
    let chunk = chunk_rows(row_out);
    let row_out = row_out as usize;

    let out = OutFile::create(&a.output, replace)?;
    let to_stdout = out.is_stdout();
    let write_err = || format!("writing {}", a.output.display());
    let mut w = BufWriter::with_capacity(1 << 20, out.file());
    if a.format == Format::Npy {
        let (descr, cols) = match a.dtype {
            Dtype::F32 => ("<f4", reader.row_elems()),
            Dtype::F16 => ("<f2", reader.row_elems()),
            Dtype::Bf16 => ("<u2", reader.row_elems()),
            _ => ("|u1", row_out),
        };
        write_npy_header(&mut w, descr, rows.len(), cols).with_context(write_err)?;
    }
    let mut bytes = vec![0u8; chunk * row_out];
    let mut stats = GatherStats::default();
    for ids in rows.chunks(chunk) {
        let dst = &mut bytes[..ids.len() * row_out];
        let s = reader.gather_as_with(a.strategy, a.dtype, ids, dst)?;
        stats.add(&s);
        w.write_all(dst).with_context(write_err)?;
    }
    w.flush().with_context(write_err)?;
    drop(w);
    out.commit()?;
    if a.stats || a.json {
        let text = stats_text(&a, &reader, &stats, rows.len().div_ceil(chunk));
        if to_stdout {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    }
    Ok(())
}

/// What the gather did: one JSON line with `--json`, else lines of text.
fn stats_text(a: &Args, reader: &Table, stats: &GatherStats, chunks: usize) -> String {
    let table = reader.layout();
    if a.json {
        let j = json!({
            "strategy": a.strategy.name(),
            "dtype": a.dtype.name(),
            "rounding": reader.rounding().name(),
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
            "chunks": chunks,
            "cache_hits": stats.cache_hits,
            "cache_misses": stats.cache_misses,
            "cache_evictions": stats.cache_evictions,
            "cache_bytes": stats.cache_bytes,
            "cache_budget": matches!(a.strategy, Strategy::Cached | Strategy::Shared).then(|| reader.cache_budget()),
            "output": a.output.display().to_string(),
        });
        return format!("{j}\n");
    }
    let opt = |v: Option<u64>| v.map_or_else(|| "n/a".to_string(), |v| v.to_string());
    let mut lines = vec![
        format!(
            "gathered {} rows ({} row bytes) of {} with strategy {} into {}",
            stats.rows,
            stats.bytes,
            table.name(),
            a.strategy,
            a.output.display()
        ),
        format!("  rows requested   {}", stats.rows),
        format!("  distinct pages   {}", opt(stats.pages)),
        format!("  runs advised     {}", stats.runs_advised),
        format!("  advice syscalls  {}", stats.advice_syscalls),
        format!("  advice failures  {}", stats.advice_failures),
        format!("  major faults     {}", opt(stats.major_faults)),
        format!("  rows read cold   {}", stats.cold_rows),
        format!(
            "  found resident   {} (auto: unknown rows mincore found cached)",
            stats.found_resident
        ),
        format!(
            "  read requests    {} ({} bytes)",
            stats.read_requests, stats.read_bytes
        ),
        format!(
            "  backend          {}{}",
            stats.backend.unwrap_or("none (mapped)"),
            if stats.fallback { " (fallback)" } else { "" }
        ),
        format!("  rounding         {} ({})", reader.rounding(), a.dtype),
    ];
    if stats.rearmed {
        lines.push("  rearmed          yes (auto found pages evicted behind its back)".into());
    }
    if matches!(a.strategy, Strategy::Cached | Strategy::Shared) {
        lines.push(format!(
            "  row cache        {} hits, {} misses (read from the device), {} evictions, {} of {} budget held",
            stats.cache_hits,
            stats.cache_misses,
            stats.cache_evictions,
            stats.cache_bytes.map_or_else(|| "n/a".into(), crate::output::human_bytes),
            crate::output::human_bytes(reader.cache_budget())
        ));
    }
    if chunks > 1 {
        lines.push(format!(
            "  chunks           {chunks} (distinct pages are counted per chunk and summed)"
        ));
    }
    lines.join("\n") + "\n"
}

/// NumPy format 1.0 header for a C-order `descr` array of `(rows, cols)`.
fn write_npy_header(
    w: &mut dyn Write,
    descr: &str,
    rows: usize,
    cols: usize,
) -> std::io::Result<()> {
    let dict =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
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
    fn npy_header_is_aligned() {
        let mut v = Vec::new();
        write_npy_header(&mut v, "<f4", 3, 160).unwrap();
        assert_eq!(v.len() % 64, 0);
        assert!(v.ends_with(b"\n"));
    }

    #[test]
    fn chunks_bound_rows_and_bytes() {
        assert_eq!(chunk_rows(640), CHUNK_ROWS);
        assert_eq!(chunk_rows(256 * 42 * 4), (64 << 20) / (256 * 42 * 4));
        assert_eq!(chunk_rows(MAX_ROW_OUT_BYTES), 1);
        assert_eq!(chunk_rows(0), CHUNK_ROWS);
    }
}
