//! A table's rows in Redis: the layout of the keys, publishing, and
//! reading a batch.
//!
//! Keys (no `{hash tags}`, so buckets spread over every slot):
//!
//! - `pleio:alias:NAME`: the id of the table published as NAME;
//! - `pleio:t:ID:manifest`: the manifest (JSON: geometry, row format,
//!   scales, row-id parameters, the source, the fingerprint), written
//!   only once every bucket is in;
//! - `pleio:t:ID:bB`: bucket B, the records of rows `B * rows_per_bucket`
//!   on, back to back; a record is the row's stored bytes (as the file
//!   holds them, still encoded) then a 4-byte check of the table's id, the
//!   row id and those bytes;
//! - `pleio:t:ID:done`: a hash bucket -> its fingerprint, what a resumed
//!   publish skips.
//!
//! ID is a hash of the manifest's geometry and the source files' sizes and
//! modification times: publishing the same unchanged table again resumes
//! or finds it done; a changed table gets a new id. The alias moves to a
//! table (one `SET`) only after its manifest is written, so a reader never
//! sees a half-published table.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::client::{Client, NumberedKeys, Range};
use super::resp::Reply;
use super::url::RedisUrl;
use super::RemoteError;
use crate::layout::{Layout, RowFormat, Shard, ShardPart};
use crate::ngram::{Gemma4Rows, ModelRows, QwenNgramParams};
use crate::quant::encoding::{Encoding, Fp8Scale, ScaleType};
use crate::quant::GgmlType;

/// The manifest's `format`.
const FORMAT: &str = "pleio-redis-table";
/// The manifest's `version` this build reads and writes.
const VERSION: u32 = 1;
/// Bytes of a record's check.
pub const CHECK_BYTES: u64 = 4;
/// The widest row a manifest may describe (elements).
const MAX_ROW_ELEMS: u64 = 1 << 24;
/// The largest stored row a manifest may describe (bytes).
const MAX_ROW_BYTES: u64 = 1 << 28;
/// The largest bucket: Redis's string limit.
pub const MAX_BUCKET_BYTES: u64 = 512 << 20;
/// The default bucket size (see docs/remote.md for the measurement).
pub const DEFAULT_BUCKET_BYTES: u64 = 256 << 10;
/// Buckets [`publish`] uploads at once by default.
pub const DEFAULT_IN_FLIGHT: usize = 4;
/// The most buckets [`publish`] uploads at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// How the rows are stored, as the manifest says it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FormatDesc {
    /// A ggml block type, by ggml's number.
    Ggml {
        /// `ggml_type`.
        type_id: u32,
    },
    /// bfloat16 elements.
    Bf16,
    /// IEEE half elements.
    F16,
    /// IEEE single elements.
    F32,
    /// FP8 E4M3 with one table scale (its f32 bits).
    Fp8Tensor {
        /// `f32::to_bits` of the scale.
        scale_bits: u32,
    },
    /// FP8 E4M3 with a scale per row, stored after the row.
    Fp8Row {
        /// `bf16`, `f16` or `f32`.
        scale: String,
    },
    /// NVFP4 with its global scale (f32 bits).
    Nvfp4 {
        /// `f32::to_bits` of `weight_scale_2`.
        global_scale_bits: u32,
    },
    /// MLX affine 4-bit.
    Mlx4,
}

fn scale_name(s: ScaleType) -> &'static str {
    match s {
        ScaleType::Bf16 => "bf16",
        ScaleType::F16 => "f16",
        ScaleType::F32 => "f32",
    }
}

impl FormatDesc {
    fn of(f: RowFormat) -> FormatDesc {
        match f {
            RowFormat::Ggml(t) => FormatDesc::Ggml { type_id: t.id() },
            RowFormat::Encoded(e) => match e {
                Encoding::Bf16 => FormatDesc::Bf16,
                Encoding::F16 => FormatDesc::F16,
                Encoding::F32 => FormatDesc::F32,
                Encoding::Fp8(Fp8Scale::PerTensor(s)) => FormatDesc::Fp8Tensor {
                    scale_bits: s.to_bits(),
                },
                Encoding::Fp8(Fp8Scale::PerRow(s)) => FormatDesc::Fp8Row {
                    scale: scale_name(s).into(),
                },
                Encoding::Nvfp4 { global_scale } => FormatDesc::Nvfp4 {
                    global_scale_bits: global_scale.to_bits(),
                },
                Encoding::Mlx4 => FormatDesc::Mlx4,
            },
        }
    }

    fn format(&self) -> Option<RowFormat> {
        Some(match self {
            FormatDesc::Ggml { type_id } => RowFormat::Ggml(GgmlType::from_id(*type_id)?),
            FormatDesc::Bf16 => RowFormat::Encoded(Encoding::Bf16),
            FormatDesc::F16 => RowFormat::Encoded(Encoding::F16),
            FormatDesc::F32 => RowFormat::Encoded(Encoding::F32),
            FormatDesc::Fp8Tensor { scale_bits } => RowFormat::Encoded(Encoding::Fp8(
                Fp8Scale::PerTensor(f32::from_bits(*scale_bits)),
            )),
            FormatDesc::Fp8Row { scale } => {
                let s = match scale.as_str() {
                    "bf16" => ScaleType::Bf16,
                    "f16" => ScaleType::F16,
                    "f32" => ScaleType::F32,
                    _ => return None,
                };
                RowFormat::Encoded(Encoding::Fp8(Fp8Scale::PerRow(s)))
            }
            FormatDesc::Nvfp4 { global_scale_bits } => RowFormat::Encoded(Encoding::Nvfp4 {
                global_scale: f32::from_bits(*global_scale_bits),
            }),
            FormatDesc::Mlx4 => RowFormat::Encoded(Encoding::Mlx4),
        })
    }
}

/// How token ids become row ids, as the manifest says it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RowIdsDesc {
    /// qwen4exp's n-gram hash.
    Qwen {
        /// n-gram order.
        ngram_size: u32,
        /// Heads per order.
        heads_per_ngram: u32,
        /// EOS token.
        eos_token_id: u32,
        /// Image token, if any.
        image_token_id: Option<u32>,
        /// Per-order multipliers.
        multipliers: Vec<u64>,
        /// Rows of each head.
        head_vocab_sizes: Vec<u64>,
        /// First row of each head.
        head_offsets: Vec<u64>,
    },
    /// gemma4: the token is the row.
    Gemma4,
}

/// What a published table is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `pleio-redis-table`.
    pub format: String,
    /// The layout version.
    pub version: u32,
    /// The table's id (its keys' infix).
    pub id: String,
    /// The tensor name.
    pub name: String,
    /// Where it was published from.
    pub source: String,
    /// Row format.
    pub row_format: FormatDesc,
    /// Elements per row.
    pub row_elems: u64,
    /// Rows.
    pub rows: u64,
    /// Stored bytes per row.
    pub row_bytes: u64,
    /// Rows per bucket.
    pub rows_per_bucket: u64,
    /// Buckets.
    pub buckets: u64,
    /// Token ids to row ids (`None`: the source had no mapping).
    pub row_ids: Option<RowIdsDesc>,
    /// The model's PLE layers (0-based), as the source reported them.
    pub ple_layers: Vec<u64>,
    /// The layer this table is, as the source reported it.
    pub layer: Option<u64>,
    /// A hash over every bucket's fingerprint, in order (hex).
    pub fingerprint: String,
}

impl Manifest {
    /// Bytes of one record (row plus check).
    pub fn record_bytes(&self) -> u64 {
        self.row_bytes + CHECK_BYTES
    }

    /// The rows' format, if this pleio knows it.
    pub fn format(&self) -> Option<RowFormat> {
        self.row_format.format()
    }

    /// Rows in bucket `b` (the last may be short; 0 past the end).
    pub fn bucket_rows(&self, b: u64) -> u64 {
        let first = b.saturating_mul(self.rows_per_bucket);
        self.rows_per_bucket.min(self.rows.saturating_sub(first))
    }

    /// The key of bucket `b`.
    pub fn bucket_key(&self, b: u64) -> String {
        format!("{}{b}", self.bucket_prefix())
    }

    /// What every bucket key starts with (its number follows).
    fn bucket_prefix(&self) -> String {
        format!("pleio:t:{}:b", self.id)
    }

    /// The seed of the row checks (from the id).
    fn seed(&self) -> u64 {
        u64::from_str_radix(&self.id, 16).unwrap_or(0)
    }

    /// The layout of the rows (one virtual file of records), after checking
    /// that the geometry is consistent.
    pub fn layout(&self) -> Result<Layout, RemoteError> {
        let bad = |what: String| RemoteError::Manifest {
            key: manifest_key(&self.id),
            what,
        };
        if self.format != FORMAT || self.version != VERSION {
            return Err(bad(format!(
                "format {:?} version {} (this pleio reads {FORMAT:?} version {VERSION}; publish again)",
                self.format, self.version
            )));
        }
        let format = self
            .row_format
            .format()
            .ok_or_else(|| bad(format!("unknown row format {:?}", self.row_format)))?;
        // Bounds first, so the arithmetic below and in reads cannot overflow.
        if self.row_elems == 0 || self.row_elems > MAX_ROW_ELEMS || self.row_bytes > MAX_ROW_BYTES {
            return Err(bad(format!(
                "rows of {} elements, {} bytes (at most {MAX_ROW_ELEMS} and {MAX_ROW_BYTES})",
                self.row_elems, self.row_bytes
            )));
        }
        let bucket = self.rows_per_bucket.checked_mul(self.record_bytes());
        if bucket.is_none_or(|b| b > MAX_BUCKET_BYTES) {
            return Err(bad(format!(
                "buckets of {} rows of {} bytes exceed Redis's 512 MiB strings",
                self.rows_per_bucket,
                self.record_bytes()
            )));
        }
        let want = self.rows.div_ceil(self.rows_per_bucket.max(1));
        if self.rows_per_bucket == 0 || self.buckets != want {
            return Err(bad(format!(
                "{} buckets of {} rows for {} rows",
                self.buckets, self.rows_per_bucket, self.rows
            )));
        }
        if let RowFormat::Encoded(e) = format {
            let elems = usize::try_from(self.row_elems).unwrap_or(usize::MAX);
            let need = e.part_bytes(elems).map_err(|err| bad(err.to_string()))?.total();
            if need as u64 != self.row_bytes {
                return Err(bad(format!(
                    "{} bytes per row; {} rows of {} elements take {need}",
                    self.row_bytes,
                    format.name(),
                    self.row_elems
                )));
            }
        }
        let layout = match format {
            RowFormat::Ggml(t) => {
                Layout::new(&self.name, t, &[self.row_elems, self.rows], 0, 0).map_err(|e| bad(e.to_string()))?
            }
            RowFormat::Encoded(e) => Layout::encoded(
                self.name.clone(),
                e,
                self.row_elems,
                self.rows,
                self.row_bytes,
                vec![Shard {
                    index: 0,
                    row_start: 0,
                    rows: self.rows,
                    parts: vec![ShardPart {
                        tensor: self.name.clone(),
                        file: 0,
                        offset: 0,
                        row_bytes: self.row_bytes,
                    }],
                }],
            )
            .map_err(|e| bad(e.to_string()))?,
        };
        if layout.row_bytes() != self.row_bytes {
            return Err(bad(format!(
                "{} bytes per row; {} rows of {} elements take {}",
                self.row_bytes,
                format.name(),
                self.row_elems,
                layout.row_bytes()
            )));
        }
        Ok(layout)
    }

    /// The row-id mapping.
    pub fn row_ids(&self) -> Result<Option<ModelRows>, RemoteError> {
        Ok(match &self.row_ids {
            None => None,
            Some(RowIdsDesc::Gemma4) => Some(ModelRows::Gemma(Gemma4Rows::new(self.rows))),
            Some(RowIdsDesc::Qwen {
                ngram_size,
                heads_per_ngram,
                eos_token_id,
                image_token_id,
                multipliers,
                head_vocab_sizes,
                head_offsets,
            }) => Some(ModelRows::Qwen(
                QwenNgramParams::new(
                    *ngram_size,
                    *heads_per_ngram,
                    *eos_token_id,
                    *image_token_id,
                    multipliers.clone(),
                    head_vocab_sizes.clone(),
                    head_offsets.clone(),
                    self.rows,
                )
                .map_err(|e| RemoteError::Manifest {
                    key: manifest_key(&self.id),
                    what: e.to_string(),
                })?,
            )),
        })
    }
}

fn manifest_key(id: &str) -> String {
    format!("pleio:t:{id}:manifest")
}

fn done_key(id: &str) -> String {
    format!("pleio:t:{id}:done")
}

fn alias_key(name: &str) -> String {
    format!("pleio:alias:{name}")
}

/// A 64-bit hash with every step invertible (so one changed word always
/// changes it), seeded.
fn hash64(seed: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    const M: u64 = 0xBF58_476D_1CE4_E5B9;
    let mut h = seed ^ K;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        h = (h ^ w).wrapping_mul(M);
        h ^= h >> 29;
    }
    let mut tail = [0u8; 8];
    let rest = words.remainder();
    tail[..rest.len()].copy_from_slice(rest);
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(M);
    h ^= bytes.len() as u64;
    // splitmix64's finaliser
    h = (h ^ (h >> 30)).wrapping_mul(M);
    h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// The check stored after row `row`'s bytes.
fn row_check(seed: u64, row: u64, bytes: &[u8]) -> [u8; 4] {
    let h = hash64(seed ^ row.wrapping_mul(0xD6E8_FEB8_6659_FD93), bytes);
    ((h ^ (h >> 32)) as u32).to_le_bytes()
}

/// A published table, open for reading.
pub struct RemoteTable {
    client: Client,
    manifest: Manifest,
    /// The bucket keys ([`Manifest::bucket_key`]).
    keys: NumberedKeys,
}

impl RemoteTable {
    /// Opens the table `url` names: follows its alias to the id, reads and
    /// checks the manifest.
    pub fn open(url: &str) -> Result<RemoteTable, RemoteError> {
        let url = RedisUrl::parse(url)?;
        if url.name.is_empty() {
            return Err(RemoteError::Url {
                url: url.to_string(),
                what: "no table name: give redis://HOST:PORT/NAME".into(),
            });
        }
        let client = Client::connect(url)?;
        let name = client.url().name.clone();
        let akey = alias_key(&name);
        let id = match client.call(&akey, &[b"GET", akey.as_bytes()])? {
            Reply::Bulk(Some(id)) => String::from_utf8_lossy(&id).into_owned(),
            Reply::Bulk(None) => return Err(RemoteError::NoTable { name, key: akey }),
            other => {
                return Err(RemoteError::Manifest {
                    key: akey,
                    what: format!("the alias is {}", other.describe()),
                })
            }
        };
        let mkey = manifest_key(&id);
        let manifest = match client.call(&mkey, &[b"GET", mkey.as_bytes()])? {
            Reply::Bulk(Some(json)) => {
                serde_json::from_slice::<Manifest>(&json).map_err(|e| RemoteError::Manifest {
                    key: mkey.clone(),
                    what: e.to_string(),
                })?
            }
            other => {
                return Err(RemoteError::Manifest {
                    key: mkey,
                    what: format!("the alias {name:?} names table {id}, whose manifest is {}", other.describe()),
                })
            }
        };
        if manifest.id != id {
            return Err(RemoteError::Manifest {
                key: mkey,
                what: format!("it names table {}, not {id}", manifest.id),
            });
        }
        manifest.layout()?;
        let keys = NumberedKeys::new(manifest.bucket_prefix());
        Ok(RemoteTable {
            client,
            manifest,
            keys,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The address (without the password).
    pub fn url(&self) -> &RedisUrl {
        self.client.url()
    }

    /// Reads the stored bytes of `rows` (ascending, distinct, each below
    /// the row count) in one pipelined round per node (consecutive rows of
    /// a bucket in one `GETRANGE`), checks every row, and only then hands
    /// each to `each` with its index in `rows`. Returns the bytes read.
    pub fn read(
        &self,
        rows: &[u64],
        each: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<u64, RemoteError> {
        self.read_then(rows, &mut || {}, each)
    }

    /// [`RemoteTable::read`], calling `during` once while the requests are
    /// on their way (see [`Client::get_ranges_then`]), before any row is
    /// handed to `each`.
    pub(crate) fn read_then(
        &self,
        rows: &[u64],
        during: &mut dyn FnMut(),
        each: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<u64, RemoteError> {
        thread_local! {
            /// The last batch's record buffer, kept for the next (a fresh
            /// one of 290 KB a batch came from `mmap` and its pages were
            /// zeroed every time).
            static RECORDS: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
        }
        let mut records = RECORDS.with(std::cell::Cell::take);
        let read = self.read_into(rows, &mut records, during, each);
        // A huge batch's buffer is not kept for the thread's life.
        if records.capacity() <= KEPT_RECORDS {
            RECORDS.with(|c| c.set(records));
        }
        read
    }

    /// [`RemoteTable::read`] with `records` as the buffer of the rows'
    /// records (resized here).
    fn read_into(
        &self,
        rows: &[u64],
        records: &mut Vec<u8>,
        during: &mut dyn FnMut(),
        each: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<u64, RemoteError> {
        let m = &self.manifest;
        let (rb, rec) = (m.row_bytes as usize, m.record_bytes() as usize);
        records.clear();
        records.resize(rows.len() * rec, 0);
        let mut ranges: Vec<Range> = Vec::new();
        let mut prev: Option<u64> = None;
        for (k, &row) in rows.iter().enumerate() {
            let b = row / m.rows_per_bucket;
            let within = (row % m.rows_per_bucket) * rec as u64;
            let extends = prev.is_some_and(|p| p + 1 == row && p / m.rows_per_bucket == b);
            match ranges.last_mut() {
                Some(last) if extends => last.len += rec,
                _ => ranges.push(Range {
                    key: b,
                    start: within,
                    len: rec,
                    at: k * rec,
                }),
            }
            prev = Some(row);
        }
        self.client
            .get_ranges_then(&self.keys, &ranges, records, during)?;
        let seed = m.seed();
        for (&row, r) in rows.iter().zip(records.chunks_exact(rec)) {
            let (bytes, check) = r.split_at(rb);
            if row_check(seed, row, bytes) != check {
                return Err(RemoteError::Corrupt {
                    key: m.bucket_key(row / m.rows_per_bucket),
                    row,
                    table: m.id.clone(),
                });
            }
        }
        for (k, r) in records.chunks_exact(rec).enumerate() {
            each(k, &r[..rb]);
        }
        Ok(records.len() as u64)
    }
}

/// The largest record buffer a thread keeps between batches
/// ([`RemoteTable::read`]): 16 MiB, about 100,000 FP8 rows.
const KEPT_RECORDS: usize = 16 << 20;

/// What [`publish`] did.
#[derive(Debug, Clone, Serialize)]
pub struct Published {
    /// The table's id.
    pub id: String,
    /// The name (alias) it is published under.
    pub name: String,
    /// Buckets in all.
    pub buckets: u64,
    /// This run's part, `"k/n"` (see [`PublishOptions::part`]).
    pub part: Option<String>,
    /// The buckets of this run's part (all of them without a part).
    pub part_buckets: u64,
    /// Every bucket is in and the table is published under its name;
    /// false while other parts are still uploading theirs.
    pub complete: bool,
    /// Buckets of other parts not in yet (0 when `complete`).
    pub missing: u64,
    /// Buckets uploaded by this run (the rest were there from an earlier one).
    pub uploaded: u64,
    /// Bytes uploaded by this run.
    pub bytes: u64,
    /// Buckets an earlier run recorded as done that were missing, short
    /// (or, with `verify`, changed) and were uploaded again.
    pub repaired: u64,
    /// Bytes of every bucket (the table's rows plus checks).
    pub table_bytes: u64,
    /// Seconds taken.
    pub seconds: f64,
    /// The manifest's fingerprint.
    pub fingerprint: String,
}

/// The source of a publish: the table's geometry and a way to read rows'
/// stored bytes.
pub struct Source<'a> {
    /// The layout.
    pub layout: &'a Layout,
    /// Where it is (for the manifest and the id: sizes and times of these files).
    pub files: Vec<std::path::PathBuf>,
    /// Shown in the manifest.
    pub source: String,
    /// Row ids.
    pub row_ids: Option<&'a ModelRows>,
    /// PLE layers.
    pub ple_layers: Vec<u64>,
    /// This table's layer.
    pub layer: Option<u64>,
}

fn row_ids_desc(r: &ModelRows) -> RowIdsDesc {
    match r {
        ModelRows::Gemma(_) => RowIdsDesc::Gemma4,
        ModelRows::Qwen(p) => RowIdsDesc::Qwen {
            ngram_size: p.ngram_size() as u32,
            heads_per_ngram: p.heads_per_ngram() as u32,
            eos_token_id: p.eos_token_id(),
            image_token_id: p.image_token_id(),
            multipliers: p.multipliers().to_vec(),
            head_vocab_sizes: p.head_vocab_sizes().to_vec(),
            head_offsets: p.head_offsets().to_vec(),
        },
    }
}

/// How [`publish`] uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishOptions {
    /// Bytes per bucket string (rows per bucket: this over row bytes + 4).
    pub bucket_bytes: u64,
    /// Read back every bucket an earlier run recorded as done and compare
    /// its fingerprint (without: its length only, `STRLEN`).
    pub verify: bool,
    /// Buckets uploading at once (1 to 64; 1: one after another), so the
    /// round trips of one node and the work of several overlap.
    pub in_flight: usize,
    /// `Some((k, n))`: upload only part `k` of `n` (0-based), the `k`-th
    /// of `n` contiguous, near-equal ranges of buckets, so `n` processes
    /// (on one machine or several) publish one table together. Whichever
    /// finds every bucket in when its own part is done writes the manifest
    /// and moves the name; until then the table is not visible.
    pub part: Option<(u64, u64)>,
}

/// The most parts [`PublishOptions::part`] may split a table into.
pub const MAX_PARTS: u64 = 65_536;

impl Default for PublishOptions {
    fn default() -> Self {
        PublishOptions {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            verify: false,
            in_flight: DEFAULT_IN_FLIGHT,
            part: None,
        }
    }
}

/// Uploads `src` to the cluster at `url` under `url`'s name: the buckets
/// not yet there, then the manifest, then the alias. A bucket an earlier
/// run recorded as done is kept when its length (with `verify`, its
/// fingerprint) is right, and uploaded again otherwise.
/// `read_rows(first, n, out)` fills `out` with the stored bytes of rows
/// `first..first + n`; `progress(done, total)` is called after each bucket.
pub fn publish(
    src: &Source<'_>,
    url: &str,
    opts: &PublishOptions,
    mut read_rows: impl FnMut(u64, u64, &mut [u8]) -> Result<(), crate::Error>,
    mut progress: impl FnMut(u64, u64),
) -> Result<Published, crate::Error> {
    let started = Instant::now();
    let url = RedisUrl::parse(url)?;
    if url.name.is_empty() {
        return Err(RemoteError::Url {
            url: url.to_string(),
            what: "no table name: give redis://HOST:PORT/NAME".into(),
        }
        .into());
    }
    let name = url.name.clone();
    let l = src.layout;
    let rec = l.row_bytes() + CHECK_BYTES;
    let rows_per_bucket = (opts.bucket_bytes / rec).max(1);
    let mut m = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        id: String::new(),
        name: l.name().to_string(),
        source: src.source.clone(),
        row_format: FormatDesc::of(l.ty()),
        row_elems: l.row_elems(),
        rows: l.rows(),
        row_bytes: l.row_bytes(),
        rows_per_bucket,
        buckets: l.rows().div_ceil(rows_per_bucket),
        row_ids: src.row_ids.map(row_ids_desc),
        ple_layers: src.ple_layers.clone(),
        layer: src.layer,
        fingerprint: String::new(),
    };
    // The id: the geometry and the source files' sizes and times.
    let mut identity = serde_json::to_vec(&m).unwrap_or_default();
    for f in &src.files {
        let meta = std::fs::metadata(f).map_err(|e| crate::Error::new(crate::ErrorKind::Io, e).in_file(f))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        identity.extend_from_slice(format!("{}|{}|{mtime}\n", f.display(), meta.len()).as_bytes());
    }
    m.id = format!("{:016x}", hash64(0x706c_6569_6f00_0001, &identity));
    let mine = part_range(opts.part, m.buckets).map_err(|what| RemoteError::Url {
        url: url.to_string(),
        what,
    })?;
    let client = Client::connect(url)?;
    let (dkey, mkey) = (done_key(&m.id), manifest_key(&m.id));
    // Buckets an earlier run (or another part) finished.
    let mut done: Vec<Option<u64>> = vec![None; m.buckets as usize];
    read_done(&client, &dkey, &mut done)?;
    let seed = m.seed();
    let total = m.buckets;
    let workers = opts.in_flight.clamp(1, MAX_IN_FLIGHT);
    // Which buckets of this part to upload: those not done, or done but
    // not intact (checked by `in_flight` workers, so the round trips
    // overlap).
    let mut todo: Vec<u64> = mine.clone().filter(|&b| done[b as usize].is_none()).collect();
    let checks: Vec<(u64, u64)> = mine.clone().filter_map(|b| Some((b, done[b as usize]?))).collect();
    let part_total = mine.end - mine.start;
    let intact = |b: u64, f: u64| -> Result<bool, RemoteError> {
        let key = m.bucket_key(b);
        let len = (m.bucket_rows(b) * rec) as usize;
        Ok(if opts.verify {
            match client.call(&key, &[b"GET".as_slice(), key.as_bytes()])? {
                Reply::Bulk(Some(v)) => v.len() == len && hash64(seed ^ b, &v) == f,
                _ => false,
            }
        } else {
            client.call(&key, &[b"STRLEN".as_slice(), key.as_bytes()])?.int() == Some(len as i64)
        })
    };
    let mut repaired = 0u64;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (check_tx, check_rx) = std::sync::mpsc::channel();
    let mut check_failed: Option<RemoteError> = None;
    std::thread::scope(|scope| {
        for _ in 0..workers.min(checks.len()) {
            let (next, checks, intact, tx) = (&next, &checks, &intact, check_tx.clone());
            scope.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(b, f)) = checks.get(i) else { break };
                let r = intact(b, f);
                let failed = r.is_err();
                if tx.send((b, r)).is_err() || failed {
                    // Past the end: the other workers stop at their next bucket.
                    next.store(checks.len(), std::sync::atomic::Ordering::Relaxed);
                    break;
                }
            });
        }
        drop(check_tx);
        let mut checked = 0u64;
        for (b, r) in check_rx {
            match r {
                Ok(true) => {
                    checked += 1;
                    progress(checked, part_total);
                }
                Ok(false) => {
                    repaired += 1;
                    todo.push(b);
                }
                Err(e) => {
                    check_failed.get_or_insert(e);
                }
            }
        }
    });
    if let Some(e) = check_failed {
        return Err(e.into());
    }
    todo.sort_unstable();
    let kept = part_total - todo.len() as u64;
    // Read each bucket here, in order; `in_flight` workers upload them
    // (SET, then HSET into the done hash), so the buckets of several
    // nodes and their round trips overlap.
    let (mut uploaded, mut bytes) = (0u64, 0u64);
    let upload = |b: u64, bucket: Vec<u8>, f: u64| -> Result<u64, RemoteError> {
        let key = m.bucket_key(b);
        expect_ok(&key, client.call(&key, &[b"SET", key.as_bytes(), &bucket])?)?;
        let (field, fhex) = (b.to_string(), format!("{f:016x}"));
        client.call(&dkey, &[b"HSET", dkey.as_bytes(), field.as_bytes(), fhex.as_bytes()])?;
        Ok(bucket.len() as u64)
    };
    let mut failed: Option<crate::Error> = None;
    let (work_tx, work_rx) = std::sync::mpsc::sync_channel::<(u64, Vec<u8>, u64)>(workers);
    let work_rx = std::sync::Mutex::new(work_rx);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // After a failure the workers still take (and drop) what was queued,
    // so the reader never waits on a full queue nobody empties.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (work_rx, done_tx, upload, stop) = (&work_rx, done_tx.clone(), &upload, &stop);
            scope.spawn(move || loop {
                let next = work_rx.lock().ok().and_then(|rx| rx.recv().ok());
                let Some((b, bucket, f)) = next else { break };
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    continue;
                }
                let r = upload(b, bucket, f).map(|n| (b, f, n));
                if r.is_err() {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                let _ = done_tx.send(r);
            });
        }
        drop(done_tx);
        let mut finished = |r: Result<(u64, u64, u64), RemoteError>, failed: &mut Option<crate::Error>| match r {
            Ok((b, f, n)) => {
                done[b as usize] = Some(f);
                uploaded += 1;
                bytes += n;
                progress(kept + uploaded, part_total);
            }
            Err(e) => {
                failed.get_or_insert(e.into());
            }
        };
        let mut stored = Vec::new();
        for &b in &todo {
            while let Ok(r) = done_rx.try_recv() {
                finished(r, &mut failed);
            }
            if failed.is_some() {
                break;
            }
            let (first, n) = (b * rows_per_bucket, m.bucket_rows(b));
            stored.resize((n * l.row_bytes()) as usize, 0);
            if let Err(e) = read_rows(first, n, &mut stored) {
                failed = Some(e);
                break;
            }
            let mut bucket = Vec::with_capacity((n * rec) as usize);
            for (k, row) in stored.chunks_exact(l.row_bytes() as usize).enumerate() {
                bucket.extend_from_slice(row);
                bucket.extend_from_slice(&row_check(seed, first + k as u64, row));
            }
            let f = hash64(seed ^ b, &bucket);
            if work_tx.send((b, bucket, f)).is_err() {
                break;
            }
        }
        // The workers finish what they took, then see the channel closed.
        drop(work_tx);
        for r in done_rx {
            finished(r, &mut failed);
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    let part = opts.part.map(|(k, n)| format!("{k}/{n}"));
    if opts.part.is_some() {
        // The other parts' buckets: the last part to finish sees them all
        // (each part records its buckets before it looks). A count first,
        // so the parts that are not last do not read the whole hash.
        let recorded = count_done(&client, &dkey)?;
        let missing = if recorded < total {
            total - recorded
        } else {
            read_done(&client, &dkey, &mut done)?;
            done.iter().filter(|f| f.is_none()).count() as u64
        };
        if missing > 0 {
            return Ok(Published {
                id: m.id.clone(),
                name,
                buckets: total,
                part,
                part_buckets: part_total,
                complete: false,
                missing,
                uploaded,
                bytes,
                repaired,
                table_bytes: m.rows * rec,
                seconds: started.elapsed().as_secs_f64(),
                fingerprint: String::new(),
            });
        }
    }
    let mut all = Vec::with_capacity(done.len() * 8);
    for f in &done {
        all.extend_from_slice(&f.unwrap_or(0).to_le_bytes());
    }
    m.fingerprint = format!("{:016x}", hash64(seed, &all));
    let json = serde_json::to_vec(&m).map_err(|e| RemoteError::Manifest {
        key: mkey.clone(),
        what: e.to_string(),
    })?;
    expect_ok(&mkey, client.call(&mkey, &[b"SET", mkey.as_bytes(), &json])?)?;
    let akey = alias_key(&name);
    expect_ok(&akey, client.call(&akey, &[b"SET", akey.as_bytes(), m.id.as_bytes()])?)?;
    Ok(Published {
        id: m.id.clone(),
        name,
        buckets: total,
        part,
        part_buckets: part_total,
        complete: true,
        missing: 0,
        uploaded,
        bytes,
        repaired,
        table_bytes: m.rows * rec,
        seconds: started.elapsed().as_secs_f64(),
        fingerprint: m.fingerprint,
    })
}

/// Fields asked for per `HMGET` of the done hash: a reply of this many
/// elements stays far below what the parser accepts, whatever the bucket
/// count (a 54 GB table in 32 KiB buckets has 1.7 million).
const DONE_CHUNK: usize = 16_384;

/// Adds the buckets the done hash `dkey` records (with their fingerprints)
/// to `done`, `DONE_CHUNK` buckets per round trip.
fn read_done(client: &Client, dkey: &str, done: &mut [Option<u64>]) -> Result<(), RemoteError> {
    let mut names: Vec<Vec<u8>> = Vec::with_capacity(DONE_CHUNK);
    for (c, chunk) in done.chunks_mut(DONE_CHUNK).enumerate() {
        let first = c * DONE_CHUNK;
        names.clear();
        names.extend((first..first + chunk.len()).map(|b| b.to_string().into_bytes()));
        let mut args: Vec<&[u8]> = Vec::with_capacity(names.len() + 2);
        args.push(b"HMGET");
        args.push(dkey.as_bytes());
        args.extend(names.iter().map(Vec::as_slice));
        let reply = client.call(dkey, &args)?;
        let items = match reply.array() {
            Some(items) if items.len() == chunk.len() => items,
            _ => {
                return Err(RemoteError::Refused {
                    key: dkey.to_string(),
                    reply: format!("{} to HMGET of {} fields", reply.describe(), chunk.len()),
                })
            }
        };
        for (slot, item) in chunk.iter_mut().zip(items) {
            let f = item.bytes().and_then(|f| u64::from_str_radix(std::str::from_utf8(f).ok()?, 16).ok());
            if f.is_some() {
                *slot = f;
            }
        }
    }
    Ok(())
}

/// How many buckets the done hash `dkey` records (`HLEN`: one round trip,
/// whatever the table's size).
fn count_done(client: &Client, dkey: &str) -> Result<u64, RemoteError> {
    let reply = client.call(dkey, &[b"HLEN", dkey.as_bytes()])?;
    reply.int().and_then(|n| u64::try_from(n).ok()).ok_or_else(|| RemoteError::Refused {
        key: dkey.to_string(),
        reply: format!("{} to HLEN", reply.describe()),
    })
}

/// The buckets of `part` (`(k, n)`: the `k`-th of `n` contiguous ranges)
/// among `total`; all of them without a part.
fn part_range(part: Option<(u64, u64)>, total: u64) -> Result<std::ops::Range<u64>, String> {
    let Some((k, n)) = part else { return Ok(0..total) };
    if n == 0 || n > MAX_PARTS || k >= n {
        return Err(format!("part {k}/{n}: give K/N with 0 <= K < N <= {MAX_PARTS}"));
    }
    // u128: k * total cannot overflow.
    let at = |i: u64| (u128::from(i) * u128::from(total) / u128::from(n)) as u64;
    Ok(at(k)..at(k + 1))
}

fn expect_ok(key: &str, r: Reply) -> Result<(), RemoteError> {
    match r {
        Reply::Simple(s) if s == "OK" => Ok(()),
        other => Err(RemoteError::Refused {
            key: key.to_string(),
            reply: other.describe(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_every_bucket_once_in_order() {
        for total in [0u64, 1, 2, 7, 575, 1 << 40] {
            for n in [1u64, 2, 3, 8, 575, MAX_PARTS] {
                let mut next = 0;
                for k in 0..n.min(600) {
                    let r = part_range(Some((k, n)), total).unwrap();
                    assert_eq!(r.start, next, "part {k}/{n} of {total}");
                    assert!(r.end - r.start <= total / n + 1, "near-equal");
                    next = r.end;
                }
                if n <= 600 {
                    assert_eq!(next, total, "{n} parts of {total}");
                }
            }
        }
        assert_eq!(part_range(None, 9).unwrap(), 0..9);
        for bad in [(0, 0), (3, 3), (0, MAX_PARTS + 1)] {
            assert!(part_range(Some(bad), 9).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn row_checks_depend_on_table_row_and_every_byte() {
        let row = vec![7u8; 160];
        let c = row_check(1, 5, &row);
        assert_ne!(c, row_check(2, 5, &row));
        assert_ne!(c, row_check(1, 6, &row));
        for i in 0..row.len() {
            let mut r = row.clone();
            r[i] ^= 1;
            assert_ne!(c, row_check(1, 5, &r), "byte {i}");
        }
    }

    #[test]
    fn the_fuzz_seed_manifests_open_and_broken_ones_are_refused() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/remote_parse");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if !p.to_string_lossy().ends_with(".json") {
                continue;
            }
            let m: Manifest = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            let l = m.layout().unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert_eq!((l.rows(), l.row_bytes()), (m.rows, m.row_bytes));
            m.row_ids().unwrap().unwrap();
            // Every row in exactly one bucket; the last may be short.
            let per: Vec<u64> = (0..m.buckets).map(|b| m.bucket_rows(b)).collect();
            assert_eq!(per.iter().sum::<u64>(), m.rows);
            assert!(per[..per.len() - 1].iter().all(|&r| r == m.rows_per_bucket));
            assert_eq!(m.bucket_rows(m.buckets), 0);
            n += 1;
            for broken in [
                Manifest { row_bytes: m.row_bytes + 1, ..m.clone() },
                Manifest { buckets: m.buckets + 1, ..m.clone() },
                Manifest { rows_per_bucket: 0, ..m.clone() },
                Manifest { rows_per_bucket: u64::MAX / 2, ..m.clone() },
                Manifest { row_elems: u64::MAX, ..m.clone() },
                Manifest { version: 2, ..m.clone() },
            ] {
                assert!(broken.layout().is_err(), "{broken:?}");
            }
        }
        assert_eq!(n, 6);
    }

    #[test]
    fn format_descriptions_round_trip() {
        for f in [
            RowFormat::Ggml(GgmlType::from_id(20).unwrap()),
            RowFormat::Encoded(Encoding::Fp8(Fp8Scale::PerTensor(0.123))),
            RowFormat::Encoded(Encoding::Fp8(Fp8Scale::PerRow(ScaleType::Bf16))),
            RowFormat::Encoded(Encoding::Nvfp4 { global_scale: 3.5 }),
            RowFormat::Encoded(Encoding::Mlx4),
            RowFormat::Encoded(Encoding::Bf16),
        ] {
            let d = FormatDesc::of(f);
            let json = serde_json::to_string(&d).unwrap();
            let back: FormatDesc = serde_json::from_str(&json).unwrap();
            assert_eq!(back.format(), Some(f), "{json}");
        }
    }
}
