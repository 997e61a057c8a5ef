//! Row encodings of safetensors checkpoints: BF16/F16/F32 rows, FP8 E4M3
//! with a per-tensor or per-row scale, NVFP4 and MLX affine 4-bit.
//!
//! A row is stored in one to three *parts* (separate regions of the file):
//!
//! | encoding | parts of a row of `n` elements |
//! |---|---|
//! | [`Encoding::Bf16`], [`Encoding::F16`], [`Encoding::F32`] | the `n` elements |
//! | [`Encoding::Fp8`] per tensor | `n` E4M3 bytes |
//! | [`Encoding::Fp8`] per row | `n` E4M3 bytes; one scale (BF16, F16 or F32) |
//! | [`Encoding::Nvfp4`] | `n / 2` bytes of nibbles; `n / 16` E4M3 block scales |
//! | [`Encoding::Mlx4`] | `n / 8` little-endian `u32` words; `n / 32` BF16 scales; `n / 32` BF16 biases |
//!
//! # Exact formulas (every operation an IEEE binary32 operation, round to
//! nearest even, no fused multiply-add)
//!
//! - **E4M3** (`float8_e4m3fn`): sign, 4 exponent bits (bias 7), 3 mantissa
//!   bits; exponent 0 is subnormal (`m * 2^-9`); no infinities; `S.1111.111`
//!   is NaN; largest finite 448. [`e4m3_to_f32`] is exact.
//! - **BF16/F16/F32 rows**: the exact f32 value of each element (the GGUF
//!   decoders of the same types; NaN bits are kept as stored).
//! - **FP8, scale `s`** (the scale converted exactly to f32):
//!   `y = e4m3(q) * s`. With a BF16 (or F16) scale the product is exact (a
//!   4-bit times an 8- or 11-bit significand), so the only rounding is the
//!   caller's later conversion, and `bf16(y)` equals the engines'
//!   `bf16(f32(e4m3) * f32(scale))`.
//! - **NVFP4**, element `j` of a row: code `c` = low nibble of byte `j / 2`
//!   for even `j`, high nibble for odd `j`; `v = LUT[c & 7]` with
//!   `LUT = {0, 0.5, 1, 1.5, 2, 3, 4, 6}`, negated (`-v`, so code 8 is -0.0)
//!   when `c & 8`; `y = (v * e4m3(scale[j / 16])) * global`. The first
//!   product is exact, so `y` is the exact value rounded once.
//! - **MLX affine 4-bit**, group 32: `q = (word[j / 8] >> (4 * (j % 8))) &
//!   15` (so within each little-endian word, low nibble first);
//!   `y = (f32(scale[j / 32]) * q) + f32(bias[j / 32])`. The product is
//!   exact, so a fused multiply-add would give the same `y`.
//!
//! NaN: an FP8, NVFP4 or MLX result that is NaN is written as the canonical
//! quiet NaN `0x7FC00000` (PyTorch's bf16 NaN once converted), whatever NaN
//! operand produced it; so every output is defined bit for bit.
//!
//! [`EncodingDecoder`] picks an AVX2 + F16C kernel at run time where one
//! exists (writing f32, or bf16/f16 directly without an f32 pass); it gives
//! the same bits as the scalar reference (tested).

use super::convert::{f32_to_bf16, f32_to_bf16_row_scalar, f32_to_f16, f32_to_f16_row_scalar};
use super::encoding_simd::{Simd, Vbmi};
use super::float::{bf16_to_f32, f16_to_f32};
use crate::quant::Rounding;

/// The canonical NaN every quantized decoder writes.
pub const CANONICAL_NAN: u32 = 0x7FC0_0000;

/// Element type of a per-row FP8 scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleType {
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
    /// IEEE single.
    F32,
}

impl ScaleType {
    /// Bytes of one scale.
    pub fn size(self) -> usize {
        match self {
            ScaleType::Bf16 | ScaleType::F16 => 2,
            ScaleType::F32 => 4,
        }
    }

    /// The exact f32 value of the little-endian scale at the start of `b`
    /// (which holds at least [`size`](Self::size) bytes).
    pub fn read(self, b: &[u8]) -> f32 {
        match self {
            ScaleType::Bf16 => bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            ScaleType::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            ScaleType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        }
    }
}

/// The scale of an FP8 table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fp8Scale {
    /// One scale for the whole table (`ngram_embedding.weight_scale`),
    /// already converted exactly to f32.
    PerTensor(f32),
    /// One scale per row, stored in a second part.
    PerRow(ScaleType),
}

/// How a row of a checkpoint table is stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Encoding {
    /// bfloat16 elements.
    Bf16,
    /// IEEE half elements.
    F16,
    /// IEEE single elements.
    F32,
    /// FP8 E4M3 elements times a scale.
    Fp8(Fp8Scale),
    /// NVFP4: E2M1 nibbles, an E4M3 scale per 16 elements, one global
    /// f32 scale (`weight_scale_2`).
    Nvfp4 {
        /// The global scale.
        global_scale: f32,
    },
    /// MLX affine 4-bit, groups of [`MLX_GROUP`]: `u32` words of nibbles,
    /// BF16 scale and bias per group.
    Mlx4,
}

/// Elements per NVFP4 block scale.
pub const NVFP4_BLOCK: usize = 16;
/// Elements per MLX 4-bit group.
pub const MLX_GROUP: usize = 32;

/// Errors from decoding encoded rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodingError {
    /// The row width is not a whole number of the encoding's groups.
    #[error("{encoding}: rows of {row_elems} elements are not whole groups of {group}")]
    RowElems {
        /// The encoding's name.
        encoding: &'static str,
        /// Elements per row.
        row_elems: usize,
        /// Group size it needs.
        group: usize,
    },
    /// The number of parts given differs from the encoding's.
    #[error("{encoding}: {given} row parts given, the encoding has {expected}")]
    PartCount {
        /// The encoding's name.
        encoding: &'static str,
        /// Parts given.
        given: usize,
        /// Parts needed.
        expected: usize,
    },
    /// A part's length differs from what the row needs.
    #[error("{encoding}: row part {part} has {given} bytes, the row needs {expected}")]
    PartLength {
        /// The encoding's name.
        encoding: &'static str,
        /// Which part.
        part: usize,
        /// Bytes given.
        given: usize,
        /// Bytes needed.
        expected: usize,
    },
    /// The output slice does not hold exactly one row.
    #[error("output holds {given} elements, a row has {expected}")]
    OutputLength {
        /// Elements of room given.
        given: usize,
        /// Elements per row.
        expected: usize,
    },
    /// A rounding rule that does not apply to the encoding.
    #[error("rounding rule {rule} does not apply to {encoding} tables: {why}")]
    Rounding {
        /// The rule's name.
        rule: &'static str,
        /// The encoding's name.
        encoding: &'static str,
        /// Why, and what does apply.
        why: &'static str,
    },
}

impl Encoding {
    /// A short name (`bf16`, `fp8`, `fp8-row`, `nvfp4`, `mlx4`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Encoding::Bf16 => "bf16",
            Encoding::F16 => "f16",
            Encoding::F32 => "f32",
            Encoding::Fp8(Fp8Scale::PerTensor(_)) => "fp8",
            Encoding::Fp8(Fp8Scale::PerRow(_)) => "fp8-row",
            Encoding::Nvfp4 { .. } => "nvfp4",
            Encoding::Mlx4 => "mlx4",
        }
    }

    /// Elements a row must be a multiple of.
    pub fn group(&self) -> usize {
        match self {
            Encoding::Nvfp4 { .. } => NVFP4_BLOCK,
            Encoding::Mlx4 => MLX_GROUP,
            _ => 1,
        }
    }

    /// Bytes of each part of a row of `row_elems` elements (1 to 3 parts),
    /// or an error if the width is not whole groups.
    pub fn part_bytes(&self, row_elems: usize) -> Result<PartSizes, EncodingError> {
        let g = self.group();
        if !row_elems.is_multiple_of(g) {
            return Err(EncodingError::RowElems {
                encoding: self.name(),
                row_elems,
                group: g,
            });
        }
        let n = row_elems;
        let (sizes, count) = match self {
            Encoding::Bf16 | Encoding::F16 => ([2 * n, 0, 0], 1),
            Encoding::F32 => ([4 * n, 0, 0], 1),
            Encoding::Fp8(Fp8Scale::PerTensor(_)) => ([n, 0, 0], 1),
            Encoding::Fp8(Fp8Scale::PerRow(t)) => ([n, t.size(), 0], 2),
            Encoding::Nvfp4 { .. } => ([n / 2, n / NVFP4_BLOCK, 0], 2),
            Encoding::Mlx4 => ([n / 2, 2 * (n / MLX_GROUP), 2 * (n / MLX_GROUP)], 3),
        };
        Ok(PartSizes { sizes, count })
    }
}

/// Bytes of each part of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartSizes {
    sizes: [usize; 3],
    count: usize,
}

impl PartSizes {
    /// The sizes, one per part.
    pub fn as_slice(&self) -> &[usize] {
        &self.sizes[..self.count]
    }

    /// Total bytes of a row.
    pub fn total(&self) -> usize {
        self.as_slice().iter().sum()
    }
}

/// Converts an E4M3 (`float8_e4m3fn`) byte to f32, exactly; both NaN codes
/// (`0x7F`, `0xFF`) give [`CANONICAL_NAN`].
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    f32::from_bits(E4M3_BITS[b as usize])
}

/// f32 bits of every E4M3 byte (built with integer operations).
static E4M3_BITS: [u32; 256] = e4m3_table();

const fn e4m3_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut b = 0usize;
    while b < 256 {
        let sign = ((b as u32) & 0x80) << 24;
        let e = ((b >> 3) & 0xF) as u32;
        let m = (b & 7) as u32;
        t[b] = if e == 15 && m == 7 {
            CANONICAL_NAN
        } else if e == 0 {
            if m == 0 {
                sign
            } else {
                // m * 2^-9 with the top set bit p of m as the implicit one.
                let p = 31 - m.leading_zeros();
                sign | ((p + 127 - 9) << 23) | ((m - (1 << p)) << (23 - p))
            }
        } else {
            sign | ((e + 120) << 23) | (m << 20)
        };
        b += 1;
    }
    t
}

/// `v` unless it is NaN, else [`CANONICAL_NAN`].
#[inline(always)]
fn canon(v: f32) -> f32 {
    if v.is_nan() {
        f32::from_bits(CANONICAL_NAN)
    } else {
        v
    }
}

/// Signed NVFP4 (E2M1) values by code: `LUT[c & 7]`, negated when `c & 8`.
pub const NVFP4_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Elements decoded per step when the scalar path converts to 16-bit
/// outputs.
const CHUNK: usize = 256;

/// A row decoder for one encoding and row width, chosen once (SIMD where
/// the CPU has it). Cheap to copy between threads.
#[derive(Clone)]
pub struct EncodingDecoder {
    enc: Encoding,
    row_elems: usize,
    parts: PartSizes,
    simd: Option<Simd>,
    /// FP8 per tensor: `e4m3(c) * s` by code, NaN canonical.
    lut: Option<Box<[f32; 256]>>,
    /// FP8 per tensor, with AVX-512 VBMI: the bfloat16 bits of `lut`, as
    /// low and high byte tables.
    bf16_lut: Option<(Vbmi, Box<ByteTables>)>,
    /// The rule 16-bit (and, for [`Rounding::Mlx`], f32) outputs follow.
    rounding: Rounding,
    /// [`Rounding::Vllm`] on FP8: the exact decoders whose 16-bit outputs
    /// are vLLM's bf16 and f16 ones: the same codes with the per-tensor
    /// scale rounded to bf16 and to f16 first; for per-row scales, an
    /// FP8 decoder with an f32 scale part, given the rounded scale.
    vllm: Option<Box<[EncodingDecoder; 2]>>,
}

/// The low and high bytes of 256 16-bit table entries.
type ByteTables = ([u8; 256], [u8; 256]);

/// Where [`EncodingDecoder::decode_rows`] writes: f32s, or 16-bit values
/// (bfloat16 bits when the flag is true, else IEEE half).
pub(crate) enum RowsOut<'a> {
    F32(&'a mut [f32]),
    Half(bool, &'a mut [u16]),
}

impl std::fmt::Debug for EncodingDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodingDecoder")
            .field("encoding", &self.enc)
            .field("row_elems", &self.row_elems)
            .field("simd", &self.simd.is_some())
            .field("rounding", &self.rounding)
            .finish()
    }
}

impl EncodingDecoder {
    /// The fastest exact decoder this CPU has for rows of `row_elems`
    /// elements of `enc`.
    pub fn new(enc: Encoding, row_elems: usize) -> Result<Self, EncodingError> {
        let mut d = Self::scalar(enc, row_elems)?;
        d.simd = Simd::detect();
        if let (Some(vbmi), Some(lut)) = (Vbmi::detect(), d.lut.as_deref()) {
            // The bf16 result of each code is the scalar reference's, so
            // the table lookup is exact by construction.
            let mut t = Box::new(([0u8; 256], [0u8; 256]));
            for (c, &y) in lut.iter().enumerate() {
                let [lo, hi] = super::convert::f32_to_bf16(y).to_le_bytes();
                (t.0[c], t.1[c]) = (lo, hi);
            }
            d.bf16_lut = Some((vbmi, t));
        }
        Ok(d)
    }

    /// The portable scalar reference decoder.
    pub fn scalar(enc: Encoding, row_elems: usize) -> Result<Self, EncodingError> {
        let parts = enc.part_bytes(row_elems)?;
        let lut = match enc {
            Encoding::Fp8(Fp8Scale::PerTensor(s)) => {
                let mut t = Box::new([0f32; 256]);
                for (c, y) in t.iter_mut().enumerate() {
                    *y = canon(e4m3_to_f32(c as u8) * s);
                }
                Some(t)
            }
            _ => None,
        };
        Ok(EncodingDecoder {
            enc,
            row_elems,
            parts,
            simd: None,
            lut,
            bf16_lut: None,
            rounding: Rounding::Exact,
            vllm: None,
        })
    }

    /// This decoder following `rounding` (see [`Rounding`]):
    ///
    /// - [`Rounding::Exact`]: every encoding, unchanged;
    /// - [`Rounding::Vllm`]: FP8 (per-tensor and per-row scales), whose
    ///   16-bit outputs become `dtype(e4m3 * dtype(scale))` (f32 stays
    ///   exact); NVFP4, whose every output becomes the conversion of
    ///   `v * (e4m3(scale) * global)` (vLLM's CPU `dequantize_to_dtype`);
    ///   BF16, F16 and F32 rows, unchanged;
    /// - [`Rounding::Mlx`]: MLX 4-bit, whose every output (f32 included)
    ///   becomes the dtype conversion of mlx's bf16 result
    ///   `bf16(bf16(scale * q) + bias)`; BF16 rows, unchanged.
    ///
    /// Any other pair is an [`EncodingError::Rounding`].
    pub fn with_rounding(mut self, rounding: Rounding) -> Result<Self, EncodingError> {
        let refuse = |why: &'static str| EncodingError::Rounding {
            rule: rounding.name(),
            encoding: self.enc.name(),
            why,
        };
        match (rounding, self.enc) {
            (Rounding::Exact, _)
            | (Rounding::Vllm, Encoding::Bf16 | Encoding::F16 | Encoding::F32)
            | (Rounding::Mlx, Encoding::Bf16) => {}
            (Rounding::Vllm, Encoding::Fp8(scale)) => {
                let simd = self.simd.is_some();
                let make = |enc: Encoding| {
                    if simd {
                        EncodingDecoder::new(enc, self.row_elems)
                    } else {
                        EncodingDecoder::scalar(enc, self.row_elems)
                    }
                };
                let pair = match scale {
                    Fp8Scale::PerTensor(s) => [
                        make(Encoding::Fp8(Fp8Scale::PerTensor(round_bf16(s))))?,
                        make(Encoding::Fp8(Fp8Scale::PerTensor(round_f16(s))))?,
                    ],
                    Fp8Scale::PerRow(_) => {
                        let d = make(Encoding::Fp8(Fp8Scale::PerRow(ScaleType::F32)))?;
                        [d.clone(), d]
                    }
                };
                self.vllm = Some(Box::new(pair));
            }
            (Rounding::Vllm, Encoding::Nvfp4 { .. }) => {
                // The rule's order of products has no SIMD kernel: scalar.
                self.simd = None;
            }
            (Rounding::Vllm, Encoding::Mlx4) => {
                return Err(refuse(
                    "vLLM does not serve MLX 4-bit tables; the mlx rule is mlx's (use mlx or exact)",
                ))
            }
            (Rounding::Mlx, Encoding::Mlx4) => {
                // The rule's bf16 arithmetic has no SIMD kernel: scalar.
                self.simd = None;
            }
            (Rounding::Mlx, _) => {
                return Err(refuse(
                    "the mlx rule is mlx's dequantize of MLX 4-bit tables (and is exact on BF16 rows); use exact or vllm",
                ))
            }
        }
        self.rounding = rounding;
        Ok(self)
    }

    /// The rule this decoder follows.
    pub fn rounding(&self) -> Rounding {
        self.rounding
    }

    /// The encoding.
    pub fn encoding(&self) -> Encoding {
        self.enc
    }

    /// Elements per row.
    pub fn row_elems(&self) -> usize {
        self.row_elems
    }

    /// Bytes of each part of a row.
    pub fn part_bytes(&self) -> PartSizes {
        self.parts
    }

    /// True if a SIMD kernel is used.
    pub fn is_simd(&self) -> bool {
        self.simd.is_some()
    }

    fn check(&self, parts: &[&[u8]], out_len: usize) -> Result<(), EncodingError> {
        let want = self.parts.as_slice();
        if parts.len() != want.len() {
            return Err(EncodingError::PartCount {
                encoding: self.enc.name(),
                given: parts.len(),
                expected: want.len(),
            });
        }
        for (i, (p, &w)) in parts.iter().zip(want).enumerate() {
            if p.len() != w {
                return Err(EncodingError::PartLength {
                    encoding: self.enc.name(),
                    part: i,
                    given: p.len(),
                    expected: w,
                });
            }
        }
        if out_len != self.row_elems {
            return Err(EncodingError::OutputLength {
                given: out_len,
                expected: self.row_elems,
            });
        }
        Ok(())
    }

    /// Decodes one row, given as its parts in order, into `dst` (f32).
    pub fn decode_f32(&self, parts: &[&[u8]], dst: &mut [f32]) -> Result<(), EncodingError> {
        self.check(parts, dst.len())?;
        self.f32_checked(parts, dst);
        Ok(())
    }

    /// Decodes one row into bfloat16 bits: the f32 value rounded to
    /// nearest even ([`super::convert::f32_to_bf16`]).
    pub fn decode_bf16(&self, parts: &[&[u8]], dst: &mut [u16]) -> Result<(), EncodingError> {
        self.check(parts, dst.len())?;
        self.half_checked(true, parts, dst);
        Ok(())
    }

    /// Decodes one row into IEEE half bits, rounded to nearest even
    /// ([`super::convert::f32_to_f16`]).
    pub fn decode_f16(&self, parts: &[&[u8]], dst: &mut [u16]) -> Result<(), EncodingError> {
        self.check(parts, dst.len())?;
        self.half_checked(false, parts, dst);
        Ok(())
    }

    /// True when each element decodes from its own stored bytes alone (one
    /// part, no per-row or per-group scale): BF16, F16, F32 and per-tensor
    /// FP8 rows. Rows stored one after another then decode as one long row.
    fn is_elementwise(&self) -> bool {
        matches!(
            self.enc,
            Encoding::Bf16 | Encoding::F16 | Encoding::F32 | Encoding::Fp8(Fp8Scale::PerTensor(_))
        )
    }

    /// Decodes `staged`, whole rows' stored bytes (each its parts in part
    /// order) one after another, into `dst` (see [`RowsOut`]), each row as
    /// [`decode_f32`](Self::decode_f32), [`decode_bf16`](Self::decode_bf16)
    /// or [`decode_f16`](Self::decode_f16) writes it. Element-wise
    /// encodings decode in one pass; the others row by row, with the
    /// lengths checked once for the batch. An error if `staged` is not
    /// whole rows or `dst` does not hold exactly as many.
    pub(crate) fn decode_rows(
        &self,
        staged: &[u8],
        dst: RowsOut<'_>,
    ) -> Result<(), EncodingError> {
        let total = self.parts.total();
        let rows = staged.len().checked_div(total).unwrap_or(0);
        let out_len = match &dst {
            RowsOut::F32(d) => d.len(),
            RowsOut::Half(_, d) => d.len(),
        };
        if total == 0 || !staged.len().is_multiple_of(total) || rows.checked_mul(self.row_elems) != Some(out_len)
        {
            return Err(EncodingError::OutputLength {
                given: out_len,
                expected: rows.saturating_mul(self.row_elems),
            });
        }
        if self.is_elementwise() {
            let parts = [staged];
            match dst {
                RowsOut::F32(d) => self.f32_checked(&parts, d),
                RowsOut::Half(bf16, d) => self.half_checked(bf16, &parts, d),
            }
            return Ok(());
        }
        let sizes = self.parts.as_slice();
        let (n, k) = (self.row_elems, sizes.len());
        let split = |row| split_parts(row, sizes);
        match dst {
            RowsOut::F32(d) => {
                for (row, y) in staged.chunks_exact(total).zip(d.chunks_exact_mut(n)) {
                    self.f32_checked(&split(row)[..k], y);
                }
            }
            RowsOut::Half(bf16, d) => {
                for (row, y) in staged.chunks_exact(total).zip(d.chunks_exact_mut(n)) {
                    self.half_checked(bf16, &split(row)[..k], y);
                }
            }
        }
        Ok(())
    }

    /// [`decode_f32`](Self::decode_f32) of parts of checked lengths (or,
    /// element-wise, any whole number of rows).
    fn f32_checked(&self, parts: &[&[u8]], dst: &mut [f32]) {
        if let Some(simd) = self.simd {
            if simd.decode_f32(&self.enc, parts, 0, dst) {
                return;
            }
        }
        self.scalar_range(parts, 0, dst);
    }

    /// The 16-bit decode of parts of checked lengths: bfloat16 bits
    /// (`bf16`) or IEEE half.
    fn half_checked(&self, bf16: bool, parts: &[&[u8]], dst: &mut [u16]) {
        if let Some(v) = &self.vllm {
            return self.vllm_half(&v[usize::from(!bf16)], bf16, parts, dst);
        }
        if let (true, Some((vbmi, t))) = (bf16, &self.bf16_lut) {
            vbmi.lookup16(&t.0, &t.1, parts[0], dst);
            return;
        }
        if let Some(simd) = self.simd {
            let done = if bf16 {
                simd.decode_bf16(&self.enc, parts, 0, dst)
            } else {
                simd.decode_f16(&self.enc, parts, 0, dst)
            };
            if done {
                return;
            }
        }
        if bf16 {
            self.chunked(parts, dst, f32_to_bf16_row_scalar);
        } else {
            self.chunked(parts, dst, f32_to_f16_row_scalar);
        }
    }

    /// vLLM's 16-bit output of checked FP8 parts, by the exact decoder
    /// `sub` of the rounded scale (per tensor: built in; per row: the
    /// row's scale rounded to bf16 (`bf16 == true`) or f16 here).
    fn vllm_half(&self, sub: &EncodingDecoder, bf16: bool, parts: &[&[u8]], dst: &mut [u16]) {
        let scale;
        let mut row = [parts[0], &[][..]];
        let parts = match self.enc {
            Encoding::Fp8(Fp8Scale::PerRow(t)) => {
                let s = t.read(parts[1]);
                scale = if bf16 { round_bf16(s) } else { round_f16(s) }.to_le_bytes();
                row[1] = &scale;
                &row[..]
            }
            _ => parts,
        };
        sub.half_checked(bf16, parts, dst)
    }

    /// The reference path for 16-bit outputs: f32 chunks, then converted.
    fn chunked(&self, parts: &[&[u8]], dst: &mut [u16], conv: fn(&[f32], &mut [u16])) {
        let mut buf = [0f32; CHUNK];
        for (k, out) in dst.chunks_mut(CHUNK).enumerate() {
            let tmp = &mut buf[..out.len()];
            self.scalar_range(parts, k * CHUNK, tmp);
            conv(tmp, out);
        }
    }

    /// The scalar reference for elements `start .. start + dst.len()` of a
    /// checked row; `start` is a multiple of the group (CHUNK is a multiple
    /// of every group, and the row is whole groups).
    fn scalar_range(&self, parts: &[&[u8]], start: usize, dst: &mut [f32]) {
        let n = dst.len();
        match self.enc {
            Encoding::Bf16 => {
                for (y, b) in dst.iter_mut().zip(parts[0][2 * start..].chunks_exact(2)) {
                    *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Encoding::F16 => {
                for (y, b) in dst.iter_mut().zip(parts[0][2 * start..].chunks_exact(2)) {
                    *y = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Encoding::F32 => {
                for (y, b) in dst.iter_mut().zip(parts[0][4 * start..].chunks_exact(4)) {
                    *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Encoding::Fp8(Fp8Scale::PerTensor(_)) => {
                let lut = self.lut.as_deref().expect("per-tensor FP8 has a table");
                for (y, &q) in dst.iter_mut().zip(&parts[0][start..start + n]) {
                    *y = lut[q as usize];
                }
            }
            Encoding::Fp8(Fp8Scale::PerRow(t)) => {
                let s = t.read(parts[1]);
                for (y, &q) in dst.iter_mut().zip(&parts[0][start..start + n]) {
                    *y = canon(e4m3_to_f32(q) * s);
                }
            }
            Encoding::Nvfp4 { global_scale } => {
                let vllm = self.rounding == Rounding::Vllm;
                nvfp4_scalar(parts[0], parts[1], global_scale, vllm, start, dst)
            }
            Encoding::Mlx4 if self.rounding == Rounding::Mlx => {
                mlx4_mlx_scalar(parts[0], parts[1], parts[2], start, dst)
            }
            Encoding::Mlx4 => mlx4_scalar(parts[0], parts[1], parts[2], start, dst),
        }
    }
}

/// The parts (at most 3) of a stored row, `sizes` bytes each in order.
/// Lengths are not checked here: a row too short gives short (then empty)
/// parts, and a row too long gives its excess to the last part, so the
/// decoder's length check reports either.
pub(crate) fn split_parts<'a>(row: &'a [u8], sizes: &[usize]) -> [&'a [u8]; 3] {
    let mut parts: [&[u8]; 3] = [&[]; 3];
    let mut rest = row;
    for (slot, &len) in parts.iter_mut().zip(sizes) {
        (*slot, rest) = rest.split_at(len.min(rest.len()));
    }
    if let Some(last) = sizes.len().min(3).checked_sub(1) {
        if !rest.is_empty() {
            parts[last] = &row[row.len() - rest.len() - parts[last].len()..];
        }
    }
    parts
}

/// `x` rounded to bfloat16 (nearest even), as an f32.
#[inline(always)]
fn round_bf16(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(x))
}

/// `x` rounded to IEEE half (nearest even), as an f32.
#[inline(always)]
fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// The MLX 4-bit word of element `j` and its nibble.
#[inline(always)]
fn mlx4_code(words: &[u8], j: usize) -> f32 {
    let w = 4 * (j / 8);
    let word = u32::from_le_bytes([words[w], words[w + 1], words[w + 2], words[w + 3]]);
    ((word >> (4 * (j % 8))) & 0xF) as f32
}

/// MLX 4-bit by [`Rounding::Mlx`]: mlx's `bf16(bf16(scale * q) + bias)`
/// (each bf16 operation computed in f32 and rounded to bf16), written as
/// its exact f32 value, for elements `start..start + y.len()`.
fn mlx4_mlx_scalar(words: &[u8], scales: &[u8], biases: &[u8], start: usize, y: &mut [f32]) {
    let bf = |b: &[u8], i: usize| bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
    for (k, grp) in y.chunks_mut(MLX_GROUP).enumerate() {
        let j0 = start + k * MLX_GROUP;
        let (s, b) = (bf(scales, j0 / MLX_GROUP), bf(biases, j0 / MLX_GROUP));
        for (i, y) in grp.iter_mut().enumerate() {
            let q = mlx4_code(words, j0 + i);
            *y = canon(round_bf16(round_bf16(s * q) + b));
        }
    }
}

/// NVFP4 reference: elements `start..start + y.len()` of a row, as
/// `(v * e4m3(scale)) * global`, or with `vllm` (vLLM's CPU order, the
/// block scale times the global one first) `v * (e4m3(scale) * global)`.
fn nvfp4_scalar(q: &[u8], scales: &[u8], g: f32, vllm: bool, start: usize, y: &mut [f32]) {
    for (k, blk) in y.chunks_mut(NVFP4_BLOCK).enumerate() {
        let j0 = start + k * NVFP4_BLOCK;
        let e = e4m3_to_f32(scales[j0 / NVFP4_BLOCK]);
        let eg = e * g;
        for (i, y) in blk.iter_mut().enumerate() {
            let j = j0 + i;
            let v = NVFP4_VALUES[((q[j / 2] >> (4 * (j % 2))) & 0xF) as usize];
            *y = canon(if vllm { v * eg } else { (v * e) * g });
        }
    }
}

/// MLX affine 4-bit reference: elements `start..start + y.len()` of a row.
fn mlx4_scalar(words: &[u8], scales: &[u8], biases: &[u8], start: usize, y: &mut [f32]) {
    let bf = |b: &[u8], i: usize| bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
    for (k, grp) in y.chunks_mut(MLX_GROUP).enumerate() {
        let j0 = start + k * MLX_GROUP;
        let (s, b) = (bf(scales, j0 / MLX_GROUP), bf(biases, j0 / MLX_GROUP));
        for (i, y) in grp.iter_mut().enumerate() {
            let j = j0 + i;
            let w = j / 8;
            let word = u32::from_le_bytes([
                words[4 * w],
                words[4 * w + 1],
                words[4 * w + 2],
                words[4 * w + 3],
            ]);
            let q = ((word >> (4 * (j % 8))) & 0xF) as f32;
            *y = canon(s * q + b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small LCG: random test bytes (the lab's generators are not
    /// available to the engine's unit tests).
    struct Rng(u64);

    impl Rng {
        fn new(seed: u64) -> Self {
            Rng(seed)
        }

        fn fill_bytes(&mut self, out: &mut [u8]) {
            for b in out {
                self.0 = self
                    .0
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                *b = (self.0 >> 56) as u8;
            }
        }
    }

    /// E4M3 from the definition, in f64.
    fn e4m3_def(b: u8) -> f64 {
        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((b >> 3) & 15);
        let m = f64::from(b & 7);
        match (e, b & 7) {
            (15, 7) => f64::NAN,
            (0, _) => s * m * 2f64.powi(-9),
            _ => s * (1.0 + m / 8.0) * 2f64.powi(e - 7),
        }
    }

    #[test]
    fn e4m3_matches_definition() {
        for b in 0..=255u8 {
            let (got, want) = (e4m3_to_f32(b), e4m3_def(b));
            if want.is_nan() {
                assert_eq!(got.to_bits(), CANONICAL_NAN, "{b:#04x}");
            } else {
                assert_eq!(f64::from(got), want, "{b:#04x}");
                assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "sign of {b:#04x}");
            }
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    }

    fn random_parts(enc: Encoding, n: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
        let sizes = enc.part_bytes(n).unwrap();
        sizes
            .as_slice()
            .iter()
            .map(|&len| {
                let mut v = vec![0u8; len];
                rng.fill_bytes(&mut v);
                v
            })
            .collect()
    }

    fn encodings() -> Vec<Encoding> {
        vec![
            Encoding::Bf16,
            Encoding::F16,
            Encoding::F32,
            Encoding::Fp8(Fp8Scale::PerTensor(2.0e-4)),
            Encoding::Fp8(Fp8Scale::PerTensor(f32::from_bits(0x3951_b717))),
            Encoding::Fp8(Fp8Scale::PerTensor(3.0e38)),
            Encoding::Fp8(Fp8Scale::PerTensor(f32::INFINITY)),
            Encoding::Fp8(Fp8Scale::PerTensor(f32::NAN)),
            Encoding::Fp8(Fp8Scale::PerTensor(f32::from_bits(1))),
            Encoding::Fp8(Fp8Scale::PerRow(ScaleType::Bf16)),
            Encoding::Fp8(Fp8Scale::PerRow(ScaleType::F16)),
            Encoding::Fp8(Fp8Scale::PerRow(ScaleType::F32)),
            Encoding::Nvfp4 {
                global_scale: 1.7e-3,
            },
            Encoding::Nvfp4 {
                global_scale: f32::from_bits(0x7f7f_ffff),
            },
            Encoding::Nvfp4 {
                global_scale: f32::INFINITY,
            },
            Encoding::Mlx4,
        ]
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    #[test]
    fn fast_equals_scalar_on_random_rows() {
        let mut rng = Rng::new(7);
        for enc in encodings() {
            for n in [160usize, 32, 2560, 4096 + 64, 1, 63, 65, 129, 200] {
                if enc.part_bytes(n).is_err() {
                    continue;
                }
                let fast = EncodingDecoder::new(enc, n).unwrap();
                let scalar = EncodingDecoder::scalar(enc, n).unwrap();
                for _ in 0..200 {
                    let parts = random_parts(enc, n, &mut rng);
                    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                    let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                    fast.decode_f32(&refs, &mut a).unwrap();
                    scalar.decode_f32(&refs, &mut b).unwrap();
                    assert!(same_bits(&a, &b), "{enc:?} n={n}");
                    let (mut h1, mut h2) = (vec![0u16; n], vec![0u16; n]);
                    fast.decode_bf16(&refs, &mut h1).unwrap();
                    for (h, &x) in h2.iter_mut().zip(&b) {
                        *h = super::super::convert::f32_to_bf16(x);
                    }
                    assert_eq!(h1, h2, "bf16 {enc:?}");
                    fast.decode_f16(&refs, &mut h1).unwrap();
                    for (h, &x) in h2.iter_mut().zip(&b) {
                        *h = super::super::convert::f32_to_f16(x);
                    }
                    assert_eq!(h1, h2, "f16 {enc:?}");
                    if !matches!(enc, Encoding::Bf16 | Encoding::F16 | Encoding::F32) {
                        assert!(b
                            .iter()
                            .all(|v| !v.is_nan() || v.to_bits() == CANONICAL_NAN));
                    }
                }
            }
        }
    }

    #[test]
    fn a_batch_decodes_as_its_rows_do() {
        let mut rng = Rng::new(11);
        for enc in encodings() {
            for n in [160usize, 32, 63, 200] {
                let Ok(base) = EncodingDecoder::new(enc, n) else {
                    continue;
                };
                let scalar = EncodingDecoder::scalar(enc, n).unwrap();
                for rounding in [Rounding::Exact, Rounding::Vllm, Rounding::Mlx] {
                    for d in [&base, &scalar] {
                        let Ok(d) = d.clone().with_rounding(rounding) else {
                            continue;
                        };
                        for rows in [0usize, 1, 2, 37] {
                            let stored: Vec<Vec<Vec<u8>>> =
                                (0..rows).map(|_| random_parts(enc, n, &mut rng)).collect();
                            let staged: Vec<u8> = stored.iter().flatten().flatten().copied().collect();
                            let (mut want, mut got) = (vec![0f32; rows * n], vec![1f32; rows * n]);
                            let (mut want16, mut got16) = (vec![0u16; rows * n], vec![1u16; rows * n]);
                            d.decode_rows(&staged, RowsOut::F32(&mut got)).unwrap();
                            for (p, y) in stored.iter().zip(want.chunks_exact_mut(n)) {
                                let refs: Vec<&[u8]> = p.iter().map(Vec::as_slice).collect();
                                d.decode_f32(&refs, y).unwrap();
                            }
                            assert!(same_bits(&want, &got), "{enc:?} n={n} {rounding:?} rows={rows}");
                            for bf16 in [true, false] {
                                d.decode_rows(&staged, RowsOut::Half(bf16, &mut got16)).unwrap();
                                for (p, y) in stored.iter().zip(want16.chunks_exact_mut(n)) {
                                    let refs: Vec<&[u8]> = p.iter().map(Vec::as_slice).collect();
                                    if bf16 {
                                        d.decode_bf16(&refs, y).unwrap();
                                    } else {
                                        d.decode_f16(&refs, y).unwrap();
                                    }
                                }
                                assert_eq!(want16, got16, "{enc:?} n={n} {rounding:?} bf16={bf16}");
                            }
                        }
                        // A batch that is not whole rows, or whose output
                        // does not fit it, is an error, and nothing panics.
                        let total = d.part_bytes().total();
                        let mut y = vec![0f32; 2 * n];
                        assert!(d.decode_rows(&vec![0u8; 2 * total + 1], RowsOut::F32(&mut y)).is_err());
                        assert!(d.decode_rows(&vec![0u8; total], RowsOut::F32(&mut y)).is_err());
                    }
                }
            }
        }
    }

    #[test]
    fn fp8_times_bf16_scale_is_exact_so_bf16_rounds_once() {
        // Every code times every finite bf16 scale of moderate exponent:
        // the f32 product equals the exact (f64) product, so bf16(y) is
        // the engines' bf16(f32(e4m3) * f32(scale)) rounded once.
        for s_bits in (0x0080u16..0x7F00).step_by(7) {
            let s = bf16_to_f32(s_bits);
            for c in 0..=255u8 {
                let e = e4m3_to_f32(c);
                if e.is_nan() {
                    continue;
                }
                let y = e * s;
                if y.is_finite() && (y == 0.0 || y.abs() >= f32::MIN_POSITIVE) {
                    assert_eq!(
                        f64::from(y),
                        f64::from(e) * f64::from(s),
                        "{c:#04x} {s_bits:#06x}"
                    );
                }
            }
        }
    }

    #[test]
    fn formulas_by_hand() {
        // FP8: 0x38 = 1.0, 0xC0 = -2.0, 0x7F NaN, 0x80 = -0.0, 0x01 = 2^-9.
        let d = EncodingDecoder::new(Encoding::Fp8(Fp8Scale::PerTensor(0.5)), 16).unwrap();
        let q = [
            0x38u8, 0xC0, 0x7F, 0x80, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x7E,
        ];
        let mut y = [0f32; 16];
        d.decode_f32(&[&q], &mut y).unwrap();
        assert_eq!(&y[..2], &[0.5, -1.0]);
        assert_eq!(y[2].to_bits(), CANONICAL_NAN);
        assert_eq!(y[3].to_bits(), 0x8000_0000);
        assert_eq!(y[4], 2f32.powi(-10));
        assert_eq!(y[15], 224.0);
        // NVFP4: codes 1 (0.5) and 0xF (-6), block scale 0x40 (2.0),
        // global 0.25; second block scale 0x7F (NaN); code 8 is -0.
        let mut q = [0u8; 16];
        q[0] = 0xF1;
        q[1] = 0x08;
        let s = [0x40u8, 0x7F];
        let d = EncodingDecoder::new(Encoding::Nvfp4 { global_scale: 0.25 }, 32).unwrap();
        let mut y = [0f32; 32];
        d.decode_f32(&[&q, &s], &mut y).unwrap();
        assert_eq!(&y[..3], &[0.25, -3.0, -0.0]);
        assert_eq!(y[2].to_bits(), 0x8000_0000);
        assert!(y[16..].iter().all(|v| v.to_bits() == CANONICAL_NAN));
        // MLX: word 0x76543210 -> q = 0..7; scale 0.5, bias -1.
        let mut w = [0u8; 16];
        w[..4].copy_from_slice(&0x7654_3210u32.to_le_bytes());
        let sc = 0x3F00u16.to_le_bytes();
        let bi = 0xBF80u16.to_le_bytes();
        let d = EncodingDecoder::new(Encoding::Mlx4, 32).unwrap();
        let mut y = [0f32; 32];
        d.decode_f32(&[&w, &sc, &bi], &mut y).unwrap();
        for (j, &v) in y[..8].iter().enumerate() {
            assert_eq!(v, 0.5 * j as f32 - 1.0);
        }
        assert_eq!(y[8], -1.0);
    }

    #[test]
    fn lengths_are_checked() {
        let d = EncodingDecoder::new(Encoding::Mlx4, 160).unwrap();
        let (w, s) = (vec![0u8; 80], vec![0u8; 10]);
        let mut y = vec![0f32; 160];
        assert!(matches!(
            d.decode_f32(&[&w, &s], &mut y),
            Err(EncodingError::PartCount { .. })
        ));
        assert!(matches!(
            d.decode_f32(&[&w, &s, &s[..8]], &mut y),
            Err(EncodingError::PartLength { part: 2, .. })
        ));
        assert!(matches!(
            d.decode_f32(&[&w, &s, &s], &mut y[..159]),
            Err(EncodingError::OutputLength { .. })
        ));
        assert!(matches!(
            EncodingDecoder::new(Encoding::Nvfp4 { global_scale: 1.0 }, 40),
            Err(EncodingError::RowElems { .. })
        ));
    }

    /// `x` rounded to bf16 / f16 and back, from the definition (f64
    /// midpoints), independent of the conversion code under test.
    fn def_round(x: f32, bf16: bool) -> f32 {
        let (bits, lo) = if bf16 { (8, -126) } else { (11, -14) };
        let v = f64::from(x);
        if v == 0.0 || !v.is_finite() {
            return x;
        }
        let e = (v.abs().log2().floor() as i32).max(lo);
        let ulp = 2f64.powi(e - (bits - 1));
        let q = v / ulp;
        let r = q.round();
        let r = if (q - q.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
            r - q.signum()
        } else {
            r
        };
        (r * ulp) as f32
    }

    fn bits16(v: f32, bf16: bool) -> u16 {
        if bf16 {
            crate::quant::convert::f32_to_bf16(v)
        } else {
            crate::quant::convert::f32_to_f16(v)
        }
    }

    #[test]
    fn vllm_rule_matches_its_definition_and_differs_from_exact() {
        let mut rng = Rng::new(11);
        let n = 256;
        // Scales of realistic size that bf16 (and f16) cannot hold.
        for s in [f32::from_bits(0x3951_b717), 2.0e-4, 3.3e-3, 0.0173] {
            for enc in [
                Encoding::Fp8(Fp8Scale::PerTensor(s)),
                Encoding::Fp8(Fp8Scale::PerRow(ScaleType::F32)),
            ] {
                let exact = EncodingDecoder::new(enc, n).unwrap();
                let fast = exact.clone().with_rounding(Rounding::Vllm).unwrap();
                let scalar = EncodingDecoder::scalar(enc, n)
                    .unwrap()
                    .with_rounding(Rounding::Vllm)
                    .unwrap();
                assert_eq!(fast.rounding(), Rounding::Vllm);
                let mut differ = [0usize; 2];
                for _ in 0..50 {
                    let mut parts = random_parts(enc, n, &mut rng);
                    if parts.len() == 2 {
                        parts[1] = s.to_le_bytes().to_vec();
                    }
                    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                    let (mut f, mut g) = (vec![0f32; n], vec![0f32; n]);
                    fast.decode_f32(&refs, &mut f).unwrap();
                    exact.decode_f32(&refs, &mut g).unwrap();
                    assert!(same_bits(&f, &g), "vllm f32 is exact");
                    for (k, bf16) in [true, false].into_iter().enumerate() {
                        let sr = def_round(s, bf16);
                        let want: Vec<u16> = parts[0]
                            .iter()
                            .map(|&q| bits16(canon(e4m3_to_f32(q) * sr), bf16))
                            .collect();
                        let (mut a, mut b, mut e) = (vec![0u16; n], vec![0u16; n], vec![0u16; n]);
                        for (d, out) in [(&fast, &mut a), (&scalar, &mut b), (&exact, &mut e)] {
                            if bf16 {
                                d.decode_bf16(&refs, out).unwrap();
                            } else {
                                d.decode_f16(&refs, out).unwrap();
                            }
                        }
                        assert_eq!(a, want, "fast {enc:?} {s} bf16={bf16}");
                        assert_eq!(b, want, "scalar {enc:?} {s} bf16={bf16}");
                        differ[k] += a.iter().zip(&e).filter(|(x, y)| x != y).count();
                    }
                }
                assert!(
                    differ[0] > 50 * n / 10,
                    "bf16 differs on {} of {}",
                    differ[0],
                    50 * n
                );
                assert!(differ[1] > 0, "f16 never differs");
            }
        }
    }

    #[test]
    fn fp8_times_f16_scale_is_exact_so_vllm_f16_rounds_once() {
        // Every code times every finite f16 scale: the f32 product is the
        // exact (f64) product (4 + 11 significand bits, far from f32's
        // subnormals), so f16(f32(e4m3) * f32(f16(scale))) rounds once.
        for h in 0..=u16::MAX {
            let s = f16_to_f32(h);
            if !s.is_finite() {
                continue;
            }
            for c in 0..=255u8 {
                let e = e4m3_to_f32(c);
                if e.is_nan() {
                    continue;
                }
                assert_eq!(
                    f64::from(e * s),
                    f64::from(e) * f64::from(s),
                    "{c:#04x} {h:#06x}"
                );
            }
        }
    }

    #[test]
    fn mlx_rule_matches_its_definition() {
        let mut rng = Rng::new(12);
        let n = 256;
        let exact = EncodingDecoder::new(Encoding::Mlx4, n).unwrap();
        let mlx = exact.clone().with_rounding(Rounding::Mlx).unwrap();
        let (mut differ, mut total) = (0usize, 0usize);
        for _ in 0..100 {
            let mut parts = random_parts(Encoding::Mlx4, n, &mut rng);
            // Scales and biases of realistic size: |x| in [2^-10, 1).
            for p in &mut parts[1..] {
                for h in p.chunks_exact_mut(2) {
                    let r = u16::from_le_bytes([h[0], h[1]]);
                    let v = (r & 0x8000) | ((117 + (r >> 7 & 0xFF) % 10) << 7) | (r & 0x7F);
                    h.copy_from_slice(&v.to_le_bytes());
                }
            }
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            let mut want = vec![0f32; n];
            for (j, w) in want.iter_mut().enumerate() {
                let word =
                    u32::from_le_bytes(parts[0][4 * (j / 8)..4 * (j / 8) + 4].try_into().unwrap());
                let q = ((word >> (4 * (j % 8))) & 15) as f32;
                let g = j / 32;
                let s = bf16_to_f32(u16::from_le_bytes([parts[1][2 * g], parts[1][2 * g + 1]]));
                let b = bf16_to_f32(u16::from_le_bytes([parts[2][2 * g], parts[2][2 * g + 1]]));
                *w = def_round(def_round(s * q, true) + b, true);
            }
            let mut y = vec![0f32; n];
            mlx.decode_f32(&refs, &mut y).unwrap();
            assert!(same_bits(&y, &want), "mlx f32 is the widened bf16 result");
            let (mut a, mut e) = (vec![0u16; n], vec![0u16; n]);
            mlx.decode_bf16(&refs, &mut a).unwrap();
            exact.decode_bf16(&refs, &mut e).unwrap();
            let wb: Vec<u16> = want.iter().map(|&v| bits16(v, true)).collect();
            assert_eq!(a, wb);
            differ += a.iter().zip(&e).filter(|(x, y)| x != y).count();
            total += n;
            mlx.decode_f16(&refs, &mut a).unwrap();
            let wh: Vec<u16> = want.iter().map(|&v| bits16(v, false)).collect();
            assert_eq!(a, wh, "mlx f16 is f16 of the bf16 result");
        }
        assert!(
            differ * 20 > total,
            "mlx differs from exact on {differ} of {total}"
        );
    }

    #[test]
    fn vllm_nvfp4_rule_matches_its_definition() {
        let mut rng = Rng::new(13);
        let n = 256;
        let (mut differ, mut total) = (0usize, 0usize);
        for k in 0..100u32 {
            // Global scales that are not short binary fractions.
            let g = 1.0123457e-3 * (1.0 + k as f32 / 37.0);
            let enc = Encoding::Nvfp4 { global_scale: g };
            let exact = EncodingDecoder::new(enc, n).unwrap();
            let vllm = exact.clone().with_rounding(Rounding::Vllm).unwrap();
            let parts = random_parts(enc, n, &mut rng);
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            let want: Vec<f32> = (0..n)
                .map(|j| {
                    let c = (parts[0][j / 2] >> (4 * (j % 2))) & 0xF;
                    let e = e4m3_to_f32(parts[1][j / NVFP4_BLOCK]);
                    canon(NVFP4_VALUES[c as usize] * (e * g))
                })
                .collect();
            let (mut y, mut x) = (vec![0f32; n], vec![0f32; n]);
            vllm.decode_f32(&refs, &mut y).unwrap();
            assert!(same_bits(&y, &want), "vllm nvfp4 f32 is v * (scale * global)");
            exact.decode_f32(&refs, &mut x).unwrap();
            differ += x.iter().zip(&y).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            total += n;
            let mut a = vec![0u16; n];
            for bf16 in [true, false] {
                if bf16 {
                    vllm.decode_bf16(&refs, &mut a).unwrap();
                } else {
                    vllm.decode_f16(&refs, &mut a).unwrap();
                }
                let w: Vec<u16> = want.iter().map(|&v| bits16(v, bf16)).collect();
                assert_eq!(a, w, "vllm nvfp4 16-bit outputs convert that f32");
            }
        }
        assert!(
            differ * 100 > total,
            "vllm nvfp4 differs from exact on {differ} of {total}"
        );
    }

    #[test]
    fn rules_that_do_not_apply_are_refused() {
        let refused = |enc: Encoding, r: Rounding| {
            matches!(
                EncodingDecoder::new(enc, 64).unwrap().with_rounding(r),
                Err(EncodingError::Rounding { .. })
            )
        };
        let nv = Encoding::Nvfp4 { global_scale: 1.0 };
        assert!(refused(Encoding::Mlx4, Rounding::Vllm));
        assert!(refused(
            Encoding::Fp8(Fp8Scale::PerTensor(1.0)),
            Rounding::Mlx
        ));
        assert!(refused(Encoding::F16, Rounding::Mlx));
        assert!(refused(nv, Rounding::Mlx));
        let msg = EncodingDecoder::new(Encoding::Mlx4, 64)
            .unwrap()
            .with_rounding(Rounding::Vllm)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("vllm") && msg.contains("mlx4"), "{msg}");
        for enc in [Encoding::Bf16, Encoding::F16, Encoding::F32, nv] {
            assert!(EncodingDecoder::new(enc, 64)
                .unwrap()
                .with_rounding(Rounding::Vllm)
                .is_ok());
        }
        assert!(EncodingDecoder::new(Encoding::Bf16, 64)
            .unwrap()
            .with_rounding(Rounding::Mlx)
            .is_ok());
    }
}
