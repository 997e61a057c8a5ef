//! The n-gram parameters of a qwen4exp checkpoint's `config.json`, and the
//! head sizes, offsets and multipliers derived from them.
//!
//! Keys are read from `text_config` when it holds `ngram_size`, else from
//! the top level: `ngram_size`, `heads_per_ngram`, `ngram_vocab_size_base`,
//! `make_ngram_vocab_size_divisible_by`, `split_ngram_parts`, `vocab_size`,
//! `eos_token_id`, `seed` (absent or null: 1234), and optionally
//! `image_token_id` and `ple_embedding_dtype`.
//!
//! Derivation (`docs/ple-tables.md` s.2), all on u64:
//! - `n_heads = (ngram_size - 1) * heads_per_ngram`;
//! - head sizes: the `n_heads` consecutive primes from the first prime
//!   `>= ngram_vocab_size_base`; offsets: their prefix sums;
//! - table rows: the sum of the sizes rounded up to a multiple of
//!   `make_ngram_vocab_size_divisible_by`;
//! - multipliers, for slot `i` of PLE layer index `k` (the position of the
//!   decoder layer in `ple_layer_ids`; 0 for the released model's one PLE
//!   layer): `m[i] = 2 * (splitmix64(seed + 10007 * k + GAMMA * (i + 1)) %
//!   half_bound) + 1` with `half_bound = ((2^63 - 1) / vocab_size) / 2` and
//!   `splitmix64(x)` the first output of SplitMix64 seeded with `x` (that
//!   is, the finalizer of `x + GAMMA`), wrapping arithmetic;
//! - head sizes continue the prime sequence across PLE layers: PLE layer
//!   index `k` takes primes number `k * n_heads + 1 ..= (k + 1) * n_heads`
//!   from the first prime `>= ngram_vocab_size_base` (transformers'
//!   `_find_nth_prime_after(base - 1, k * n_heads + h + 1)`); its offsets
//!   start at 0 and its rows are padded on their own.

use serde_json::Value;

use crate::ngram::released::primes_from;
use crate::ngram::{NgramError, QwenNgramParams};

/// SplitMix64's increment.
pub const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// The seed when `config.json` has none (or null).
pub const DEFAULT_SEED: u64 = 1234;
/// Per-layer seed stride of the multiplier derivation.
pub const LAYER_SEED_STRIDE: u64 = 10007;

/// The first output of SplitMix64 seeded with `x`: the finalizer of
/// `x + GAMMA` (Vigna's `splitmix64.c`), wrapping arithmetic.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(SPLITMIX_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Errors reading the n-gram keys of a config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    // The messages do not name the file: `CheckpointError::Config` (and
    // whoever else shows one) puts the path in front.
    /// The text is not JSON (or not an object).
    #[error("not a JSON object: {message}")]
    BadJson {
        /// serde_json's message.
        message: String,
    },
    /// A required key is absent.
    #[error("key `{key}` is missing (looked in {place})")]
    MissingKey {
        /// The key.
        key: &'static str,
        /// `text_config` or `the top level`.
        place: &'static str,
    },
    /// A key holds something other than what it must.
    #[error("`{key}` is {found}, expected {expected}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The JSON value found.
        found: String,
        /// What it must be.
        expected: &'static str,
    },
    /// Derived values overflow or are impossible.
    #[error("{0}")]
    Derivation(String),
}

/// The n-gram keys of a qwen4exp `config.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramConfig {
    /// `ngram_size` (3).
    pub ngram_size: u32,
    /// `heads_per_ngram` (8).
    pub heads_per_ngram: u32,
    /// `ngram_vocab_size_base` (20,000,000).
    pub ngram_vocab_size_base: u64,
    /// `make_ngram_vocab_size_divisible_by` (128).
    pub make_ngram_vocab_size_divisible_by: u64,
    /// `split_ngram_parts` (128 row shards), if given.
    pub split_ngram_parts: Option<u64>,
    /// `vocab_size` (248,320).
    pub vocab_size: u64,
    /// `eos_token_id` (248,044); the first if the config lists several.
    pub eos_token_id: u32,
    /// `seed` (1234 when absent or null).
    pub seed: u64,
    /// `image_token_id`, if given.
    pub image_token_id: Option<u32>,
    /// `ple_embedding_dtype` ("float8_e4m3fn", "nvfp4"), if given.
    pub ple_embedding_dtype: Option<String>,
    /// `ple_layer_ids`: the decoder layers holding a PLE table, 1-based
    /// (`[2]` in the release: `model.layers[1]`), if given.
    pub ple_layer_ids: Option<Vec<u64>>,
}

/// Largest PLE layer index (position in `ple_layer_ids`) whose head sizes
/// are derived: the prime search walks `(index + 1) * n_heads` primes.
pub const MAX_PLE_LAYER_INDEX: u64 = 4096;

/// Where the n-gram keys were found.
struct Keys<'a> {
    obj: &'a serde_json::Map<String, Value>,
    top: &'a serde_json::Map<String, Value>,
    place: &'static str,
}

impl Keys<'_> {
    fn get(&self, key: &'static str) -> Option<&Value> {
        self.obj
            .get(key)
            .or_else(|| self.top.get(key))
            .filter(|v| !v.is_null())
    }

    fn u64(&self, key: &'static str) -> Result<u64, ConfigError> {
        let v = self.get(key).ok_or(ConfigError::MissingKey {
            key,
            place: self.place,
        })?;
        as_u64(key, v)
    }

    fn opt_u64(&self, key: &'static str) -> Result<Option<u64>, ConfigError> {
        self.get(key).map(|v| as_u64(key, v)).transpose()
    }

    fn u32(&self, key: &'static str) -> Result<u32, ConfigError> {
        to_u32(key, self.u64(key)?)
    }
}

fn as_u64(key: &'static str, v: &Value) -> Result<u64, ConfigError> {
    v.as_u64().ok_or_else(|| ConfigError::BadValue {
        key,
        found: v.to_string(),
        expected: "a non-negative integer",
    })
}

fn to_u32(key: &'static str, v: u64) -> Result<u32, ConfigError> {
    u32::try_from(v).map_err(|_| ConfigError::BadValue {
        key,
        found: v.to_string(),
        expected: "an integer below 2^32",
    })
}

impl NgramConfig {
    /// Reads the n-gram keys from the text of a `config.json`.
    pub fn from_json(text: &[u8]) -> Result<NgramConfig, ConfigError> {
        let v: Value = serde_json::from_slice(text).map_err(|e| ConfigError::BadJson {
            message: e.to_string(),
        })?;
        let Some(top) = v.as_object() else {
            return Err(ConfigError::BadJson {
                message: "the top level is not an object".into(),
            });
        };
        let text_config = top
            .get("text_config")
            .and_then(Value::as_object)
            .filter(|t| t.contains_key("ngram_size"));
        let k = match text_config {
            Some(obj) => Keys {
                obj,
                top,
                place: "text_config",
            },
            None => Keys {
                obj: top,
                top,
                place: "the top level",
            },
        };
        let eos = match k.get("eos_token_id") {
            Some(Value::Array(a)) => a.first().ok_or(ConfigError::BadValue {
                key: "eos_token_id",
                found: "[]".into(),
                expected: "a token id or a non-empty list of them",
            })?,
            Some(v) => v,
            None => {
                return Err(ConfigError::MissingKey {
                    key: "eos_token_id",
                    place: k.place,
                })
            }
        };
        let ple_embedding_dtype = match k.get("ple_embedding_dtype") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => {
                return Err(ConfigError::BadValue {
                    key: "ple_embedding_dtype",
                    found: v.to_string(),
                    expected: "a string",
                })
            }
        };
        let ple_layer_ids = match k.get("ple_layer_ids") {
            None => None,
            Some(Value::Array(a)) => Some(
                a.iter()
                    .map(|v| as_u64("ple_layer_ids", v))
                    .collect::<Result<Vec<u64>, ConfigError>>()?,
            ),
            Some(v) => {
                return Err(ConfigError::BadValue {
                    key: "ple_layer_ids",
                    found: v.to_string(),
                    expected: "a list of 1-based layer ids",
                })
            }
        };
        Ok(NgramConfig {
            ple_layer_ids,
            ngram_size: k.u32("ngram_size")?,
            heads_per_ngram: k.u32("heads_per_ngram")?,
            ngram_vocab_size_base: k.u64("ngram_vocab_size_base")?,
            make_ngram_vocab_size_divisible_by: k.u64("make_ngram_vocab_size_divisible_by")?,
            split_ngram_parts: k.opt_u64("split_ngram_parts")?,
            vocab_size: k.u64("vocab_size")?,
            eos_token_id: to_u32("eos_token_id", as_u64("eos_token_id", eos)?)?,
            seed: k.opt_u64("seed")?.unwrap_or(DEFAULT_SEED),
            image_token_id: k
                .opt_u64("image_token_id")?
                .map(|v| to_u32("image_token_id", v))
                .transpose()?,
            ple_embedding_dtype,
        })
    }

    /// `(ngram_size - 1) * heads_per_ngram`, bounded to keep the prime
    /// search and arrays small.
    pub fn n_heads(&self) -> Result<usize, ConfigError> {
        let n = u64::from(self.ngram_size.saturating_sub(1)) * u64::from(self.heads_per_ngram);
        if self.ngram_size < 2 || n == 0 || n > crate::ngram::MAX_HEADS as u64 {
            return Err(ConfigError::Derivation(format!(
                "ngram_size {} and heads_per_ngram {} give {n} heads (1..={} supported)",
                self.ngram_size,
                self.heads_per_ngram,
                crate::ngram::MAX_HEADS
            )));
        }
        Ok(n as usize)
    }

    /// The PLE layer index of decoder layer `layer` (0-based): its
    /// position in `ple_layer_ids` (which lists `layer + 1`), or `None`
    /// when the config lists the PLE layers and this is not one of them.
    /// Without `ple_layer_ids`, `discovered` (the sorted decoder layers
    /// found holding a table) stands in.
    pub fn ple_layer_index(&self, layer: u64, discovered: &[u64]) -> Option<u64> {
        match &self.ple_layer_ids {
            Some(ids) => {
                let mut ids = ids.clone();
                // transformers sorts and dedups the list (`sorted(set(...))`).
                ids.sort_unstable();
                ids.dedup();
                ids.iter()
                    .position(|&i| Some(i) == layer.checked_add(1))
                    .map(|p| p as u64)
            }
            None => discovered
                .iter()
                .position(|&l| l == layer)
                .map(|p| p as u64),
        }
    }

    /// The head sizes of PLE layer index `index` (0 for the first PLE
    /// layer): primes number `index * n_heads + 1 ..= (index + 1) *
    /// n_heads` from the first `>= ngram_vocab_size_base`.
    pub fn head_sizes(&self, index: u64) -> Result<Vec<u64>, ConfigError> {
        let n = self.n_heads()?;
        // Trial division stays cheap below 2^40 (a million divisions).
        if self.ngram_vocab_size_base >= 1 << 40 {
            return Err(ConfigError::Derivation(format!(
                "ngram_vocab_size_base {} is beyond 2^40",
                self.ngram_vocab_size_base
            )));
        }
        if index > MAX_PLE_LAYER_INDEX {
            return Err(ConfigError::Derivation(format!(
                "PLE layer index {index} is beyond {MAX_PLE_LAYER_INDEX}"
            )));
        }
        // index <= 4096 and n <= 64: the skip fits a usize.
        let skip = index as usize * n;
        Ok(primes_from(self.ngram_vocab_size_base)
            .skip(skip)
            .take(n)
            .collect())
    }

    /// The head offsets of PLE layer index `index`: prefix sums of its
    /// [`head_sizes`](Self::head_sizes), from 0.
    pub fn head_offsets(&self, index: u64) -> Result<Vec<u64>, ConfigError> {
        let mut acc = 0u64;
        self.head_sizes(index)?
            .into_iter()
            .map(|s| {
                let o = acc;
                acc = acc
                    .checked_add(s)
                    .ok_or_else(|| ConfigError::Derivation("head offsets overflow".into()))?;
                Ok(o)
            })
            .collect()
    }

    /// Rows of the table of PLE layer index `index`: its head sizes' sum
    /// rounded up to a multiple of `make_ngram_vocab_size_divisible_by`.
    pub fn table_rows(&self, index: u64) -> Result<u64, ConfigError> {
        let sum = self
            .head_sizes(index)?
            .iter()
            .try_fold(0u64, |a, &s| a.checked_add(s))
            .ok_or_else(|| ConfigError::Derivation("table rows overflow".into()))?;
        let d = self.make_ngram_vocab_size_divisible_by;
        if d == 0 {
            return Err(ConfigError::Derivation(
                "make_ngram_vocab_size_divisible_by is 0".into(),
            ));
        }
        sum.div_ceil(d)
            .checked_mul(d)
            .ok_or_else(|| ConfigError::Derivation("table rows overflow".into()))
    }

    /// The `ngram_size` hash multipliers of PLE layer index `index` (0 for
    /// the one PLE layer of the released model).
    pub fn multipliers(&self, index: u64) -> Result<Vec<u64>, ConfigError> {
        // One per n-gram order: bounded before the vector is made (a
        // config's ngram_size of 333333333 was 2.7 GB and seconds of work).
        if !(2..=crate::ngram::MAX_NGRAM as u32).contains(&self.ngram_size) {
            return Err(ConfigError::Derivation(format!(
                "ngram_size {} (2..={} supported)",
                self.ngram_size,
                crate::ngram::MAX_NGRAM
            )));
        }
        if self.vocab_size == 0 {
            return Err(ConfigError::Derivation("vocab_size is 0".into()));
        }
        let half_bound = (i64::MAX as u64 / self.vocab_size) / 2;
        if half_bound == 0 {
            return Err(ConfigError::Derivation(format!(
                "vocab_size {} leaves no multiplier range",
                self.vocab_size
            )));
        }
        let base = self
            .seed
            .wrapping_add(LAYER_SEED_STRIDE.wrapping_mul(index));
        Ok((0..u64::from(self.ngram_size))
            .map(|i| {
                let x = base.wrapping_add(SPLITMIX_GAMMA.wrapping_mul(i + 1));
                2 * (splitmix64(x) % half_bound) + 1
            })
            .collect())
    }

    /// The validated hash parameters of PLE layer index `index` against a
    /// table of `n_rows` rows.
    pub fn params(&self, index: u64, n_rows: u64) -> Result<QwenNgramParams, CheckedParamsError> {
        let sizes = self.head_sizes(index)?;
        let offsets = self.head_offsets(index)?;
        Ok(QwenNgramParams::new(
            self.ngram_size,
            self.heads_per_ngram,
            self.eos_token_id,
            self.image_token_id,
            self.multipliers(index)?,
            sizes,
            offsets,
            n_rows,
        )?)
    }
}

/// Errors building [`QwenNgramParams`] from a config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckedParamsError {
    /// The config itself.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The derived parameters do not fit the table.
    #[error(transparent)]
    Ngram(#[from] NgramError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngram::released::{QWEN_FULL_ROWS, QWEN_MULTIPLIERS};

    #[test]
    fn splitmix64_reference_values() {
        // Vigna's splitmix64.c seeded with 1234567: its first outputs.
        let mut state = 1_234_567u64;
        let mut next = || {
            let v = splitmix64(state);
            state = state.wrapping_add(SPLITMIX_GAMMA);
            v
        };
        assert_eq!(next(), 6_457_827_717_110_365_317);
        assert_eq!(next(), 3_203_168_211_198_807_973);
    }

    const RELEASED: &str = r#"{
        "model_type": "qwen4exp",
        "image_token_id": 248056,
        "text_config": {
            "ple_layer_ids": [2], "ple_embed_dim": 2560, "ngram_size": 3,
            "heads_per_ngram": 8, "ngram_vocab_size_base": 20000000,
            "make_ngram_vocab_size_divisible_by": 128, "split_ngram_parts": 128,
            "vocab_size": 248320, "eos_token_id": 248044, "seed": null
        }
    }"#;

    #[test]
    fn released_config_gives_released_constants() {
        let c = NgramConfig::from_json(RELEASED.as_bytes()).unwrap();
        assert_eq!(c.multipliers(0).unwrap(), QWEN_MULTIPLIERS);
        assert_eq!(c.table_rows(0).unwrap(), QWEN_FULL_ROWS);
        assert_eq!(c.ple_layer_ids, Some(vec![2]));
        assert_eq!(c.ple_layer_index(1, &[]), Some(0));
        assert_eq!(c.ple_layer_index(2, &[1, 2]), None);
        assert_eq!(c.split_ngram_parts, Some(128));
        let p = c.params(0, QWEN_FULL_ROWS).unwrap();
        assert_eq!(p, QwenNgramParams::released());
    }

    #[test]
    fn top_level_keys_and_errors() {
        let top = r#"{"ngram_size": 3, "heads_per_ngram": 8, "ngram_vocab_size_base": 20000000,
            "make_ngram_vocab_size_divisible_by": 128, "vocab_size": 248320,
            "eos_token_id": [248044, 248046]}"#;
        let c = NgramConfig::from_json(top.as_bytes()).unwrap();
        assert_eq!(c.eos_token_id, 248044);
        assert_eq!(c.seed, DEFAULT_SEED);
        assert_eq!(c.split_ngram_parts, None);
        assert!(matches!(
            NgramConfig::from_json(b"{\"ngram_size\": 3}"),
            Err(ConfigError::MissingKey { .. })
        ));
        assert!(matches!(
            NgramConfig::from_json(top.replace("128", "-1").as_bytes()),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            NgramConfig::from_json(b"[1]"),
            Err(ConfigError::BadJson { .. })
        ));
        let other_seed = NgramConfig {
            seed: 1,
            ..c.clone()
        };
        assert_ne!(other_seed.multipliers(0).unwrap(), QWEN_MULTIPLIERS);
        assert!(c.multipliers(0).unwrap().iter().all(|m| m % 2 == 1));
    }

    #[test]
    fn later_ple_layers_continue_the_primes_and_reseed() {
        // Values transformers 5.19 derives (Qwen4ExpTextNGramEmbedding on
        // the meta device) for base 4283, ple_layer_ids [3, 1]: PLE layer
        // index 1 is decoder layer 2.
        let c = NgramConfig {
            ngram_vocab_size_base: 4283,
            ple_layer_ids: Some(vec![3, 1]),
            ..NgramConfig::from_json(RELEASED.as_bytes()).unwrap()
        };
        assert_eq!(c.ple_layer_index(0, &[]), Some(0));
        assert_eq!(c.ple_layer_index(2, &[]), Some(1));
        assert_eq!(c.ple_layer_index(1, &[0, 1, 2]), None);
        let first = c.head_sizes(0).unwrap();
        let second = c.head_sizes(1).unwrap();
        assert_eq!(first[0], 4283);
        assert_eq!(second[0], primes_from(first[15] + 1).next().unwrap());
        let all: Vec<u64> = primes_from(4283).take(32).collect();
        assert_eq!([first, second.clone()].concat(), all);
        assert_eq!(c.head_offsets(1).unwrap()[0], 0);
        assert_eq!(c.head_offsets(1).unwrap()[1], second[0]);
        assert_eq!(c.table_rows(0).unwrap(), 69888);
        assert_eq!(c.table_rows(1).unwrap(), 72192);
        assert_eq!(
            c.multipliers(1).unwrap(),
            [3352040966061, 19752442147475, 10742103100073]
        );
        assert_eq!(c.multipliers(0).unwrap(), QWEN_MULTIPLIERS);
        // Without ple_layer_ids, the layers found stand in.
        let bare = NgramConfig {
            ple_layer_ids: None,
            ..c.clone()
        };
        assert_eq!(bare.ple_layer_index(5, &[2, 5]), Some(1));
        assert_eq!(bare.ple_layer_index(4, &[2, 5]), None);
        assert!(c.head_sizes(MAX_PLE_LAYER_INDEX + 1).is_err());
        // A huge ngram_size is refused, not allocated (a fuzz finding).
        let huge = NgramConfig {
            ngram_size: 333_333_333,
            ..c.clone()
        };
        assert!(huge.multipliers(0).is_err());
    }
}
