//! `pleio inspect`: what a GGUF file holds and how its PLE table lies on disk.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use anyhow::{Context, Result};
use pleio::gguf::{Array, Value};
use pleio::layout::{Layout, PLE_TENSOR};
use pleio::model::Model;
use pleio::quant::encoding::{Encoding, Fp8Scale};
use serde_json::{json, Map, Value as Json};

use crate::output::human_bytes;

/// Show a GGUF file (or split set): architecture, metadata, tensors, and the
/// PLE table's geometry (rows, row bytes, rows per page, page-straddling
/// rows, bytes on disk) with its n-gram metadata.
///
/// A safetensors checkpoint (its directory, model.safetensors.index.json,
/// one .safetensors file, or a ple-store.json) shows its PLE table: the
/// encoding, the row geometry, the n-gram config, and the shard -> file /
/// offset map (every part of every shard).
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (or any shard of a split set), or a safetensors
    /// checkpoint: its directory, index, one file, or a ple-store.json.
    file: PathBuf,
    /// Tensor to describe instead of `per_layer_token_embd.weight`.
    #[arg(long)]
    tensor: Option<String>,
    #[command(flatten)]
    layer: crate::table_args::LayerArg,
    /// Print every metadata array in full (default: long arrays abridged).
    #[arg(long)]
    full: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Arrays longer than this are abridged.
const SHORT_ARRAY: usize = 16;

pub fn run(a: Args) -> Result<()> {
    let text = a.file.to_string_lossy().into_owned();
    if pleio::remote::is_remote(&text) {
        return inspect_remote(&text, a.json);
    }
    if pleio::checkpoint::is_checkpoint_path(&a.file) {
        if a.tensor.is_some() {
            anyhow::bail!(
                "{}: --tensor applies to GGUF files; a checkpoint shows its PLE table",
                a.file.display()
            );
        }
        let table = a.layer.open(&a.file, None)?;
        let report = checkpoint_report(&table)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print_checkpoint(&report, a.full);
        }
        return Ok(());
    }
    if a.layer.layer.is_some() {
        // Only checks that the file has that PLE layer (the error names
        // the layers it has).
        a.layer.open(&a.file, a.tensor.as_deref())?;
    }
    let model = Model::open(&a.file)?;
    let report = report(&model, a.tensor.as_deref(), a.full)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&model, &report, a.full);
    }
    Ok(())
}

/// A table in Redis: its manifest (what `pleio publish` recorded).
fn inspect_remote(url: &str, json_out: bool) -> Result<()> {
    let shown = pleio::remote::url::redact(url);
    let t = pleio::remote::RemoteTable::open(url).with_context(|| shown.clone())?;
    let m = t.manifest();
    if json_out {
        let j = json!({ "address": shown, "manifest": m });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    println!("{shown}: a table published to Redis (pleio publish)");
    println!("  id           {}", m.id);
    println!("  source       {}", m.source);
    println!("  tensor       {}", m.name);
    println!(
        "  rows         {} x {} elements, {} bytes each",
        m.rows, m.row_elems, m.row_bytes
    );
    let format = match m.format() {
        Some(pleio::layout::RowFormat::Encoded(pleio::quant::encoding::Encoding::Fp8(
            pleio::quant::encoding::Fp8Scale::PerTensor(s),
        ))) => format!("fp8 (table scale {s:e})"),
        Some(pleio::layout::RowFormat::Encoded(pleio::quant::encoding::Encoding::Nvfp4 {
            global_scale,
        })) => format!("nvfp4 (global scale {global_scale:e})"),
        Some(f) => f.to_string(),
        None => format!(
            "unknown to this pleio: {}",
            serde_json::to_string(&m.row_format)?
        ),
    };
    println!("  row format   {format}");
    println!(
        "  buckets      {} of {} rows ({} per bucket, each row + a 4-byte check)",
        m.buckets,
        m.rows_per_bucket,
        human_bytes(m.rows_per_bucket * (m.row_bytes + 4))
    );
    let layer = m.layer.map_or("-".to_string(), |l| l.to_string());
    println!(
        "  PLE layers   {:?} (this table: layer {layer})",
        m.ple_layers
    );
    println!("  fingerprint  {}", m.fingerprint);
    Ok(())
}

/// Everything `inspect` knows, as JSON (the text view prints from it too).
pub fn report(model: &Model, tensor: Option<&str>, full: bool) -> Result<Json> {
    let page = pleio::sys::page_size();
    let shards: Vec<Json> = model
        .shards()
        .iter()
        .map(|s| {
            let allocated = std::fs::metadata(s.path()).map(|m| m.blocks() * 512).ok();
            json!({
                "path": s.path().display().to_string(),
                "version": s.version(),
                "alignment": s.alignment(),
                "data_offset": s.data_offset(),
                "file_bytes": s.file_len(),
                "allocated_bytes": allocated,
                "tensors": s.tensor_count(),
            })
        })
        .collect();
    let mut metadata = Map::new();
    for (k, v) in model.metadata().iter() {
        metadata.insert(k.to_string(), value_json(v, full));
    }
    let tensors: Vec<Json> = model
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.info.name,
                "type": t.info.ty.name(),
                "shape": t.info.dims,
                "bytes": t.info.n_bytes,
                "shard": t.shard,
                "offset": t.file_offset,
            })
        })
        .collect();
    let table = match Layout::of_tensor_or_ple(model, tensor) {
        Ok(t) => Some(table_json(model, &t, page)),
        Err(e) if tensor.is_none() => {
            let _ = e; // no PLE table: not an error for inspect
            None
        }
        Err(e) => return Err(e).context("--tensor"),
    };
    Ok(json!({
        "architecture": model.architecture(),
        "shards": shards,
        "metadata": metadata,
        "tensors": tensors,
        "table": table,
    }))
}

fn table_json(model: &Model, t: &Layout, page: u64) -> Json {
    let g = t.page_geometry(page);
    let arch = model.architecture().unwrap_or("");
    let mut ngram = Json::Null;
    if arch == "qwen4exp" && t.name() == PLE_TENSOR {
        let md = model.metadata();
        let get = |k: &str| md.get(&format!("qwen4exp.{k}"));
        let u = |k: &str| get(k).and_then(Value::as_u64);
        let arr = |k: &str| get(k).and_then(Value::as_u64_array);
        let sizes = arr("ple.head_vocab_sizes");
        let offsets = arr("ple.head_offsets");
        let addressed = sizes.as_ref().map(|s| s.iter().sum::<u64>());
        let heads_fit = match (&sizes, &offsets) {
            (Some(s), Some(o)) if s.len() == o.len() => Some(
                s.iter()
                    .zip(o)
                    .all(|(&s, &o)| o.checked_add(s).is_some_and(|e| e <= t.rows())),
            ),
            _ => None,
        };
        ngram = json!({
            "ngram_size": u("ple.ngram_size"),
            "heads_per_ngram": u("ple.heads_per_ngram"),
            "eos_token_id": u("ple.eos_token_id"),
            "image_token_id": u("ple.image_token_id"),
            "row_width": u("embedding_length_per_layer_input"),
            "layers": arr("ple.layers"),
            "layer_multipliers": arr("ple.layer_multipliers"),
            "head_vocab_sizes": sizes,
            "head_offsets": offsets,
            "addressed_rows": addressed,
            "padding_rows": addressed.map(|a| t.rows().saturating_sub(a)),
            "heads_inside_table": heads_fit,
        });
    }
    json!({
        "name": t.name(),
        "type": t.ty().name(),
        "rows": t.rows(),
        "row_elems": t.row_elems(),
        "row_bytes": t.row_bytes(),
        "shard": t.shard(),
        "offset": t.offset(),
        "bytes": t.bytes(),
        "page_size": page,
        "rows_per_page": g.rows_per_page,
        "straddling_rows": g.straddling_rows,
        "pages": g.pages,
        "ngram": ngram,
    })
}

/// One line per PLE layer of the checkpoint `table` was opened from: its
/// layer, prefix, rows, shards, encoding and multipliers, `opened` on the
/// one `table` is.
fn layer_list(table: &pleio::Table) -> Result<Vec<Json>> {
    let Some(ck) = table.checkpoint() else {
        return Ok(Vec::new());
    };
    let multipliers = |c: &pleio::checkpoint::CheckpointTable| {
        c.ngram_params().ok().map(|q| q.multipliers().to_vec())
    };
    let mut out = Vec::new();
    for &l in &ck.ple_layers {
        let opened = ck.layer == Some(l);
        let other;
        let c: &pleio::checkpoint::CheckpointTable = if opened {
            ck
        } else {
            other = pleio::checkpoint::CheckpointTable::open_layer(table.source_path(), Some(l))
                .with_context(|| format!("{}: PLE layer {l}", table.source_path().display()))?;
            &other
        };
        out.push(json!({
            "layer": l,
            "ple_layer_index": c.ple_layer_index().ok(),
            "opened": opened,
            "prefix": c.prefix,
            "rows": c.rows,
            "shards": c.shards.len(),
            "encoding": c.encoding.name(),
            "layer_multipliers": multipliers(c),
        }));
    }
    Ok(out)
}

/// What `inspect` shows of a checkpoint table, as JSON.
pub fn checkpoint_report(table: &pleio::Table) -> Result<Json> {
    let page = pleio::sys::page_size();
    let t = table.layout();
    let ck = table.checkpoint();
    let g = t.page_geometry(page);
    let files: Vec<Json> = ck
        .map(|c| c.files.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).ok();
            json!({
                "path": f.display().to_string(),
                "file_bytes": m.as_ref().map(|m| m.len()),
                "allocated_bytes": m.as_ref().map(|m| m.blocks() * 512),
            })
        })
        .collect();
    let shards: Vec<Json> = t
        .shards()
        .iter()
        .map(|s| {
            json!({
                "index": s.index,
                "row_start": s.row_start,
                "rows": s.rows,
                "parts": s.parts.iter().map(|p| json!({
                    "tensor": p.tensor,
                    "file": p.file,
                    "offset": p.offset,
                    "row_bytes": p.row_bytes,
                    "page_aligned": p.offset % page == 0,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let config = ck.and_then(|c| c.config.as_ref()).map(|c| {
        json!({
            "ngram_size": c.ngram_size,
            "heads_per_ngram": c.heads_per_ngram,
            "ngram_vocab_size_base": c.ngram_vocab_size_base,
            "make_ngram_vocab_size_divisible_by": c.make_ngram_vocab_size_divisible_by,
            "split_ngram_parts": c.split_ngram_parts,
            "vocab_size": c.vocab_size,
            "eos_token_id": c.eos_token_id,
            "seed": c.seed,
            "image_token_id": c.image_token_id,
            "ple_embedding_dtype": c.ple_embedding_dtype,
        })
    });
    let ngram = table.row_ids().ok().and_then(|r| {
        r.qwen().map(|q| {
            json!({
                "layer_multipliers": q.multipliers(),
                "head_vocab_sizes": q.head_vocab_sizes(),
                "head_offsets": q.head_offsets(),
            })
        })
    });
    let ple_layers = layer_list(table)?;
    Ok(json!({
        "source": table.source_path().display().to_string(),
        "layer": table.layer(),
        "ple_layers": ple_layers,
        "format": match ck.map(|c| c.source) {
            Some(pleio::checkpoint::TableSource::PleStore) => "ple-store.json",
            _ => "safetensors",
        },
        "kind": match ck.map(|c| c.kind) {
            Some(pleio::checkpoint::TableKind::Gemma4) => "gemma4",
            _ => "qwen4exp",
        },
        "files": files,
        "table": {
            "name": t.name(),
            "encoding": t.ty().name(),
            "rows": t.rows(),
            "row_elems": t.row_elems(),
            "row_bytes": t.row_bytes(),
            "parts": t.parts(),
            "scale": match t.ty() {
                pleio::layout::RowFormat::Encoded(Encoding::Fp8(Fp8Scale::PerTensor(s))) => {
                    json!({"fp8_table_scale": s})
                }
                pleio::layout::RowFormat::Encoded(Encoding::Nvfp4 { global_scale }) => {
                    json!({"nvfp4_weight_scale_2": global_scale})
                }
                _ => Json::Null,
            },
            "bytes": t.bytes(),
            "page_size": page,
            "straddling_row_parts": g.straddling_rows,
            "pages": g.pages,
        },
        "config": config,
        "ngram": ngram,
        "shards": shards,
    }))
}

/// Shards listed one by one in the text view unless `--full` (then all).
const SHORT_SHARDS: usize = 8;

fn print_checkpoint(r: &Json, full: bool) {
    let t = &r["table"];
    println!(
        "checkpoint: {} ({}, {} table)",
        r["source"].as_str().unwrap_or(""),
        r["format"].as_str().unwrap_or(""),
        r["kind"].as_str().unwrap_or("")
    );
    for (i, f) in r["files"].as_array().into_iter().flatten().enumerate() {
        println!(
            "file {i}: {}  ({}{})",
            f["path"].as_str().unwrap_or(""),
            human_bytes(f["file_bytes"].as_u64().unwrap_or(0)),
            f["allocated_bytes"]
                .as_u64()
                .map(|b| format!(", {} allocated on disk", human_bytes(b)))
                .unwrap_or_default()
        );
    }
    let layers = r["ple_layers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !layers.is_empty() {
        println!("\nPLE layers (decoder layer, 0-based; * the one shown below):");
        for l in layers {
            println!(
                "  {} layer {:>3}  {}  {} rows in {} shards, {}, multipliers {}",
                if l["opened"].as_bool() == Some(true) {
                    "*"
                } else {
                    " "
                },
                l["layer"].as_u64().unwrap_or(0),
                l["prefix"].as_str().unwrap_or(""),
                l["rows"],
                l["shards"],
                l["encoding"].as_str().unwrap_or(""),
                l["layer_multipliers"]
            );
        }
    }
    let of_layers = match (r["layer"].as_u64(), layers.is_empty()) {
        (Some(l), false) => format!(
            " (layer {l} of PLE layers [{}])",
            layers
                .iter()
                .map(|l| l["layer"].to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => String::new(),
    };
    println!(
        "
table {}{of_layers}:",
        t["name"].as_str().unwrap_or("")
    );
    println!("  encoding      {}", t["encoding"].as_str().unwrap_or(""));
    println!(
        "  rows          {} x {} elements",
        t["rows"], t["row_elems"]
    );
    println!(
        "  row bytes     {} in {} part(s) (a row is {} read(s) when cold)",
        t["row_bytes"], t["parts"], t["parts"]
    );
    println!(
        "  on disk       {} ({} bytes) in {} shard(s)",
        human_bytes(t["bytes"].as_u64().unwrap_or(0)),
        t["bytes"],
        r["shards"].as_array().map_or(0, Vec::len)
    );
    println!(
        "  pages         {} of {} bytes; {} row parts straddle a page",
        t["pages"], t["page_size"], t["straddling_row_parts"]
    );
    if !r["config"].is_null() {
        let c = &r["config"];
        println!(
            "  config.json   ngram_size {}, heads_per_ngram {}, base {}, divisible by {}, split {}, vocab {}, eos {}, seed {}",
            c["ngram_size"], c["heads_per_ngram"], c["ngram_vocab_size_base"],
            c["make_ngram_vocab_size_divisible_by"], c["split_ngram_parts"],
            c["vocab_size"], c["eos_token_id"], c["seed"]
        );
    }
    if !r["ngram"].is_null() {
        let n = &r["ngram"];
        println!("  multipliers   {}", n["layer_multipliers"]);
        println!("  head sizes    {}", n["head_vocab_sizes"]);
        println!("  head offsets  {}", n["head_offsets"]);
    }
    let shards = r["shards"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    println!(
        "
shards (row start, rows; per part: file, offset, row bytes, tensor):"
    );
    let show = if full {
        shards.len()
    } else {
        SHORT_SHARDS.min(shards.len())
    };
    for s in &shards[..show] {
        let parts: Vec<String> = s["parts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "file {} @ {} (+{}/row{}) {}",
                    p["file"],
                    p["offset"],
                    p["row_bytes"],
                    if p["page_aligned"].as_bool() == Some(true) {
                        ", page-aligned"
                    } else {
                        ""
                    },
                    p["tensor"].as_str().unwrap_or("")
                )
            })
            .collect();
        println!(
            "  {:>4} {:>12} {:>10}  {}",
            s["index"],
            s["row_start"],
            s["rows"],
            parts.join("; ")
        );
    }
    if show < shards.len() {
        println!(
            "  ... {} more (--full lists every shard)",
            shards.len() - show
        );
    }
}

fn value_json(v: &Value, full: bool) -> Json {
    match v {
        Value::Array(a) => array_json(a, full),
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        other => other
            .as_i64()
            .map(|i| json!(i))
            .or_else(|| other.as_u64().map(|u| json!(u)))
            .unwrap_or_else(|| json!(other.to_string())),
    }
}

fn array_json(a: &Array, full: bool) -> Json {
    if !full && a.len() > SHORT_ARRAY {
        return json!({ "type": a.element_type().name(), "len": a.len(), "abridged": a.to_string() });
    }
    match a {
        Array::String(v) => json!(v),
        Array::Array(v) => Json::Array(v.iter().map(|x| array_json(x, full)).collect()),
        Array::F32(v) => json!(v),
        Array::F64(v) => json!(v),
        Array::Bool(v) => json!(v),
        Array::I8(v) => json!(v),
        Array::I16(v) => json!(v),
        Array::I32(v) => json!(v),
        Array::I64(v) => json!(v),
        Array::U8(v) => json!(v),
        Array::U16(v) => json!(v),
        Array::U32(v) => json!(v),
        Array::U64(v) => json!(v),
    }
}

fn print_text(model: &Model, r: &Json, full: bool) {
    let shards = r["shards"].as_array().map_or(0, Vec::len);
    println!(
        "architecture: {}",
        r["architecture"].as_str().unwrap_or("(none)")
    );
    for s in r["shards"].as_array().into_iter().flatten() {
        println!(
            "file: {}  (GGUF v{}, alignment {}, data at {}, {} tensors, {}{})",
            s["path"].as_str().unwrap_or(""),
            s["version"],
            s["alignment"],
            s["data_offset"],
            s["tensors"],
            human_bytes(s["file_bytes"].as_u64().unwrap_or(0)),
            s["allocated_bytes"]
                .as_u64()
                .map(|b| format!(", {} allocated on disk", human_bytes(b)))
                .unwrap_or_default(),
        );
    }
    if shards > 1 {
        println!("split set of {shards} shards");
    }
    println!("\nmetadata ({} keys):", model.metadata().len());
    for (k, v) in model.metadata().iter() {
        let text = match v {
            Value::Array(a) if full => format!("{a:?}"),
            _ => v.to_string(),
        };
        println!("  {k} = {text}");
    }
    println!("\ntensors ({}):", model.tensors().len());
    println!(
        "  {:<36} {:<8} {:<22} {:>12} {:>14} shard",
        "name", "type", "shape", "bytes", "offset"
    );
    for t in model.tensors() {
        println!(
            "  {:<36} {:<8} {:<22} {:>12} {:>14} {}",
            t.info.name,
            t.info.ty.name(),
            format!("{:?}", t.info.dims),
            t.info.n_bytes,
            t.file_offset,
            t.shard
        );
    }
    let t = &r["table"];
    if t.is_null() {
        println!("\nno per-layer-embedding table ({PLE_TENSOR}) in this file");
        return;
    }
    let rows = t["rows"].as_u64().unwrap_or(0);
    let straddle = t["straddling_rows"].as_u64().unwrap_or(0);
    println!("\ntable {}:", t["name"].as_str().unwrap_or(""));
    println!("  type          {}", t["type"].as_str().unwrap_or(""));
    println!("  rows          {rows} x {} elements", t["row_elems"]);
    println!("  row bytes     {}", t["row_bytes"]);
    println!(
        "  on disk       {} ({} bytes) at offset {} of shard {}",
        human_bytes(t["bytes"].as_u64().unwrap_or(0)),
        t["bytes"],
        t["offset"],
        t["shard"]
    );
    println!(
        "  pages         {} of {} bytes; {} whole rows per page",
        t["pages"], t["page_size"], t["rows_per_page"]
    );
    println!(
        "  straddling    {straddle} rows ({:.2}%) span two pages",
        if rows > 0 {
            100.0 * straddle as f64 / rows as f64
        } else {
            0.0
        }
    );
    let n = &t["ngram"];
    if !n.is_null() {
        println!("  n-gram hash (qwen4exp):");
        println!(
            "    ngram size {}, {} heads per n-gram, eos {}, image token {}",
            n["ngram_size"], n["heads_per_ngram"], n["eos_token_id"], n["image_token_id"]
        );
        println!("    multipliers   {}", n["layer_multipliers"]);
        println!("    head sizes    {}", n["head_vocab_sizes"]);
        println!("    head offsets  {}", n["head_offsets"]);
        println!(
            "    addressed rows {}, padding rows {}, every head inside the table: {}",
            n["addressed_rows"], n["padding_rows"], n["heads_inside_table"]
        );
    }
}
