//! Replay of a token stream through the PLE stage: prefill ubatches, then
//! decode steps of one token, through any fetch strategy, optionally from a
//! cold page cache and with lookahead, measuring what the stage costs.
//!
//! The stream is one sequence. [`Replayer::plan`] splits it into the prefill
//! tokens (cut into ubatches) and the decode tokens that continue it, and
//! maps every token to its row ids with one [`ModelRows`] sequence, so the
//! n-gram history runs across ubatches and into the decode steps exactly as
//! in one mapping of the whole stream. [`Replayer::run`] gathers them.
//!
//! Decode tokens are the tokens that follow the prefill part of the stream;
//! where the stream ends first, the rest are drawn from the stream itself
//! (uniformly random positions, seeded), which keeps real token frequencies
//! without replaying the prompt's n-grams.
//!
//! Process counters (device bytes read, major faults, peak RSS) come from
//! `/proc/self` on Linux and are `None` elsewhere.
//!
//! [`Replayer::floor`] measures what the device needs for the same plan:
//! each phase's cold extents read with `O_DIRECT` ([`crate::floor`]), the
//! yardstick for a cold replay's gather time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashSet;

use crate::bench::{self, check_memory, BenchError, Evictor, MemoryError};
use crate::floor::{Floor, PhaseFloor};
use crate::random::Rng;
use pleio::cache::CacheCounters;
use pleio::layout::Layout;
use pleio::lookahead::{Lookahead, LookaheadCounters, LookaheadError};
use pleio::model::Model;
use pleio::ngram::{ModelRows, NgramError, RowMapper};
use pleio::sys;
use pleio::{CachePolicy, Error, GatherStats, Strategy, Table};

/// Most tokens one replay plans (prefill and decode together, 4 Mi), and
/// the most the CLI reads from one token stream.
pub const MAX_TOKENS: usize = 1 << 22;

/// Errors from planning or running a replay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The token stream is empty.
    #[error("the token stream is empty")]
    EmptyStream,
    /// A ubatch of zero tokens was asked for.
    #[error("the ubatch size must be at least 1 token")]
    ZeroUbatch,
    /// More tokens than [`MAX_TOKENS`] (prefill plus decode steps).
    #[error("{prefill} prefill tokens and {decode} decode steps are more than {MAX_TOKENS} tokens, the most one replay takes")]
    TooManyTokens {
        /// Prefill tokens.
        prefill: usize,
        /// Decode steps asked for.
        decode: usize,
    },
    /// A buffer would not fit in memory.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// More prefill tokens were asked for than the stream has.
    #[error("{prefill} prefill tokens asked for, but the stream has {tokens}")]
    PrefillTooLong {
        /// Prefill tokens asked for.
        prefill: usize,
        /// Tokens in the stream.
        tokens: usize,
    },
    /// The file has no row mapper, or a token cannot be mapped.
    #[error(transparent)]
    Ngram(#[from] NgramError),
    /// A gather failed.
    #[error(transparent)]
    Gather(#[from] Error),
    /// The lookahead failed.
    #[error(transparent)]
    Lookahead(#[from] LookaheadError),
    /// The table's shard is not mapped, so it cannot be evicted.
    #[error("the table's file is not mapped")]
    NotMapped,
    /// Evicting the table from the page cache failed.
    #[error(transparent)]
    Evict(#[from] BenchError),
    /// The floor's `O_DIRECT` reads failed.
    #[error("device floor (O_DIRECT io_uring): {0}")]
    Floor(#[source] pleio::io::IoError),
}

/// What to replay and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayConfig {
    /// Tokens per prefill ubatch.
    pub ubatch: usize,
    /// Prefill tokens (`None`: every token not left for decode).
    pub prefill: Option<usize>,
    /// Decode steps of one token.
    pub decode: usize,
    /// How rows are fetched.
    pub strategy: Strategy,
    /// Evict the table from the page cache before the prefill and again
    /// before the decode steps.
    pub cold: bool,
    /// Prefetch ubatch k+1 while ubatch k computes.
    pub lookahead: bool,
    /// Simulated model time per prefill ubatch (a sleep after its gather).
    pub compute: Duration,
    /// Seed of the decode tokens drawn when the stream runs out.
    pub seed: u64,
    /// Times the stream is replayed in one process ([`Replayer::run_passes`]);
    /// with `cold`, only the first pass starts cold.
    pub passes: usize,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            ubatch: 512,
            prefill: None,
            decode: 0,
            strategy: Strategy::default(),
            cold: false,
            lookahead: false,
            compute: Duration::ZERO,
            seed: 0,
            passes: 1,
        }
    }
}

/// A stream split into prefill ubatches and decode steps, with row ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayPlan {
    /// Prefill tokens, then decode tokens.
    pub tokens: Vec<u32>,
    /// How many of `tokens` are prefill.
    pub prefill: usize,
    /// Decode tokens drawn from the stream because it ran out.
    pub drawn: usize,
    /// Tokens per ubatch (the configured size, or the whole prefill when
    /// that is shorter).
    pub ubatch: usize,
    /// Row ids per token.
    pub rows_per_token: usize,
    /// Row ids of every token, token-major, mapped as one sequence.
    pub rows: Vec<u64>,
}

impl ReplayPlan {
    /// Prefill tokens.
    pub fn prefill_tokens(&self) -> &[u32] {
        &self.tokens[..self.prefill]
    }

    /// Decode tokens.
    pub fn decode_tokens(&self) -> &[u32] {
        &self.tokens[self.prefill..]
    }

    /// Row ids of each prefill ubatch.
    pub fn ubatches(&self) -> std::slice::Chunks<'_, u64> {
        let per = self.rows_per_token;
        self.rows[..self.prefill * per].chunks(self.ubatch * per)
    }

    /// Row ids of each decode step.
    pub fn decode_steps(&self) -> std::slice::Chunks<'_, u64> {
        let per = self.rows_per_token;
        self.rows[self.prefill * per..].chunks(per)
    }
}

/// Latency percentiles (nearest rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Slowest.
    pub max: Duration,
}

impl Latency {
    /// Percentiles of `xs`, `None` when empty.
    pub fn of(xs: &[Duration]) -> Option<Latency> {
        let mut v = xs.to_vec();
        v.sort_unstable();
        let rank = |p: usize| v[(v.len() * p).div_ceil(100).clamp(1, v.len()) - 1];
        let max = *v.last()?;
        Some(Latency {
            p50: rank(50),
            p90: rank(90),
            p99: rank(99),
            max,
        })
    }
}

/// One prefill ubatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UbatchReport {
    /// Position in the prefill.
    pub index: usize,
    /// Tokens.
    pub tokens: usize,
    /// Row ids (duplicates counted).
    pub rows: usize,
    /// Distinct row ids.
    pub distinct_rows: usize,
    /// Distinct file pages the distinct rows touch.
    pub distinct_pages: u64,
    /// Distinct rows that an earlier ubatch also needed.
    pub reused_rows: usize,
    /// The gather's time (on the lookahead worker with lookahead).
    pub gather: Duration,
    /// Time the replay loop waited for the rows (with lookahead: beyond
    /// the previous ubatch's compute; without: the gather).
    pub exposed: Duration,
    /// Bytes the process read from the device for this ubatch.
    pub read_bytes: Option<u64>,
    /// Major faults the process took for this ubatch.
    pub process_major_faults: Option<u64>,
}

/// Totals of one phase (prefill or decode).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PhaseReport {
    /// Tokens.
    pub tokens: usize,
    /// Gathers (ubatches or decode steps).
    pub steps: usize,
    /// Row ids (duplicates counted).
    pub rows: usize,
    /// Distinct row ids over the phase.
    pub distinct_rows: usize,
    /// Sum over steps of the distinct rows an earlier step (of either
    /// phase) also needed.
    pub reused_rows: usize,
    /// Total gather time (the PLE stage's time).
    pub gather: Duration,
    /// Total time the loop waited for rows.
    pub exposed: Duration,
    /// Wall time of the phase, simulated compute included.
    pub wall: Duration,
    /// Per-step gather time percentiles.
    pub latency: Option<Latency>,
    /// Bytes the process read from the device during the phase.
    pub read_bytes: Option<u64>,
    /// Major faults the process took during the phase.
    pub process_major_faults: Option<u64>,
    /// What the phase's gathers reported, summed (row-cache hits, misses
    /// and evictions, read requests and bytes, ...).
    pub gathers: GatherStats,
}

impl PhaseReport {
    /// PLE-stage throughput: tokens per second of gather time.
    pub fn tokens_per_s(&self) -> Option<f64> {
        let s = self.gather.as_secs_f64();
        (self.tokens > 0 && s > 0.0).then(|| self.tokens as f64 / s)
    }

    /// Gather time over the floor's time for the same phase.
    pub fn ratio_to_floor(&self, floor: &PhaseFloor) -> Option<f64> {
        let f = floor.time().as_secs_f64();
        (self.steps > 0 && f > 0.0).then(|| self.gather.as_secs_f64() / f)
    }
}

/// The device floor of a replay plan's two phases.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayFloor {
    /// The prefill ubatches' cold extents, table evicted before the first.
    pub prefill: PhaseFloor,
    /// The decode steps' cold extents, table evicted before the first.
    pub decode: PhaseFloor,
}

/// What an eviction found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eviction {
    /// Pages of the table's range (rounded outward).
    pub pages: u64,
    /// Of those, resident before eviction (estimated from a sample of
    /// [`RESIDENCY_PROBES`] pages where the residency method read-probes).
    pub resident_before: Option<u64>,
    /// Resident after (at most the two edge pages, which hold other bytes;
    /// estimated likewise).
    pub resident_after: Option<u64>,
}

/// Pages sampled for an eviction's before/after figures where residency
/// is read-probed (exact otherwise).
pub const RESIDENCY_PROBES: u64 = 4096;

/// Everything one replay measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// Which pass over the stream this was (1 for the first).
    pub pass: usize,
    /// Strategy used.
    pub strategy: Strategy,
    /// Whether ubatches were prefetched.
    pub lookahead: bool,
    /// Simulated compute per ubatch.
    pub compute: Duration,
    /// Tokens per ubatch.
    pub ubatch: usize,
    /// Decode tokens drawn from the stream because it ran out.
    pub drawn: usize,
    /// Prefill totals.
    pub prefill: PhaseReport,
    /// Decode totals.
    pub decode: PhaseReport,
    /// Each prefill ubatch.
    pub ubatches: Vec<UbatchReport>,
    /// Evictions before prefill and before decode (with `cold`).
    pub evictions: Vec<Eviction>,
    /// [`checksum`] of every gathered float, prefill then decode.
    pub checksum: u64,
    /// Peak resident set of the process (`VmHWM`) after the replay.
    pub peak_rss: Option<u64>,
    /// The lookahead's counters (with `lookahead`).
    pub lookahead_counters: Option<LookaheadCounters>,
    /// The row cache after the pass (strategy `cached`).
    pub cache: Option<CacheCounters>,
    /// The row cache's budget and policy (strategy `cached`).
    pub cache_config: Option<(u64, CachePolicy)>,
}

/// Start value of [`checksum`].
pub const CHECKSUM_INIT: u64 = 0xcbf2_9ce4_8422_2325;

/// Folds `data` into the running checksum `h`: 64-bit FNV-1a over the f32
/// bit patterns, one 32-bit word per float. Equal floats in equal order
/// give equal sums, whatever the batching.
pub fn checksum(mut h: u64, data: &[f32]) -> u64 {
    for x in data {
        h = (h ^ u64::from(x.to_bits())).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Replays token streams over one table of one model.
#[derive(Debug)]
pub struct Replayer {
    reader: Table,
    mapper: ModelRows,
}

impl Replayer {
    /// A replayer for `table` (normally the PLE table) of `model`; the
    /// file's metadata picks the row mapper.
    pub fn new(model: Arc<Model>, table: Layout) -> Result<Replayer, ReplayError> {
        let mapper = ModelRows::from_model(&model, &table)?;
        let reader = Table::tensor_of(model, table.name())?;
        Ok(Replayer { reader, mapper })
    }

    /// A replayer for the PLE table of the GGUF file or safetensors
    /// checkpoint at `path` ([`Table::open`]; its row mapper from the
    /// file's metadata or the checkpoint's config).
    pub fn open(path: &std::path::Path) -> Result<Replayer, ReplayError> {
        Replayer::open_with(path, &pleio::OpenOptions::new())
    }

    /// [`Replayer::open`] with every open option (the PLE layer, ...).
    pub fn open_with(
        path: &std::path::Path,
        options: &pleio::OpenOptions,
    ) -> Result<Replayer, ReplayError> {
        let reader = options.open(path)?;
        let mapper = reader.row_ids()?;
        Ok(Replayer { reader, mapper })
    }

    /// The row mapper.
    pub fn mapper(&self) -> &ModelRows {
        &self.mapper
    }

    /// The reader gathered from.
    pub fn reader(&self) -> &Table {
        &self.reader
    }

    /// Gives the reader a row cache of `budget` bytes (the library default
    /// when `None`) with `policy` (the default when `None`), for the
    /// `cached` strategy.
    pub fn with_cache(
        mut self,
        budget: Option<u64>,
        policy: Option<CachePolicy>,
    ) -> Result<Replayer, ReplayError> {
        if let Some(b) = budget {
            self.reader = self.reader.with_budget(b)?;
        }
        if let Some(p) = policy {
            self.reader = self.reader.with_cache_policy(p);
        }
        Ok(self)
    }

    /// Splits `tokens` into prefill and decode tokens and maps them all
    /// as one sequence (see the module docs for where decode tokens come
    /// from).
    pub fn plan(&self, tokens: &[u32], cfg: &ReplayConfig) -> Result<ReplayPlan, ReplayError> {
        if tokens.is_empty() {
            return Err(ReplayError::EmptyStream);
        }
        if cfg.ubatch == 0 {
            return Err(ReplayError::ZeroUbatch);
        }
        let prefill = cfg
            .prefill
            .unwrap_or_else(|| tokens.len().saturating_sub(cfg.decode));
        if prefill > tokens.len() {
            return Err(ReplayError::PrefillTooLong {
                prefill,
                tokens: tokens.len(),
            });
        }
        let total = prefill
            .checked_add(cfg.decode)
            .filter(|&n| n <= MAX_TOKENS)
            .ok_or(ReplayError::TooManyTokens {
                prefill,
                decode: cfg.decode,
            })?;
        // A ubatch never holds more than the whole prefill.
        let ubatch = cfg.ubatch.min(prefill.max(1));
        let follow = &tokens[prefill..tokens.len().min(total)];
        let drawn = cfg.decode - follow.len();
        let per = self.mapper.rows_per_token();
        check_memory(
            || format!("the row ids of {total} tokens"),
            (total as u64).checked_mul(per as u64 * 8),
        )?;
        let mut all = Vec::with_capacity(total);
        all.extend_from_slice(&tokens[..prefill + follow.len()]);
        let mut rng = Rng::new(cfg.seed);
        all.extend((0..drawn).map(|_| tokens[rng.below(tokens.len() as u64) as usize]));

        let mut seq = self.mapper.sequence();
        let mut rows = Vec::with_capacity(all.len().saturating_mul(per));
        for ub in all[..prefill].chunks(ubatch) {
            seq.map_tokens(ub, &mut rows)?;
        }
        for t in &all[prefill..] {
            seq.map_tokens(std::slice::from_ref(t), &mut rows)?;
        }
        Ok(ReplayPlan {
            tokens: all,
            prefill,
            drawn,
            ubatch,
            rows_per_token: per,
            rows,
        })
    }

    /// The device floor of `plan` ([`Floor::phase`] of its ubatches, then
    /// of its decode steps): what reading each phase's rows cold takes with
    /// the same eviction as a cold [`Replayer::run`] (before the prefill
    /// and again before decode).
    pub fn floor(&self, plan: &ReplayPlan, floor: &Floor) -> Result<ReplayFloor, ReplayError> {
        let ubs: Vec<&[u64]> = plan.ubatches().collect();
        let steps: Vec<&[u64]> = plan.decode_steps().collect();
        Ok(ReplayFloor {
            prefill: floor.phase(&ubs).map_err(ReplayError::Floor)?,
            decode: floor.phase(&steps).map_err(ReplayError::Floor)?,
        })
    }

    /// Drops the table's pages from this process's page tables and from
    /// the page cache, checks that they are gone, and makes the reader
    /// forget what `auto` believed resident ([`Evictor`]).
    pub fn evict(&self) -> Result<Eviction, ReplayError> {
        let ranges = bench::table_ranges(self.reader.layout());
        let mut maps = Vec::with_capacity(ranges.len());
        for (i, _) in &ranges {
            maps.push(self.reader.mapping_of(*i).ok_or(ReplayError::NotMapped)?);
        }
        let page = maps[0].page_size();
        let pages = ranges
            .iter()
            .map(|(_, r)| r.end.div_ceil(page) - r.start / page)
            .sum();
        let resident = || {
            ranges
                .iter()
                .zip(&maps)
                .map(|((_, r), m)| {
                    m.sample_resident(r.clone(), RESIDENCY_PROBES)
                        .map(|r| r.estimate())
                })
                .sum::<Option<u64>>()
        };
        let resident_before = resident();
        Evictor::of_table(&self.reader)?.evict(&self.reader)?;
        Ok(Eviction {
            pages,
            resident_before,
            resident_after: resident(),
        })
    }

    /// Gathers the plan's ubatches, then its decode steps, as `cfg` says
    /// (one pass; with `cold` the table is evicted before the prefill and
    /// again before the decode steps).
    pub fn run(&self, plan: &ReplayPlan, cfg: &ReplayConfig) -> Result<ReplayReport, ReplayError> {
        self.run_pass(plan, cfg, 1, cfg.cold, cfg.cold)
    }

    /// `cfg.passes` passes over the plan in this process, one report each.
    /// One pass is [`Replayer::run`]. With more, `cold` evicts the table
    /// (and empties the row cache) once, before the first pass's prefill:
    /// its decode steps and every later pass find what the earlier gathers
    /// left, as a serving process would.
    pub fn run_passes(
        &self,
        plan: &ReplayPlan,
        cfg: &ReplayConfig,
    ) -> Result<Vec<ReplayReport>, ReplayError> {
        if cfg.passes <= 1 {
            return Ok(vec![self.run(plan, cfg)?]);
        }
        (1..=cfg.passes)
            .map(|k| self.run_pass(plan, cfg, k, cfg.cold && k == 1, false))
            .collect()
    }

    fn run_pass(
        &self,
        plan: &ReplayPlan,
        cfg: &ReplayConfig,
        pass: usize,
        evict_prefill: bool,
        evict_decode: bool,
    ) -> Result<ReplayReport, ReplayError> {
        let mut evictions = Vec::new();
        if evict_prefill {
            evictions.push(self.evict()?);
        }
        let lookahead = if cfg.lookahead {
            Some(Lookahead::new(self.reader.clone(), cfg.strategy)?)
        } else {
            None
        };
        let elems = self.reader.row_elems();
        // One buffer of the largest gather: a ubatch, or a decode step.
        let out_floats = plan
            .ubatch
            .max(1)
            .checked_mul(plan.rows_per_token)
            .and_then(|r| r.checked_mul(elems));
        check_memory(
            || format!("a ubatch of {} tokens", plan.ubatch),
            out_floats.and_then(|f| (f as u64).checked_mul(4)),
        )?;
        let mut out = vec![0f32; out_floats.unwrap_or(0)];
        let mut sum = CHECKSUM_INIT;

        // Prefill.
        let ubs: Vec<&[u64]> = plan.ubatches().collect();
        let mut steps = Vec::with_capacity(ubs.len());
        let mut prefill_stats = GatherStats::default();
        let phase_start = ProcSample::now();
        let t_phase = Instant::now();
        let mut last = phase_start;
        let mut pending = lookahead
            .as_ref()
            .zip(ubs.first())
            .map(|(la, r)| la.prefetch(r));
        for (k, rows) in ubs.iter().enumerate() {
            let dst = &mut out[..rows.len() * elems];
            let t0 = Instant::now();
            let gather = match pending.take() {
                Some(p) => {
                    let got = p.wait_into(dst)?;
                    prefill_stats.add(&got.stats);
                    got.fetch_time()
                }
                None => {
                    let st = self.reader.gather_with(cfg.strategy, rows, dst)?;
                    let t = t0.elapsed();
                    prefill_stats.add(&st);
                    t
                }
            };
            let done = Instant::now();
            let now = ProcSample::now();
            if let (Some(la), Some(next)) = (&lookahead, ubs.get(k + 1)) {
                pending = Some(la.prefetch(next));
            }
            steps.push(Step {
                gather,
                exposed: done - t0,
                counters: now.since(&last),
            });
            last = now;
            sum = checksum(sum, dst);
            sleep_until(done + cfg.compute);
        }
        let prefill_wall = t_phase.elapsed();
        let prefill_counters = ProcSample::now().since(&phase_start);

        // Decode: one token per step, no lookahead (the next token is not
        // known before the step's compute).
        if evict_decode && !plan.decode_tokens().is_empty() {
            evictions.push(self.evict()?);
        }
        let mut decode_stats = GatherStats::default();
        let phase_start = ProcSample::now();
        let t_phase = Instant::now();
        let mut decode_times = Vec::with_capacity(plan.decode_tokens().len());
        for rows in plan.decode_steps() {
            let dst = &mut out[..rows.len() * elems];
            let t0 = Instant::now();
            let st = self.reader.gather_with(cfg.strategy, rows, dst)?;
            decode_times.push(t0.elapsed());
            decode_stats.add(&st);
            sum = checksum(sum, dst);
        }
        let decode_wall = t_phase.elapsed();
        let decode_counters = ProcSample::now().since(&phase_start);

        // Row statistics, outside the timed loops.
        let page = self
            .reader
            .mapping()
            .map_or_else(sys::page_size, |m| m.page_size());
        let mut seen = FxHashSet::default();
        let mut ubatches = Vec::with_capacity(ubs.len());
        let mut prefill = PhaseReport {
            tokens: plan.prefill,
            steps: ubs.len(),
            wall: prefill_wall,
            read_bytes: prefill_counters.read_bytes,
            process_major_faults: prefill_counters.process_major_faults,
            gathers: prefill_stats,
            ..PhaseReport::default()
        };
        for (index, (rows, step)) in ubs.iter().zip(&steps).enumerate() {
            let rs = RowStats::of(rows, &mut seen, self.reader.layout(), page);
            prefill.add(rows.len(), rs.reused, step.gather, step.exposed);
            ubatches.push(UbatchReport {
                index,
                tokens: rows.len() / plan.rows_per_token.max(1),
                rows: rows.len(),
                distinct_rows: rs.distinct,
                distinct_pages: rs.pages,
                reused_rows: rs.reused,
                gather: step.gather,
                exposed: step.exposed,
                read_bytes: step.counters.read_bytes,
                process_major_faults: step.counters.process_major_faults,
            });
        }
        prefill.distinct_rows = seen.len();
        prefill.latency = Latency::of(&steps.iter().map(|s| s.gather).collect::<Vec<_>>());

        let mut decode = PhaseReport {
            tokens: plan.decode_tokens().len(),
            steps: decode_times.len(),
            wall: decode_wall,
            latency: Latency::of(&decode_times),
            read_bytes: decode_counters.read_bytes,
            process_major_faults: decode_counters.process_major_faults,
            gathers: decode_stats,
            ..PhaseReport::default()
        };
        let mut decode_seen = FxHashSet::default();
        for (rows, &t) in plan.decode_steps().zip(&decode_times) {
            let rs = RowStats::of(rows, &mut seen, self.reader.layout(), page);
            decode.add(rows.len(), rs.reused, t, t);
            decode_seen.extend(rows.iter().copied());
        }
        decode.distinct_rows = decode_seen.len();

        let cached = cfg.strategy == Strategy::Cached;
        Ok(ReplayReport {
            pass,
            strategy: cfg.strategy,
            lookahead: cfg.lookahead,
            compute: cfg.compute,
            ubatch: plan.ubatch,
            drawn: plan.drawn,
            prefill,
            decode,
            ubatches,
            evictions,
            checksum: sum,
            peak_rss: bench::peak_rss(),
            lookahead_counters: lookahead.as_ref().map(Lookahead::counters),
            cache: self.reader.cache_counters().filter(|_| cached),
            cache_config: cached.then(|| (self.reader.cache_budget(), self.reader.cache_policy())),
        })
    }
}

impl PhaseReport {
    fn add(&mut self, rows: usize, reused: usize, gather: Duration, exposed: Duration) {
        self.rows += rows;
        self.reused_rows += reused;
        self.gather += gather;
        self.exposed += exposed;
    }
}

/// Timings and counters of one prefill gather.
struct Step {
    gather: Duration,
    exposed: Duration,
    counters: ProcSample,
}

/// Distinct rows and pages of one batch, and how many of its distinct rows
/// `seen` held already (then adds them to `seen`).
struct RowStats {
    distinct: usize,
    pages: u64,
    reused: usize,
}

impl RowStats {
    fn of(rows: &[u64], seen: &mut FxHashSet<u64>, t: &Layout, page: u64) -> RowStats {
        let mut d = rows.to_vec();
        d.sort_unstable();
        d.dedup();
        // (file, page) of every part of every distinct row.
        let mut pages: Vec<(usize, u64)> = Vec::with_capacity(d.len() * 2);
        for &r in &d {
            for e in t.extents(r).iter().flat_map(|x| x.as_slice()) {
                let end = e.offset + e.len.max(1) - 1;
                pages.extend((e.offset / page..=end / page).map(|p| (e.file, p)));
            }
        }
        pages.sort_unstable();
        pages.dedup();
        let reused = d.iter().filter(|&&r| !seen.insert(r)).count();
        RowStats {
            distinct: d.len(),
            pages: pages.len() as u64,
            reused,
        }
    }
}

fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

/// Process-wide I/O and fault counters at one moment (Linux `/proc/self`;
/// `None` where unavailable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// Bytes the process caused to be read from storage
    /// ([`bench::proc_read_bytes`]; page-cache hits do not count).
    pub read_bytes: Option<u64>,
    /// Major page faults of the process (`majflt` of `/proc/self/stat`).
    pub process_major_faults: Option<u64>,
}

impl ProcSample {
    /// The counters now.
    pub fn now() -> ProcSample {
        ProcSample {
            read_bytes: bench::proc_read_bytes(),
            process_major_faults: crate::os::process_major_faults(),
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &ProcSample) -> ProcSample {
        let d = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b?));
        ProcSample {
            read_bytes: d(self.read_bytes, earlier.read_bytes),
            process_major_faults: d(self.process_major_faults, earlier.process_major_faults),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let ms = |v: u64| Duration::from_millis(v);
        let xs: Vec<Duration> = (1..=100).rev().map(ms).collect();
        let l = Latency::of(&xs).unwrap();
        assert_eq!(
            (l.p50, l.p90, l.p99, l.max),
            (ms(50), ms(90), ms(99), ms(100))
        );
        let one = Latency::of(&[ms(7)]).unwrap();
        assert_eq!((one.p50, one.p99, one.max), (ms(7), ms(7), ms(7)));
        assert!(Latency::of(&[]).is_none());
    }

    #[test]
    fn checksum_is_order_sensitive_and_split_invariant() {
        let a = [1.0f32, -0.0, f32::NAN, 3.5];
        let whole = checksum(CHECKSUM_INIT, &a);
        assert_eq!(checksum(checksum(CHECKSUM_INIT, &a[..1]), &a[1..]), whole);
        assert_ne!(checksum(CHECKSUM_INIT, &[-0.0, 1.0, f32::NAN, 3.5]), whole);
        assert_ne!(checksum(CHECKSUM_INIT, &[1.0, 0.0, f32::NAN, 3.5]), whole);
    }

    #[test]
    fn row_stats_count_pages_and_reuse() {
        let file = tempfile::NamedTempFile::new().unwrap();
        crate::synth::SynthSpec::qwen(pleio::quant::GgmlType::IQ4_NL, 3000, 1)
            .write(file.reopen().unwrap(), &mut |_| {})
            .unwrap();
        let model = Model::open(file.path()).unwrap();
        let t = &Layout::of_ple(&model).unwrap();
        let (page, rb) = (4096, t.row_bytes());
        let first_page = |r: u64| (t.offset() + r * rb) / page;
        let straddles = |r: u64| first_page(r) != (t.offset() + r * rb + rb - 1) / page;
        // Row s straddles pages p and p + 1; row s + 1 lies in page p + 1.
        let s = (0..t.rows()).find(|&r| straddles(r)).unwrap();
        let far = (s + 100..t.rows()).find(|&r| !straddles(r)).unwrap();
        let mut seen = FxHashSet::default();
        let rs = RowStats::of(&[s, s, s + 1], &mut seen, t, page);
        assert_eq!((rs.distinct, rs.pages, rs.reused), (2, 2, 0));
        let rs = RowStats::of(&[s + 1, far], &mut seen, t, page);
        assert_eq!((rs.distinct, rs.pages, rs.reused), (2, 2, 1));
    }

    #[test]
    fn proc_counters_parse_when_present() {
        if std::path::Path::new("/proc/self/io").exists() {
            let s = ProcSample::now();
            assert!(s.read_bytes.is_some() && s.process_major_faults.is_some());
            let later = ProcSample::now().since(&s);
            assert!(later.read_bytes.is_some() && later.process_major_faults.is_some());
            assert_eq!(s.since(&ProcSample::default()), ProcSample::default());
        }
    }
}
