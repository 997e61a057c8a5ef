//! `pleio publish`: a table's stored rows uploaded to Redis.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pleio::remote::store::DEFAULT_BUCKET_BYTES;
use pleio::remote::PublishOptions;
use serde_json::json;

use crate::output::human_bytes;

/// Upload a table's stored rows (still encoded: IQ4_NL, FP8, MLX 4-bit...)
/// to a Redis Cluster or one Redis server, where `Table::open`,
/// `pleio.open` and the C ABI read them as `redis://HOST:PORT/NAME`,
/// decoded exactly as from the file.
///
/// Rows go in bucket strings of consecutive rows, each row followed by a
/// 4-byte check of the table, the row id and its bytes. The manifest
/// (geometry, encoding, scales, row-id parameters, fingerprints) is
/// written once every bucket is in, and the name moves to the new table
/// last, in one `SET`: readers never see a half-published table.
/// Interrupted, the same command resumes: the table's id comes from its
/// geometry and its files' sizes and times, and buckets already uploaded
/// are skipped. Details: docs/remote.md.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (or any shard of a split set), or a safetensors
    /// checkpoint: its directory, index, one file, or a ple-store.json.
    file: PathBuf,
    /// Where to: redis://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/NAME
    /// (the password may come from PLEIO_REDIS_PASSWORD instead), or
    /// rediss://...?tls_ca=PATH[&tls_cert=PATH&tls_key=PATH] over TLS.
    url: String,
    #[command(flatten)]
    layer: crate::table_args::LayerArg,
    /// Tensor to publish instead of the PLE table (GGUF files).
    #[arg(long)]
    tensor: Option<String>,
    /// Bytes per bucket string (rows per bucket: this over row bytes + 4).
    #[arg(long, default_value_t = DEFAULT_BUCKET_BYTES)]
    bucket_bytes: u64,
    /// Read back every bucket an earlier run uploaded and compare its
    /// fingerprint (by default only its length is checked); changed ones
    /// are uploaded again.
    #[arg(long)]
    verify: bool,
    /// Buckets uploading at once (1 to 64; 1: one after another). More
    /// overlap the round trips to a distant cluster and spread the work
    /// over its nodes.
    #[arg(long, default_value_t = pleio::remote::store::DEFAULT_IN_FLIGHT)]
    in_flight: usize,
    /// Upload only part K of N (0-based; e.g. 0/4 ... 3/4 in four
    /// processes, on one machine or several): the K-th of N contiguous
    /// ranges of buckets. Whichever part finds every bucket in when its
    /// own are done writes the manifest and moves the name; the table is
    /// invisible until then. Each part resumes like a whole publish.
    #[arg(long, value_name = "K/N", value_parser = parse_part)]
    part: Option<(u64, u64)>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_part(s: &str) -> Result<(u64, u64), String> {
    let most = pleio::remote::store::MAX_PARTS;
    let bad =
        || format!("{s:?}: give K/N, part K (0-based) of N, with 0 <= K < N <= {most}, e.g. 0/4");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n) = (
        k.trim().parse::<u64>().map_err(|_| bad())?,
        n.trim().parse::<u64>().map_err(|_| bad())?,
    );
    if n == 0 || n > most || k >= n {
        return Err(bad());
    }
    Ok((k, n))
}

pub fn run(a: Args) -> Result<()> {
    crate::table_args::files_only(&a.file, "publish")?;
    if a.bucket_bytes == 0 || a.bucket_bytes > 256 << 20 {
        anyhow::bail!("--bucket-bytes {}: give 1 to 268435456", a.bucket_bytes);
    }
    let most = pleio::remote::store::MAX_IN_FLIGHT;
    if a.in_flight == 0 || a.in_flight > most {
        anyhow::bail!("--in-flight {}: give 1 to {most}", a.in_flight);
    }
    let table = a.layer.open(&a.file, a.tensor.as_deref())?;
    let mut last = Instant::now();
    let show = !a.json;
    let progress = |done: u64, total: u64| {
        if show && (last.elapsed() >= Duration::from_secs(1) || done == total) {
            last = Instant::now();
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\rpublish: {done}/{total} buckets");
            if done == total {
                let _ = writeln!(e);
            }
        }
    };
    let p = table
        .publish(
            &a.url,
            &a.file.display().to_string(),
            &PublishOptions {
                bucket_bytes: a.bucket_bytes,
                verify: a.verify,
                in_flight: a.in_flight,
                part: a.part,
            },
            progress,
        )
        .with_context(|| {
            format!(
                "publishing {} to {}",
                a.file.display(),
                pleio::remote::url::redact(&a.url)
            )
        })?;
    if a.json {
        let j = json!({
            "run": crate::report::run_json(),
            "file": a.file,
            "table": table.name(),
            "type": table.type_name(),
            "published": p,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else if !p.complete {
        println!(
            "part {} of {} ({}, {} rows): its {} buckets are in ({} uploaded now, {} of them repaired; {}), {:.1} s; {} buckets of the other parts are not in yet: the last part to finish publishes the table as {:?} (table {})",
            p.part.as_deref().unwrap_or("?"),
            table.name(),
            table.type_name(),
            table.rows(),
            p.part_buckets,
            p.uploaded,
            p.repaired,
            human_bytes(p.bytes),
            p.seconds,
            p.missing,
            p.name,
            p.id,
        );
    } else {
        println!(
            "published {} ({}, {} rows) as {:?}: table {}, {} buckets ({} uploaded now, {} of them repaired; {}), {} in Redis, {:.1} s, fingerprint {}",
            table.name(),
            table.type_name(),
            table.rows(),
            p.name,
            p.id,
            p.buckets,
            p.uploaded,
            p.repaired,
            human_bytes(p.bytes),
            human_bytes(p.table_bytes),
            p.seconds,
            p.fingerprint
        );
    }
    Ok(())
}
