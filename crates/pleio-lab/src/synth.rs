//! Synthetic model files: the real architectures' metadata and PLE tensor
//! shape, filled with seeded random valid blocks (or left as a sparse hole).
//!
//! Used by `pleio synth`, the demo and the tests.

use crate::random::{fill_random_blocks, Rng};
use pleio::gguf::{Array, GgufError, GgufWriter, Sink, Value};
use pleio::layout::PLE_TENSOR;
use pleio::ngram::released::*;
use pleio::quant::{can_decode, DecodeError, GgmlType};

/// Elements per row of a Gemma 4 PLE table with `n_layer` layers
/// (saturating: [`SynthSpec::row_bytes`] refuses layer counts that do not
/// fit the file's `u32` key).
pub fn gemma_row_elems(n_layer: u64) -> u64 {
    GEMMA_PER_LAYER.saturating_mul(n_layer)
}

/// True if `ty` can hold a qwen4exp row (160 elements is whole blocks).
pub fn fits_qwen_row(ty: GgmlType) -> bool {
    ty.row_bytes(QWEN_ROW_ELEMS).is_some()
}

/// Which architecture's metadata and table shape to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Qwen3.8-Flash-Next: `[160, rows]` n-gram table.
    Qwen4exp,
    /// Gemma 4: `[256 * n_layer, vocab]`, one row per token.
    Gemma4,
}

impl Arch {
    /// The `general.architecture` string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen4exp => "qwen4exp",
            Arch::Gemma4 => "gemma4",
        }
    }
}

/// What to synthesize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthSpec {
    /// Architecture.
    pub arch: Arch,
    /// Type of the PLE table.
    pub ty: GgmlType,
    /// Rows of the PLE table.
    pub rows: u64,
    /// Seed of the random blocks.
    pub seed: u64,
    /// Leave the table as a hole (reads as zero blocks) instead of writing it.
    pub sparse: bool,
    /// Gemma 4 layers (row width `256 * n_layer`); ignored for qwen4exp.
    pub gemma_layers: u64,
}

/// Errors writing a synthetic file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SynthError {
    /// The row width is not a whole number of blocks of the type.
    #[error("{ty} cannot hold a {arch} row of {row_elems} elements (blocks of {block})", arch = .arch.name(), block = .ty.block_elems())]
    TypeDoesNotFit {
        /// Architecture.
        arch: Arch,
        /// Type asked for.
        ty: GgmlType,
        /// Elements per row.
        row_elems: u64,
    },
    /// Too few rows for the architecture.
    #[error("{rows} rows are too few: {arch} needs at least {min}", arch = .arch.name())]
    TooFewRows {
        /// Architecture.
        arch: Arch,
        /// Rows asked for.
        rows: u64,
        /// Least rows allowed.
        min: u64,
    },
    /// A gemma4 layer count of 0 or more than `u32::MAX` (the
    /// `block_count` key is a `u32`).
    #[error("{layers} layers: gemma4 needs 1 to {} layers", u32::MAX)]
    BadLayers {
        /// Layers asked for.
        layers: u64,
    },
    /// The type has no decoder, so no valid random blocks can be made.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// Writing the file failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// Bytes of random rows generated per write.
const CHUNK_BYTES: usize = 8 << 20;

impl SynthSpec {
    /// A qwen4exp table of `rows` rows of `ty`.
    pub fn qwen(ty: GgmlType, rows: u64, seed: u64) -> SynthSpec {
        SynthSpec {
            arch: Arch::Qwen4exp,
            ty,
            rows,
            seed,
            sparse: false,
            gemma_layers: 42,
        }
    }

    /// A gemma4 table of `rows` rows of `256 * n_layer` elements of `ty`.
    pub fn gemma(ty: GgmlType, rows: u64, n_layer: u64, seed: u64) -> SynthSpec {
        SynthSpec {
            arch: Arch::Gemma4,
            ty,
            rows,
            seed,
            sparse: false,
            gemma_layers: n_layer,
        }
    }

    /// Elements per row of the PLE table.
    pub fn row_elems(&self) -> u64 {
        match self.arch {
            Arch::Qwen4exp => QWEN_ROW_ELEMS,
            Arch::Gemma4 => gemma_row_elems(self.gemma_layers),
        }
    }

    /// Bytes per row, or an error if the type cannot hold the row.
    pub fn row_bytes(&self) -> Result<u64, SynthError> {
        if self.arch == Arch::Gemma4 && !(1..=u64::from(u32::MAX)).contains(&self.gemma_layers) {
            return Err(SynthError::BadLayers {
                layers: self.gemma_layers,
            });
        }
        self.ty
            .row_bytes(self.row_elems())
            .filter(|&b| b > 0)
            .ok_or(SynthError::TypeDoesNotFit {
                arch: self.arch,
                ty: self.ty,
                row_elems: self.row_elems(),
            })
    }

    /// Bytes of the PLE table.
    pub fn table_bytes(&self) -> Result<u64, SynthError> {
        Ok(self.row_bytes()?.saturating_mul(self.rows))
    }

    /// The metadata pairs written for this spec (architecture keys with the
    /// released values, the head layout scaled to `rows`).
    pub fn metadata(&self) -> Result<Vec<(String, Value)>, SynthError> {
        let arch = self.arch.name();
        let k = |s: &str| format!("{arch}.{s}");
        let mut m: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            (
                "general.name".into(),
                Value::String(format!("pleio synthetic {arch} {}", self.ty)),
            ),
            ("pleio.synth.seed".into(), Value::U64(self.seed)),
        ];
        match self.arch {
            Arch::Qwen4exp => {
                let heads = QwenHeads::for_rows(self.rows).ok_or(SynthError::TooFewRows {
                    arch: self.arch,
                    rows: self.rows,
                    min: QwenHeads::min_rows(),
                })?;
                m.extend([
                    (
                        k("embedding_length_per_layer_input"),
                        Value::U32(QWEN_ROW_ELEMS as u32),
                    ),
                    (k("ple.ngram_size"), Value::U32(QWEN_NGRAM_SIZE)),
                    (k("ple.heads_per_ngram"), Value::U32(QWEN_HEADS_PER_NGRAM)),
                    (k("ple.eos_token_id"), Value::U32(QWEN_EOS)),
                    (k("ple.image_token_id"), Value::U32(QWEN_IMAGE)),
                    (k("ple.layers"), Value::Array(Array::I32(vec![1]))),
                    (
                        k("ple.layer_multipliers"),
                        Value::Array(Array::U64(QWEN_MULTIPLIERS.to_vec())),
                    ),
                    (
                        k("ple.head_vocab_sizes"),
                        Value::Array(Array::U64(heads.sizes)),
                    ),
                    (
                        k("ple.head_offsets"),
                        Value::Array(Array::U64(heads.offsets)),
                    ),
                ]);
            }
            Arch::Gemma4 => {
                if self.rows == 0 {
                    return Err(SynthError::TooFewRows {
                        arch: self.arch,
                        rows: 0,
                        min: 1,
                    });
                }
                m.extend([
                    (
                        k("embedding_length_per_layer_input"),
                        Value::U32(GEMMA_PER_LAYER as u32),
                    ),
                    (
                        k("block_count"),
                        Value::U32(u32::try_from(self.gemma_layers).map_err(|_| {
                            SynthError::BadLayers {
                                layers: self.gemma_layers,
                            }
                        })?),
                    ),
                    (
                        k("vocab_size"),
                        Value::U32(self.rows.min(u32::MAX as u64) as u32),
                    ),
                ]);
            }
        }
        Ok(m)
    }

    /// Writes the file to `out`, calling `progress` with the table bytes
    /// done so far. Returns the sink.
    pub fn write<W: Sink>(&self, out: W, progress: &mut dyn FnMut(u64)) -> Result<W, SynthError> {
        let row_bytes = self.row_bytes()?;
        if !can_decode(self.ty) {
            return Err(DecodeError::Unsupported(self.ty).into());
        }
        let mut w = GgufWriter::new(out);
        for (key, value) in self.metadata()? {
            w.add_metadata(key, value)?;
        }
        w.add_tensor(PLE_TENSOR, self.ty, &[self.row_elems(), self.rows])?;
        w.begin_data()?;
        // add_tensor checked that the table's bytes fit in 64 bits.
        let total = row_bytes.saturating_mul(self.rows);
        if self.sparse {
            w.skip_tensor_data(total)?;
            progress(total);
            return Ok(w.finish()?);
        }
        // Whole rows per chunk; rows larger than a chunk go in whole blocks.
        let chunk = if row_bytes <= CHUNK_BYTES as u64 {
            (CHUNK_BYTES as u64 / row_bytes) * row_bytes
        } else {
            let bb = self.ty.block_bytes() as u64;
            (CHUNK_BYTES as u64 / bb).max(1) * bb
        };
        let mut buf = vec![0u8; chunk as usize];
        let mut rng = Rng::new(self.seed);
        let mut done = 0u64;
        while done < total {
            let n = (total - done).min(buf.len() as u64) as usize;
            fill_random_blocks(self.ty, &mut rng, &mut buf[..n])?;
            w.write_tensor_data(&buf[..n])?;
            done += n as u64;
            progress(done);
        }
        Ok(w.finish()?)
    }
}
