//! Row mappers: from token ids to the row ids of a PLE table.
//!
//! - `qwen4exp`: every token needs `n_heads` rows (16 in the released model),
//!   hashed from the token and its `ngram_size - 1` predecessors
//!   ([`QwenNgramParams`], [`QwenHistory`], [`QwenSequence`]).
//! - `gemma4`: the token id is the row id ([`Gemma4Rows`]).
//!
//! [`ModelRows::from_model`] picks and configures the mapper of an open model
//! from its `general.architecture` and metadata; [`ModelRows::sequence`]
//! gives a per-sequence [`RowMapper`].
//!
//! Both implement [`RowMapper`]. Row ids are token-major: the rows of token
//! `i` are `out[i * rows_per_token .. (i + 1) * rows_per_token]`.
//!
//! # The qwen4exp hash
//!
//! The context of token `p` is `ctx[0] = tok[p]` (even when it is the reset
//! token EOS), then for `s = 1 .. N-1` the predecessor `tok[p - s]`, until a
//! predecessor is missing (sequence start) or is EOS: that slot and all later
//! ones are EOS. For `n = 2 ..= N` the mix is
//! `ctx[0]*m[0] ^ ctx[1]*m[1] ^ .. ^ ctx[n-1]*m[n-1]` (u64, wrapping multiply)
//! and head `h = (n-2) * heads_per_ngram + g` takes row
//! `mix % size[h] + offset[h]`.
//!
//! # Image positions
//!
//! Token ids equal to `ple.image_token_id` are hashed like any other token.
//! The id matters only for positions that arrive as embeddings without token
//! ids (an image batch): the qwen4exp reference hashes those positions with
//! `ple.image_token_id` standing in for the missing id, or with the EOS id
//! when the file carries no image token id. [`QwenHistory::map_embeddings`]
//! implements that rule.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, ErrorKind};
use crate::gguf::{Metadata, Value};
use crate::layout::Layout;
use crate::model::Model;

/// Largest supported `ple.ngram_size`.
pub const MAX_NGRAM: usize = 8;
/// Largest supported number of heads, `(ngram_size - 1) * heads_per_ngram`.
pub const MAX_HEADS: usize = 64;

/// `general.architecture` of the n-gram hashed tables.
pub const QWEN_ARCH: &str = "qwen4exp";
/// `general.architecture` of the one-row-per-token tables.
pub const GEMMA_ARCH: &str = "gemma4";

/// Metadata key suffixes (after `qwen4exp.`) of the n-gram hash parameters.
pub mod keys {
    /// `u32`: elements per PLE row slice (qwen4exp 160 = the row width;
    /// gemma4 256 per layer). Also read under `gemma4.`.
    pub const ROW_WIDTH: &str = "embedding_length_per_layer_input";
    /// Integer array, optional: the PLE layers; exactly one is supported.
    pub const LAYERS: &str = "ple.layers";
    /// `u32`, optional (gemma4): layers, each owning a slice of every row.
    pub const BLOCK_COUNT: &str = "block_count";
    /// `u32`: n-gram order N (3 in the released model).
    pub const NGRAM_SIZE: &str = "ple.ngram_size";
    /// `u32`: heads per n-gram order (8).
    pub const HEADS_PER_NGRAM: &str = "ple.heads_per_ngram";
    /// `u32`: the n-gram reset token (248044, `<|endoftext|>`).
    pub const EOS_TOKEN_ID: &str = "ple.eos_token_id";
    /// `u32`, optional: stand-in id for embedding-only (image) positions.
    pub const IMAGE_TOKEN_ID: &str = "ple.image_token_id";
    /// `u64` array: one hash multiplier per context slot (>= N entries).
    pub const LAYER_MULTIPLIERS: &str = "ple.layer_multipliers";
    /// `u64` array: rows owned by each head (`n_heads` entries).
    pub const HEAD_VOCAB_SIZES: &str = "ple.head_vocab_sizes";
    /// `u64` array: first row of each head (`n_heads` entries).
    pub const HEAD_OFFSETS: &str = "ple.head_offsets";
}

/// Errors from building a row mapper or mapping tokens to rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NgramError {
    /// `ple.ngram_size` is outside `2..=8`.
    #[error("qwen4exp.{key} = {value}: must be in 2..={MAX_NGRAM}", key = keys::NGRAM_SIZE)]
    NgramSize {
        /// The value found.
        value: u32,
    },
    /// `(ngram_size - 1) * heads_per_ngram` is zero or above 64.
    #[error(
        "qwen4exp.{key} = {heads_per_ngram}: (ngram_size - 1) * heads_per_ngram = {n_heads} must be in 1..={MAX_HEADS}",
        key = keys::HEADS_PER_NGRAM
    )]
    HeadCount {
        /// The value found.
        heads_per_ngram: u32,
        /// The resulting number of heads.
        n_heads: u64,
    },
    /// An array has the wrong number of entries.
    #[error("qwen4exp.{key} has {len} entries, needs {expected}")]
    ArrayLength {
        /// Metadata key suffix of the array.
        key: &'static str,
        /// Entries found.
        len: usize,
        /// What is needed, e.g. "at least 3" or "exactly 16".
        expected: String,
    },
    /// A head owns zero rows.
    #[error("qwen4exp.{key}[{head}] = 0: every head needs at least one row", key = keys::HEAD_VOCAB_SIZES)]
    ZeroHeadSize {
        /// The head.
        head: usize,
    },
    /// A head's row range does not fit in the table.
    #[error(
        "qwen4exp head {head}: rows [{offset}, {offset} + {size}) ({off_key}[{head}], {size_key}[{head}]) exceed the table's {n_rows} rows",
        off_key = keys::HEAD_OFFSETS,
        size_key = keys::HEAD_VOCAB_SIZES
    )]
    HeadOutOfTable {
        /// The head.
        head: usize,
        /// Its first row.
        offset: u64,
        /// Its row count.
        size: u64,
        /// Rows in the table tensor.
        n_rows: u64,
    },
    /// A gemma4 token id is not a row of the table.
    #[error("token {token} is outside the gemma4 table of {n_rows} rows")]
    TokenOutOfTable {
        /// The token id.
        token: u32,
        /// Rows in the table tensor.
        n_rows: u64,
    },
    /// A required metadata key is absent.
    #[error("metadata key {key} is missing")]
    MissingKey {
        /// The full key, e.g. `qwen4exp.ple.ngram_size`.
        key: String,
    },
    /// A metadata key holds a value of the wrong type or out of range.
    #[error("metadata key {key} holds {found}, expected {expected}")]
    WrongKeyType {
        /// The full key.
        key: String,
        /// The value found, with its type (e.g. `f32 1.5`).
        found: String,
        /// What the key must hold.
        expected: &'static str,
    },
    /// The metadata's row width disagrees with the table's rows.
    #[error("metadata key {key} = {value} does not match the table's rows of {row_elems} elements{detail}")]
    RowWidth {
        /// The full key.
        key: String,
        /// Its value.
        value: u64,
        /// Elements per row of the table tensor.
        row_elems: u64,
        /// Extra explanation (empty or starting with `: `).
        detail: String,
    },
    /// The file's architecture has no row mapper.
    #[error("{}: pleio maps rows for {QWEN_ARCH} and {GEMMA_ARCH} only", match .arch {
        Some(a) => format!("architecture {a:?}"),
        None => "the file has no general.architecture".to_string(),
    })]
    UnknownArchitecture {
        /// `general.architecture`, if present.
        arch: Option<String>,
    },
    /// The output slice does not have room for the batch's row ids.
    #[error("output holds {len} row ids, the batch needs {needed}")]
    OutputLength {
        /// Length of the slice given.
        len: usize,
        /// Row ids the batch produces.
        needed: usize,
    },
}

/// Maps one sequence's tokens, batch by batch, to row ids.
pub trait RowMapper {
    /// Row ids produced per token.
    fn rows_per_token(&self) -> usize;

    /// Writes the row ids of `tokens` into `out`, token-major; `out.len()`
    /// must equal `tokens.len() * rows_per_token()`. State carried across
    /// batches (if any) advances only on success.
    fn map_into(&mut self, tokens: &[u32], out: &mut [u64]) -> Result<(), NgramError>;

    /// Appends the row ids of `tokens` to `out`, token-major. Allocates only
    /// when `out` lacks capacity. On error `out` is left as it was.
    fn map_tokens(&mut self, tokens: &[u32], out: &mut Vec<u64>) -> Result<(), NgramError> {
        let start = out.len();
        let needed = tokens.len().saturating_mul(self.rows_per_token());
        out.resize(start.saturating_add(needed), 0);
        let res = self.map_into(tokens, &mut out[start..]);
        if res.is_err() {
            out.truncate(start);
        }
        res
    }
}

/// Validated qwen4exp n-gram hash parameters, shared by all sequences of one
/// model.
#[derive(Clone, PartialEq, Eq)]
pub struct QwenNgramParams {
    ngram_size: usize,
    heads_per_ngram: usize,
    n_heads: usize,
    eos: u32,
    image: Option<u32>,
    multipliers: [u64; MAX_NGRAM],
    sizes: [u64; MAX_HEADS],
    offsets: [u64; MAX_HEADS],
}

impl fmt::Debug for QwenNgramParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QwenNgramParams")
            .field("ngram_size", &self.ngram_size)
            .field("heads_per_ngram", &self.heads_per_ngram)
            .field("eos", &self.eos)
            .field("image", &self.image)
            .field("multipliers", &self.multipliers())
            .field("head_vocab_sizes", &self.head_vocab_sizes())
            .field("head_offsets", &self.head_offsets())
            .finish()
    }
}

/// Released qwen4exp (Qwen3.8-Flash-Next) constants and the rule that
/// derives a head layout for any table size (16 consecutive primes).
pub mod released {
    /// Released qwen4exp n-gram layer multipliers (`qwen4exp.ple.layer_multipliers`).
    pub const QWEN_MULTIPLIERS: [u64; 3] = [23703573157769, 20109073645365, 8052911324071];
    /// Rows of the released qwen4exp PLE table (`ne[1]`).
    pub const QWEN_FULL_ROWS: u64 = 320_001_536;
    /// Elements per qwen4exp PLE row.
    pub const QWEN_ROW_ELEMS: u64 = 160;
    /// qwen4exp n-gram order (`ple.ngram_size`).
    pub const QWEN_NGRAM_SIZE: u32 = 3;
    /// qwen4exp heads per n-gram order (`ple.heads_per_ngram`).
    pub const QWEN_HEADS_PER_NGRAM: u32 = 8;
    /// qwen4exp n-gram reset token.
    pub const QWEN_EOS: u32 = 248044;
    /// qwen4exp image token.
    pub const QWEN_IMAGE: u32 = 248056;
    /// Heads of the released qwen4exp table: (ngram_size - 1) * heads_per_ngram.
    pub const QWEN_HEADS: usize = ((QWEN_NGRAM_SIZE - 1) * QWEN_HEADS_PER_NGRAM) as usize;
    /// Gemma 4 vocabulary (rows of its PLE table).
    pub const GEMMA_VOCAB: u64 = 262_144;
    /// Gemma 4 per-layer slice width.
    pub const GEMMA_PER_LAYER: u64 = 256;

    /// The per-head row ranges of a qwen4exp table.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct QwenHeads {
        /// Head sizes: consecutive primes.
        pub sizes: Vec<u64>,
        /// Prefix sums of the sizes.
        pub offsets: Vec<u64>,
    }

    impl QwenHeads {
        /// The head layout for a table of `rows` rows: the 16 consecutive primes
        /// with the largest start whose sum fits in `rows` (the released rule: at
        /// [`QWEN_FULL_ROWS`] this gives the released primes from 20000003 up).
        /// `None` if even the 16 smallest primes do not fit.
        pub fn for_rows(rows: u64) -> Option<QwenHeads> {
            // Whether the 16 primes from `start` sum to at most `rows`.
            let fits = |start: u64| -> bool {
                primes_from(start)
                    .take(QWEN_HEADS)
                    .try_fold(0u64, u64::checked_add)
                    .is_some_and(|s| s <= rows)
            };
            if !fits(2) {
                return None;
            }
            // Largest start that fits; the sum grows with start.
            let (mut lo, mut hi) = (2u64, rows / QWEN_HEADS as u64 + 1);
            while lo + 1 < hi {
                let mid = lo + (hi - lo) / 2;
                if fits(mid) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let sizes: Vec<u64> = primes_from(lo).take(QWEN_HEADS).collect();
            let offsets = sizes
                .iter()
                .scan(0u64, |acc, &s| {
                    let o = *acc;
                    *acc += s;
                    Some(o)
                })
                .collect();
            Some(QwenHeads { sizes, offsets })
        }

        /// The fewest rows any layout fits in: the sum of the 16 smallest primes.
        pub fn min_rows() -> u64 {
            primes_from(2).take(QWEN_HEADS).sum()
        }

        /// Rows the heads address (the table may have padding rows after them).
        pub fn addressed_rows(&self) -> u64 {
            self.sizes.iter().sum()
        }
    }

    /// `a * b mod m` without overflow.
    fn mul_mod(a: u64, b: u64, m: u64) -> u64 {
        (u128::from(a) * u128::from(b) % u128::from(m)) as u64
    }

    /// `b^e mod m` by squaring.
    fn pow_mod(mut b: u64, mut e: u64, m: u64) -> u64 {
        let mut r = 1u64;
        b %= m;
        while e > 0 {
            if e & 1 == 1 {
                r = mul_mod(r, b, m);
            }
            b = mul_mod(b, b, m);
            e >>= 1;
        }
        r
    }

    /// Primality by Miller-Rabin with the first 12 prime bases, exact for
    /// every `u64` (and fast at any size, unlike trial division, which
    /// took hours per prime near 2^52).
    pub(crate) fn is_prime(n: u64) -> bool {
        const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
        if n < 2 {
            return false;
        }
        for p in BASES {
            if n.is_multiple_of(p) {
                return n == p;
            }
        }
        let s = (n - 1).trailing_zeros();
        let d = (n - 1) >> s;
        'bases: for a in BASES {
            let mut x = pow_mod(a, d, n);
            if x == 1 || x == n - 1 {
                continue;
            }
            for _ in 1..s {
                x = mul_mod(x, x, n);
                if x == n - 1 {
                    continue 'bases;
                }
            }
            return false;
        }
        true
    }

    /// Primes from `start` up.
    pub(crate) fn primes_from(start: u64) -> impl Iterator<Item = u64> {
        (start..).filter(|&n| is_prime(n))
    }

    /// The released head sizes (what [`QwenHeads::for_rows`] derives for
    /// [`QWEN_FULL_ROWS`], spelled out as an independent check of the rule).
    pub const QWEN_HEAD_SIZES: [u64; 16] = [
        20_000_003, 20_000_023, 20_000_033, 20_000_047, 20_000_059, 20_000_063, 20_000_069,
        20_000_077, 20_000_081, 20_000_093, 20_000_107, 20_000_147, 20_000_153, 20_000_159,
        20_000_161, 20_000_171,
    ];

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn full_size_heads_are_the_released_primes() {
            let h = QwenHeads::for_rows(QWEN_FULL_ROWS).unwrap();
            assert_eq!(h.sizes, QWEN_HEAD_SIZES);
            assert_eq!(h.offsets[15], 300001275);
            assert_eq!(h.addressed_rows(), 320001446);
        }

        #[test]
        fn scaled_heads_fit_and_are_maximal() {
            for rows in [381u64, 1000, 65_536, 16_777_216] {
                let h = QwenHeads::for_rows(rows).unwrap();
                assert!(h.addressed_rows() <= rows);
                assert!(h.sizes.windows(2).all(|w| w[0] < w[1]));
                // Starting one prime later would not fit.
                let next: u64 = primes_from(h.sizes[0] + 1).take(QWEN_HEADS).sum();
                assert!(next > rows, "rows {rows}");
            }
            assert_eq!(QwenHeads::for_rows(380), None);
        }

        #[test]
        fn primality_is_exact_small_and_large() {
            let trial = |n: u64| {
                n >= 2
                    && (2..)
                        .take_while(|d| d * d <= n)
                        .all(|d| !n.is_multiple_of(d))
            };
            for n in 0..20_000u64 {
                assert_eq!(is_prime(n), trial(n), "{n}");
            }
            // Mersenne prime 2^61 - 1; 2^61 + 1 is divisible by 3; a strong
            // pseudoprime to bases 2..=37 would need n > 3.3e24.
            assert!(is_prime((1 << 61) - 1));
            assert!(!is_prime((1 << 61) + 1));
            assert!(is_prime(18_446_744_073_709_551_557)); // largest u64 prime
            assert!(!is_prime(3_215_031_751)); // strong pseudoprime to 2, 3, 5, 7
        }

        #[test]
        fn huge_row_counts_get_heads() {
            // `synth --rows 2^52` hung in a trial-division prime search.
            for rows in [1u64 << 52, 1 << 60, u64::MAX] {
                let h = QwenHeads::for_rows(rows).unwrap();
                assert!(h.addressed_rows() <= rows);
                assert!(h.sizes.iter().all(|&p| is_prime(p)));
            }
        }
    }
}

impl QwenNgramParams {
    /// Validates the parameters against a table of `n_rows` rows.
    ///
    /// `multipliers` needs at least `ngram_size` entries (extra ones are
    /// ignored), `sizes` and `offsets` exactly `n_heads`; every head's rows
    /// `[offset, offset + size)` must lie inside the table.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ngram_size: u32,
        heads_per_ngram: u32,
        eos_token_id: u32,
        image_token_id: Option<u32>,
        multipliers: Vec<u64>,
        head_vocab_sizes: Vec<u64>,
        head_offsets: Vec<u64>,
        n_rows: u64,
    ) -> Result<Self, NgramError> {
        if !(2..=MAX_NGRAM as u32).contains(&ngram_size) {
            return Err(NgramError::NgramSize { value: ngram_size });
        }
        let n_heads = u64::from(ngram_size - 1) * u64::from(heads_per_ngram);
        if n_heads == 0 || n_heads > MAX_HEADS as u64 {
            return Err(NgramError::HeadCount {
                heads_per_ngram,
                n_heads,
            });
        }
        let (n, h) = (ngram_size as usize, n_heads as usize);
        if multipliers.len() < n {
            return Err(NgramError::ArrayLength {
                key: keys::LAYER_MULTIPLIERS,
                len: multipliers.len(),
                expected: format!("at least {n} (ngram_size)"),
            });
        }
        for (key, arr) in [
            (keys::HEAD_VOCAB_SIZES, &head_vocab_sizes),
            (keys::HEAD_OFFSETS, &head_offsets),
        ] {
            if arr.len() != h {
                return Err(NgramError::ArrayLength {
                    key,
                    len: arr.len(),
                    expected: format!("exactly {h} (n_heads)"),
                });
            }
        }
        for (head, (&size, &offset)) in head_vocab_sizes.iter().zip(&head_offsets).enumerate() {
            if size == 0 {
                return Err(NgramError::ZeroHeadSize { head });
            }
            if offset.checked_add(size).is_none_or(|end| end > n_rows) {
                return Err(NgramError::HeadOutOfTable {
                    head,
                    offset,
                    size,
                    n_rows,
                });
            }
        }
        let mut params = Self {
            ngram_size: n,
            heads_per_ngram: heads_per_ngram as usize,
            n_heads: h,
            eos: eos_token_id,
            image: image_token_id,
            multipliers: [0; MAX_NGRAM],
            sizes: [0; MAX_HEADS],
            offsets: [0; MAX_HEADS],
        };
        params.multipliers[..n].copy_from_slice(&multipliers[..n]);
        params.sizes[..h].copy_from_slice(&head_vocab_sizes);
        params.offsets[..h].copy_from_slice(&head_offsets);
        Ok(params)
    }

    /// The constants of the released model (Qwen3.8-Flash-Next), against its
    /// table of 320001536 rows.
    pub fn released() -> Self {
        let offsets = released::QWEN_HEAD_SIZES
            .iter()
            .scan(0u64, |acc, &s| {
                let off = *acc;
                *acc += s;
                Some(off)
            })
            .collect();
        Self::new(
            released::QWEN_NGRAM_SIZE,
            released::QWEN_HEADS_PER_NGRAM,
            released::QWEN_EOS,
            Some(released::QWEN_IMAGE),
            released::QWEN_MULTIPLIERS.to_vec(),
            released::QWEN_HEAD_SIZES.to_vec(),
            offsets,
            released::QWEN_FULL_ROWS,
        )
        .expect("released qwen4exp constants are valid")
    }

    /// Reads and validates the `qwen4exp.ple.*` keys of a file whose table
    /// has `n_rows` rows (see [`keys`]; `ple.image_token_id` and
    /// `ple.layers` are optional, and `ple.layers` must list one layer).
    ///
    /// The row width (`qwen4exp.embedding_length_per_layer_input`) is not
    /// read here: [`ModelRows::from_metadata`] checks it against the table.
    pub fn from_metadata(md: &Metadata, n_rows: u64) -> Result<Self, NgramError> {
        let k = KeyReader::new(md, QWEN_ARCH);
        if let Some(layers) = k.opt_u64s(keys::LAYERS)? {
            if layers.len() != 1 {
                return Err(NgramError::ArrayLength {
                    key: keys::LAYERS,
                    len: layers.len(),
                    expected: "exactly 1 (one PLE layer)".into(),
                });
            }
        }
        Self::new(
            k.u32(keys::NGRAM_SIZE)?,
            k.u32(keys::HEADS_PER_NGRAM)?,
            k.u32(keys::EOS_TOKEN_ID)?,
            k.opt_u32(keys::IMAGE_TOKEN_ID)?,
            k.u64s(keys::LAYER_MULTIPLIERS)?,
            k.u64s(keys::HEAD_VOCAB_SIZES)?,
            k.u64s(keys::HEAD_OFFSETS)?,
            n_rows,
        )
    }

    /// N-gram order N.
    pub fn ngram_size(&self) -> usize {
        self.ngram_size
    }

    /// Heads per n-gram order.
    pub fn heads_per_ngram(&self) -> usize {
        self.heads_per_ngram
    }

    /// Rows per token, `(N - 1) * heads_per_ngram`.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// The n-gram reset token.
    pub fn eos_token_id(&self) -> u32 {
        self.eos
    }

    /// The image token id, if the file carries one.
    pub fn image_token_id(&self) -> Option<u32> {
        self.image
    }

    /// The id hashed at positions that have no token id (image embeddings):
    /// the image token id if present, else EOS.
    pub fn stand_in_token(&self) -> u32 {
        self.image.unwrap_or(self.eos)
    }

    /// The hash multipliers used (the first N).
    pub fn multipliers(&self) -> &[u64] {
        &self.multipliers[..self.ngram_size]
    }

    /// Rows owned by each head.
    pub fn head_vocab_sizes(&self) -> &[u64] {
        &self.sizes[..self.n_heads]
    }

    /// First row of each head.
    pub fn head_offsets(&self) -> &[u64] {
        &self.offsets[..self.n_heads]
    }

    /// A fresh sequence's history (every predecessor slot is EOS).
    pub fn new_history(&self) -> QwenHistory {
        QwenHistory {
            prev: [u64::from(self.eos); MAX_NGRAM - 1],
        }
    }

    /// A fresh sequence bound to these parameters.
    pub fn sequence(&self) -> QwenSequence<'_> {
        QwenSequence {
            params: self,
            history: self.new_history(),
        }
    }

    /// Row ids of one position whose context slots 1.. are `prev`.
    #[inline(always)]
    fn rows_of(&self, tok: u64, prev: &[u64; MAX_NGRAM - 1], out: &mut [u64]) {
        let hp = self.heads_per_ngram;
        let mut mixed = tok.wrapping_mul(self.multipliers[0]);
        for (j, chunk) in out.chunks_exact_mut(hp).enumerate() {
            mixed ^= prev[j].wrapping_mul(self.multipliers[j + 1]);
            let base = j * hp;
            let sizes = &self.sizes[base..base + hp];
            let offsets = &self.offsets[base..base + hp];
            for ((o, &size), &off) in chunk.iter_mut().zip(sizes).zip(offsets) {
                *o = mixed % size + off;
            }
        }
    }

    /// Maps `tokens` (or, with `tokens = None`, `count` embedding positions)
    /// into `out`, advancing `hist`.
    fn map_positions(
        &self,
        hist: &mut QwenHistory,
        tokens: Option<&[u32]>,
        count: usize,
        out: &mut [u64],
    ) -> Result<(), NgramError> {
        let needed = count.saturating_mul(self.n_heads);
        if out.len() != needed {
            return Err(NgramError::OutputLength {
                len: out.len(),
                needed,
            });
        }
        let eos = u64::from(self.eos);
        let stand_in = self.stand_in_token();
        let mut prev = hist.prev;
        for (i, rows) in out.chunks_exact_mut(self.n_heads).enumerate() {
            let tok = u64::from(tokens.map_or(stand_in, |t| t[i]));
            self.rows_of(tok, &prev, rows);
            prev = next_prev(&prev, tok, eos);
        }
        hist.prev = prev;
        Ok(())
    }
}

/// Typed reads of `<arch>.<suffix>` metadata keys, with errors naming the
/// full key.
struct KeyReader<'a> {
    md: &'a Metadata,
    arch: &'static str,
}

impl<'a> KeyReader<'a> {
    fn new(md: &'a Metadata, arch: &'static str) -> Self {
        Self { md, arch }
    }

    fn full(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// The value of an optional key, converted by `conv`.
    fn opt<T>(
        &self,
        suffix: &str,
        expected: &'static str,
        conv: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<Option<T>, NgramError> {
        let Some(v) = self.md.get(&self.full(suffix)) else {
            return Ok(None);
        };
        conv(v).map(Some).ok_or_else(|| NgramError::WrongKeyType {
            key: self.full(suffix),
            found: describe(v),
            expected,
        })
    }

    fn required<T>(&self, suffix: &str, v: Option<T>) -> Result<T, NgramError> {
        v.ok_or_else(|| NgramError::MissingKey {
            key: self.full(suffix),
        })
    }

    fn opt_u32(&self, suffix: &str) -> Result<Option<u32>, NgramError> {
        self.opt(suffix, "an integer in 0..=4294967295", Value::as_u32)
    }

    fn u32(&self, suffix: &str) -> Result<u32, NgramError> {
        self.required(suffix, self.opt_u32(suffix)?)
    }

    fn opt_u64s(&self, suffix: &str) -> Result<Option<Vec<u64>>, NgramError> {
        self.opt(
            suffix,
            "an array of nonnegative integers",
            Value::as_u64_array,
        )
    }

    fn u64s(&self, suffix: &str) -> Result<Vec<u64>, NgramError> {
        self.required(suffix, self.opt_u64s(suffix)?)
    }
}

/// A metadata value with its type, for error messages (`f32 1.5`,
/// `[i32; 2] [1, -1]`).
fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => a.to_string(),
        other => format!("{} {other}", other.value_type()),
    }
}

/// The row mapper of one model, chosen by its `general.architecture`.
// One per model: the qwen4exp variant's inline 1 KiB of constants is fine.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRows {
    /// qwen4exp: n-gram hashed rows.
    Qwen(QwenNgramParams),
    /// gemma4: the token id is the row id.
    Gemma(Gemma4Rows),
}

impl ModelRows {
    /// The mapper for `table` (normally the PLE table) of `model`.
    pub fn from_model(model: &Model, table: &Layout) -> Result<Self, NgramError> {
        Self::from_metadata(model.metadata(), table.row_elems(), table.rows())
    }

    /// The mapper for a table of `n_rows` rows of `row_elems` elements,
    /// described by `md`: `general.architecture` picks it, and
    /// `<arch>.embedding_length_per_layer_input` must match the rows
    /// (qwen4exp: equal to `row_elems`, required; gemma4: `row_elems` is
    /// that times `gemma4.block_count`, checked when the keys are present).
    pub fn from_metadata(md: &Metadata, row_elems: u64, n_rows: u64) -> Result<Self, NgramError> {
        let arch = match md.get("general.architecture") {
            None => None,
            Some(v) => Some(v.as_str().ok_or_else(|| NgramError::WrongKeyType {
                key: "general.architecture".into(),
                found: describe(v),
                expected: "a string",
            })?),
        };
        match arch {
            Some(QWEN_ARCH) => {
                let k = KeyReader::new(md, QWEN_ARCH);
                let width = k.u32(keys::ROW_WIDTH)?;
                if u64::from(width) != row_elems {
                    return Err(NgramError::RowWidth {
                        key: k.full(keys::ROW_WIDTH),
                        value: width.into(),
                        row_elems,
                        detail: String::new(),
                    });
                }
                Ok(Self::Qwen(QwenNgramParams::from_metadata(md, n_rows)?))
            }
            Some(GEMMA_ARCH) => {
                let k = KeyReader::new(md, GEMMA_ARCH);
                if let Some(width) = k.opt_u32(keys::ROW_WIDTH)? {
                    let layers = k.opt_u32(keys::BLOCK_COUNT)?;
                    let fits = match layers {
                        Some(l) => u64::from(width) * u64::from(l) == row_elems,
                        None => width != 0 && row_elems.is_multiple_of(u64::from(width)),
                    };
                    if !fits {
                        return Err(NgramError::RowWidth {
                            key: k.full(keys::ROW_WIDTH),
                            value: width.into(),
                            row_elems,
                            detail: match layers {
                                Some(l) => format!(
                                    ": {} = {l} layers need rows of {}",
                                    k.full(keys::BLOCK_COUNT),
                                    u64::from(width) * u64::from(l)
                                ),
                                None => ": rows must hold whole per-layer slices".into(),
                            },
                        });
                    }
                }
                Ok(Self::Gemma(Gemma4Rows::new(n_rows)))
            }
            other => Err(NgramError::UnknownArchitecture {
                arch: other.map(str::to_string),
            }),
        }
    }

    /// The architecture name (`qwen4exp` or `gemma4`).
    pub fn architecture(&self) -> &'static str {
        match self {
            Self::Qwen(_) => QWEN_ARCH,
            Self::Gemma(_) => GEMMA_ARCH,
        }
    }

    /// Row ids per token (16 for the released qwen4exp, 1 for gemma4).
    pub fn rows_per_token(&self) -> usize {
        match self {
            Self::Qwen(p) => p.n_heads(),
            Self::Gemma(_) => 1,
        }
    }

    /// The n-gram parameters, for qwen4exp.
    pub fn qwen(&self) -> Option<&QwenNgramParams> {
        match self {
            Self::Qwen(p) => Some(p),
            Self::Gemma(_) => None,
        }
    }

    /// A fresh sequence: map its batches in order with [`RowMapper`].
    pub fn sequence(&self) -> ModelSequence<'_> {
        match self {
            Self::Qwen(p) => ModelSequence::Qwen(p.sequence()),
            Self::Gemma(g) => ModelSequence::Gemma(*g),
        }
    }
}

/// One sequence of a [`ModelRows`] mapper (see [`ModelRows::sequence`]).
#[derive(Debug, Clone)]
pub enum ModelSequence<'p> {
    /// A qwen4exp sequence, with its history.
    Qwen(QwenSequence<'p>),
    /// gemma4 (stateless).
    Gemma(Gemma4Rows),
}

impl RowMapper for ModelSequence<'_> {
    fn rows_per_token(&self) -> usize {
        match self {
            Self::Qwen(s) => s.rows_per_token(),
            Self::Gemma(g) => g.rows_per_token(),
        }
    }

    fn map_into(&mut self, tokens: &[u32], out: &mut [u64]) -> Result<(), NgramError> {
        match self {
            Self::Qwen(s) => s.map_into(tokens, out),
            Self::Gemma(g) => g.map_into(tokens, out),
        }
    }
}

/// One token stream of a table's row-id mapping
/// ([`Table::sequence`](crate::Table::sequence)), owning its mapper, so it
/// can live in a handle (a binding's sequence object, a server's
/// per-request state).
#[derive(Debug, Clone)]
pub struct OwnedSequence {
    rows: Arc<ModelRows>,
    /// The qwen4exp history (gemma4 has none).
    history: Option<QwenHistory>,
}

impl OwnedSequence {
    /// A fresh stream of `rows`.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn new(rows: Arc<ModelRows>) -> OwnedSequence {
        let history = rows.qwen().map(QwenNgramParams::new_history);
        OwnedSequence { rows, history }
    }

    /// The mapper.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn rows(&self) -> &Arc<ModelRows> {
        &self.rows
    }

    /// Forgets all predecessors: the next token starts a fresh sequence.
    pub fn reset(&mut self) {
        self.history = self.rows.qwen().map(QwenNgramParams::new_history);
    }

    /// The model architecture whose mapping this is (`qwen4exp`, `gemma4`).
    pub fn architecture(&self) -> &'static str {
        self.rows.architecture()
    }

    /// Row ids produced per token (16 for the released qwen4exp, 1 for
    /// gemma4).
    pub fn rows_per_token(&self) -> usize {
        RowMapper::rows_per_token(self)
    }

    /// Writes the row ids of `tokens` into `out`, token-major; `out.len()`
    /// must equal `tokens.len() * rows_per_token()`. The stream advances
    /// only on success.
    pub fn map_into(&mut self, tokens: &[u32], out: &mut [u64]) -> Result<(), Error> {
        Ok(RowMapper::map_into(self, tokens, out)?)
    }

    /// Appends the row ids of `tokens` to `out`, token-major (allocating
    /// only when `out` lacks capacity). On error `out` is left as it was
    /// and the stream does not advance. (An engine uses
    /// [`OwnedSequence::map_into`].)
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn map_tokens(&mut self, tokens: &[u32], out: &mut Vec<u64>) -> Result<(), Error> {
        Ok(RowMapper::map_tokens(self, tokens, out)?)
    }
}

impl RowMapper for OwnedSequence {
    fn rows_per_token(&self) -> usize {
        self.rows.rows_per_token()
    }

    fn map_into(&mut self, tokens: &[u32], out: &mut [u64]) -> Result<(), NgramError> {
        match &*self.rows {
            // advances the history only on success
            ModelRows::Qwen(p) => self
                .history
                .get_or_insert_with(|| p.new_history())
                .map_into(p, tokens, out),
            ModelRows::Gemma(g) => {
                let mut g = *g;
                g.map_into(tokens, out)
            }
        }
    }
}

/// The predecessor slots of the position after one holding `tok`.
#[inline(always)]
fn next_prev(prev: &[u64; MAX_NGRAM - 1], tok: u64, eos: u64) -> [u64; MAX_NGRAM - 1] {
    if tok == eos {
        [eos; MAX_NGRAM - 1]
    } else {
        let mut next = [tok; MAX_NGRAM - 1];
        next[1..].copy_from_slice(&prev[..MAX_NGRAM - 2]);
        next
    }
}

/// Cross-batch state of one qwen4exp sequence: the effective context of the
/// next position (the last N-1 tokens, with EOS filled in after a reset).
///
/// Small and `Copy`; keep one per sequence and pass it with the model's
/// [`QwenNgramParams`]. Create it with [`QwenNgramParams::new_history`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QwenHistory {
    /// `prev[s - 1]` is context slot `s` of the next position.
    prev: [u64; MAX_NGRAM - 1],
}

impl QwenHistory {
    /// Writes the row ids of `tokens` into `out` (`tokens.len() * n_heads`
    /// long, token-major) and advances the history.
    pub fn map_into(
        &mut self,
        params: &QwenNgramParams,
        tokens: &[u32],
        out: &mut [u64],
    ) -> Result<(), NgramError> {
        params.map_positions(self, Some(tokens), tokens.len(), out)
    }

    /// Writes the row ids of `count` positions that arrive as embeddings
    /// without token ids (an image batch): each is hashed as
    /// [`QwenNgramParams::stand_in_token`].
    pub fn map_embeddings(
        &mut self,
        params: &QwenNgramParams,
        count: usize,
        out: &mut [u64],
    ) -> Result<(), NgramError> {
        params.map_positions(self, None, count, out)
    }

    /// Advances the history over `tokens` without producing row ids (e.g. to
    /// resume a sequence whose earlier tokens were mapped elsewhere).
    pub fn advance(&mut self, params: &QwenNgramParams, tokens: &[u32]) {
        let eos = u64::from(params.eos);
        for &t in tokens {
            self.prev = next_prev(&self.prev, u64::from(t), eos);
        }
    }

    /// Context slots `1..N` of the next position.
    pub fn context(&self, params: &QwenNgramParams) -> Vec<u64> {
        self.prev[..params.ngram_size - 1].to_vec()
    }
}

/// One qwen4exp sequence: parameters plus its [`QwenHistory`].
#[derive(Debug, Clone)]
pub struct QwenSequence<'p> {
    params: &'p QwenNgramParams,
    history: QwenHistory,
}

impl<'p> QwenSequence<'p> {
    /// The parameters this sequence hashes with.
    pub fn params(&self) -> &'p QwenNgramParams {
        self.params
    }

    /// The carried history.
    pub fn history(&self) -> &QwenHistory {
        &self.history
    }

    /// Forgets all predecessors: the next token starts a fresh sequence.
    pub fn reset(&mut self) {
        self.history = self.params.new_history();
    }

    /// Appends the row ids of `count` embedding-only (image) positions; see
    /// [`QwenHistory::map_embeddings`].
    pub fn map_embeddings(&mut self, count: usize, out: &mut Vec<u64>) -> Result<(), NgramError> {
        let start = out.len();
        out.resize(start + count.saturating_mul(self.params.n_heads), 0);
        let res = self
            .history
            .map_embeddings(self.params, count, &mut out[start..]);
        if res.is_err() {
            out.truncate(start);
        }
        res
    }
}

impl RowMapper for QwenSequence<'_> {
    fn rows_per_token(&self) -> usize {
        self.params.n_heads
    }

    fn map_into(&mut self, tokens: &[u32], out: &mut [u64]) -> Result<(), NgramError> {
        self.history.map_into(self.params, tokens, out)
    }
}

/// gemma4: the row of token `t` is `t`, checked against the table's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemma4Rows {
    n_rows: u64,
}

impl Gemma4Rows {
    /// A mapper for a table of `n_rows` rows (262144 in the released models).
    pub fn new(n_rows: u64) -> Self {
        Self { n_rows }
    }

    /// Rows in the table.
    pub fn n_rows(&self) -> u64 {
        self.n_rows
    }
}

impl RowMapper for Gemma4Rows {
    fn rows_per_token(&self) -> usize {
        1
    }

    fn map_into(&mut self, tokens: &[u32], out: &mut [u64]) -> Result<(), NgramError> {
        if out.len() != tokens.len() {
            return Err(NgramError::OutputLength {
                len: out.len(),
                needed: tokens.len(),
            });
        }
        for (o, &t) in out.iter_mut().zip(tokens) {
            if u64::from(t) >= self.n_rows {
                return Err(NgramError::TokenOutOfTable {
                    token: t,
                    n_rows: self.n_rows,
                });
            }
            *o = u64::from(t);
        }
        Ok(())
    }
}

impl From<NgramError> for Error {
    fn from(e: NgramError) -> Error {
        Error::new(ErrorKind::RowIds, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_shifts_and_resets() {
        let p = QwenNgramParams::released();
        let eos = u64::from(p.eos_token_id());
        let mut h = p.new_history();
        assert_eq!(h.context(&p), vec![eos, eos]);
        h.advance(&p, &[5]);
        assert_eq!(h.context(&p), vec![5, eos]);
        h.advance(&p, &[6]);
        assert_eq!(h.context(&p), vec![6, 5]);
        h.advance(&p, &[p.eos_token_id()]);
        assert_eq!(h.context(&p), vec![eos, eos]);
    }

    #[test]
    fn model_sequences_map_like_their_mappers() {
        let tokens = [9707, 11, 1879, 248_044, 5, 6, 7];
        let rows = ModelRows::Qwen(QwenNgramParams::released());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut seq = rows.sequence();
        assert_eq!(seq.rows_per_token(), 16);
        seq.map_tokens(&tokens[..2], &mut a).unwrap();
        seq.map_tokens(&tokens[2..], &mut a).unwrap();
        QwenNgramParams::released()
            .sequence()
            .map_tokens(&tokens, &mut b)
            .unwrap();
        assert_eq!(a, b);

        let rows = ModelRows::Gemma(Gemma4Rows::new(10));
        let mut out = Vec::new();
        rows.sequence().map_tokens(&[3, 9], &mut out).unwrap();
        assert_eq!(out, [3, 9]);
        assert!(rows.sequence().map_tokens(&[10], &mut out).is_err());
    }

    #[test]
    fn embeddings_hash_as_stand_in() {
        let p = QwenNgramParams::released();
        assert_eq!(p.stand_in_token(), 248_056);
        let (mut a, mut b) = (p.sequence(), p.sequence());
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        a.map_tokens(&[7, 248_056, 248_056, 9], &mut ra).unwrap();
        b.map_tokens(&[7], &mut rb).unwrap();
        b.map_embeddings(2, &mut rb).unwrap();
        b.map_tokens(&[9], &mut rb).unwrap();
        assert_eq!(ra, rb);
    }
}
