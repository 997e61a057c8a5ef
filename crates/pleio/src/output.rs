//! The last stage of a gather: a row's stored bytes become the caller's
//! output in the [`Dtype`] asked for (f32, bf16, f16 or the stored bytes).

use std::fmt;
use std::str::FromStr;

use crate::layout::{Layout, RowFormat};
use crate::quant::convert::{f32_row_le, f32_to_bf16_row_le, f32_to_f16_row_le};
use crate::quant::encoding::EncodingDecoder;
pub use crate::quant::Rounding;
use crate::quant::{DecodeError, RowDecoder};

/// The decoder of a table's stored rows: a ggml type's, or a checkpoint
/// encoding's (which splits a row's stored bytes into its parts).
#[derive(Debug, Clone)]
pub(crate) enum Decoder {
    /// ggml's `to_float`.
    Ggml(RowDecoder),
    /// A checkpoint encoding.
    Encoded(EncodingDecoder),
}

impl Decoder {
    /// The fastest exact decoder for the rows of `layout`.
    pub(crate) fn for_layout(layout: &Layout) -> Result<Decoder, DecodeError> {
        Ok(match layout.ty() {
            RowFormat::Ggml(t) => Decoder::Ggml(RowDecoder::new(t)?),
            RowFormat::Encoded(e) => {
                let n = usize::try_from(layout.row_elems()).unwrap_or(usize::MAX);
                Decoder::Encoded(EncodingDecoder::new(e, n)?)
            }
        })
    }

    /// This decoder following `rounding` (see [`Rounding`] and
    /// [`EncodingDecoder::with_rounding`]); GGUF tables take
    /// [`Rounding::Exact`] only.
    pub(crate) fn with_rounding(self, rounding: Rounding) -> Result<Decoder, DecodeError> {
        match self {
            Decoder::Ggml(d) if rounding == Rounding::Exact => Ok(Decoder::Ggml(d)),
            Decoder::Ggml(d) => Err(DecodeError::Rounding {
                rule: rounding.name(),
                ty: d.ggml_type(),
            }),
            Decoder::Encoded(d) => Ok(Decoder::Encoded(d.with_rounding(rounding)?)),
        }
    }

    /// Runs `f` with the parts of the stored row `src` (its parts
    /// concatenated in part order).
    fn with_parts<R>(
        dec: &EncodingDecoder,
        src: &[u8],
        f: impl FnOnce(&[&[u8]]) -> Result<R, crate::quant::encoding::EncodingError>,
    ) -> Result<R, DecodeError> {
        let sizes = dec.part_bytes();
        let mut parts: [&[u8]; 3] = [&[]; 3];
        let mut rest = src;
        let n = sizes.as_slice().len();
        for (slot, &len) in parts.iter_mut().zip(sizes.as_slice()) {
            let (head, tail) = rest.split_at(len.min(rest.len()));
            *slot = head;
            rest = tail;
        }
        if !rest.is_empty() {
            // Too many bytes: the last part's length check reports it.
            parts[n - 1] = &src[src.len() - rest.len() - parts[n - 1].len()..];
        }
        Ok(f(&parts[..n])?)
    }

    /// Decodes the stored row `src` into f32.
    pub(crate) fn decode(&self, src: &[u8], dst: &mut [f32]) -> Result<(), DecodeError> {
        match self {
            Decoder::Ggml(d) => d.decode(src, dst),
            Decoder::Encoded(d) => Decoder::with_parts(d, src, |p| d.decode_f32(p, dst)),
        }
    }

    /// Decodes the stored row `src` into bf16 (`bf16 == true`) or f16
    /// bits (little-endian, in `dst`), by the decoder's rounding rule;
    /// `row` and `half` are the caller's scratch (resized here).
    pub(crate) fn decode_half(
        &self,
        bf16: bool,
        src: &[u8],
        dst: &mut [u8],
        row: &mut Vec<f32>,
        half: &mut Vec<u16>,
    ) -> Result<(), DecodeError> {
        let n = dst.len() / 2;
        match self {
            Decoder::Ggml(d) => {
                // One pass where the type has a 16-bit kernel; else two in
                // L1: the exact f32 row, then straight into the output bytes.
                if d.decode_half(src, dst, bf16)? {
                    return Ok(());
                }
                row.resize(n, 0.0);
                d.decode(src, row)?;
                if bf16 {
                    f32_to_bf16_row_le(row, dst);
                } else {
                    f32_to_f16_row_le(row, dst);
                }
            }
            Decoder::Encoded(d) => {
                half.resize(n, 0);
                Decoder::with_parts(d, src, |p| {
                    if bf16 {
                        d.decode_bf16(p, half)
                    } else {
                        d.decode_f16(p, half)
                    }
                })?;
                for (o, &x) in dst.chunks_exact_mut(2).zip(half.iter()) {
                    o.copy_from_slice(&x.to_le_bytes());
                }
            }
        }
        Ok(())
    }
}

/// The element type rows are gathered as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Dtype {
    /// Little-endian f32, exactly ggml's `to_float` (the default).
    #[default]
    F32,
    /// bfloat16 bits, rounded to nearest even from the exact f32 (by
    /// default: see [`Rounding`]).
    Bf16,
    /// IEEE binary16 bits, rounded to nearest even from the exact f32 (by
    /// default: see [`Rounding`]).
    F16,
    /// The row's stored bytes, undecoded (for engines that dequantize on
    /// the GPU): for a checkpoint row stored in several parts (NVFP4,
    /// MLX 4-bit, FP8 with per-row scales), its parts concatenated in part
    /// order (e.g. MLX: words, scales, biases); a per-tensor scale is not
    /// part of the row.
    Raw,
}

impl Dtype {
    /// Every output type.
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) const ALL: &'static [Dtype] = &[Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::Raw];

    /// The name used on the command line and in the bindings (an engine
    /// has `Display`).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::Raw => "raw",
        }
    }

    /// Output bytes of one row of `layout` in this type (`None` on overflow).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn row_out_bytes(self, layout: &Layout) -> Option<usize> {
        let elems = usize::try_from(layout.row_elems()).ok()?;
        match self {
            Dtype::F32 => elems.checked_mul(4),
            Dtype::Bf16 | Dtype::F16 => elems.checked_mul(2),
            Dtype::Raw => usize::try_from(layout.row_bytes()).ok(),
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let alias = match s.to_ascii_lowercase().as_str() {
            "float32" => "f32",
            "bfloat16" => "bf16",
            "float16" => "f16",
            other => return Dtype::by_name(other, s),
        };
        Dtype::by_name(alias, s)
    }
}

impl Dtype {
    fn by_name(name: &str, given: &str) -> Result<Dtype, String> {
        Dtype::ALL
            .iter()
            .copied()
            .find(|d| d.name() == name)
            .ok_or_else(|| format!("unknown dtype {given:?} (known: f32, bf16, f16, raw)"))
    }
}

/// Where a gather writes its rows: f32s, or bytes of a [`Dtype`].
pub(crate) struct Out<'a> {
    buf: Buf<'a>,
    /// Output units (floats or bytes) per row.
    row_len: usize,
    /// One decoded row, for the byte outputs (kept across rows).
    row: Vec<f32>,
    /// One row of 16-bit values, for the 16-bit outputs.
    half: Vec<u16>,
}

enum Buf<'a> {
    F32(&'a mut [f32]),
    Bytes { dtype: Dtype, bytes: &'a mut [u8] },
}

impl<'a> Out<'a> {
    /// Rows of f32 of `layout` into `out`.
    pub(crate) fn f32(out: &'a mut [f32], layout: &Layout) -> Out<'a> {
        Out {
            buf: Buf::F32(out),
            row_len: layout.row_elems() as usize,
            row: Vec::new(),
            half: Vec::new(),
        }
    }

    /// Rows of `dtype` bytes into `out` (`None` if one row's bytes overflow
    /// `usize`).
    pub(crate) fn bytes(dtype: Dtype, layout: &Layout, out: &'a mut [u8]) -> Option<Out<'a>> {
        let row_len = dtype.row_out_bytes(layout)?;
        Some(Out {
            buf: Buf::Bytes { dtype, bytes: out },
            row_len,
            row: Vec::new(),
            half: Vec::new(),
        })
    }

    /// Output units per row.
    pub(crate) fn row_len(&self) -> usize {
        self.row_len
    }

    /// Output units in all.
    pub(crate) fn len(&self) -> usize {
        match &self.buf {
            Buf::F32(o) => o.len(),
            Buf::Bytes { bytes, .. } => bytes.len(),
        }
    }

    /// Writes `staged`, the stored bytes of rows `0..` one after another, as
    /// they are when the output is [`Dtype::Raw`] (one copy for the whole
    /// batch). False, and nothing written, for any other output or a
    /// length that does not fit.
    pub(crate) fn put_raw_rows(&mut self, staged: &[u8]) -> bool {
        match &mut self.buf {
            Buf::Bytes {
                dtype: Dtype::Raw,
                bytes,
            } => match bytes.get_mut(..staged.len()) {
                Some(dst) if staged.len().is_multiple_of(self.row_len.max(1)) => {
                    dst.copy_from_slice(staged);
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// Decodes `staged`, the stored bytes of rows `0..` one after another,
    /// into the output in one decoder call, when the rows are a ggml
    /// type's (whole blocks, so a batch decodes as its rows do) and the
    /// output is f32 (floats, or bytes through one scratch row), or
    /// bf16/f16 the type writes in one pass; a
    /// warm 1792-row IQ4_NL gather spent as long in per-row calls as in
    /// the decode. False, and nothing written, otherwise.
    pub(crate) fn put_decoded_rows(
        &mut self,
        staged: &[u8],
        decoder: &Decoder,
    ) -> Result<bool, DecodeError> {
        let Decoder::Ggml(d) = decoder else {
            return Ok(false);
        };
        let rb = d.ggml_type().block_bytes();
        if self.row_len == 0 || !staged.len().is_multiple_of(rb) {
            return Ok(false);
        }
        let elems = staged.len() / rb * d.ggml_type().block_elems();
        match &mut self.buf {
            Buf::F32(o) => match o.get_mut(..elems) {
                Some(dst) if elems.is_multiple_of(self.row_len) => {
                    d.decode(staged, dst).map(|()| true)
                }
                _ => Ok(false),
            },
            Buf::Bytes {
                dtype: Dtype::F32,
                bytes,
            } => match bytes.get_mut(..elems * 4) {
                Some(dst) if (elems * 4).is_multiple_of(self.row_len) => {
                    let row = &mut self.row;
                    row.resize(elems, 0.0);
                    d.decode(staged, row)?;
                    f32_row_le(row, dst);
                    Ok(true)
                }
                _ => Ok(false),
            },
            Buf::Bytes {
                dtype: dtype @ (Dtype::Bf16 | Dtype::F16),
                bytes,
            } => match bytes.get_mut(..elems * 2) {
                Some(dst) if (elems * 2).is_multiple_of(self.row_len) => {
                    d.decode_half(staged, dst, *dtype == Dtype::Bf16)
                }
                _ => Ok(false),
            },
            _ => Ok(false),
        }
    }

    /// Writes the row whose stored bytes are `src` into output slot `i`.
    #[inline]
    pub(crate) fn put(
        &mut self,
        i: usize,
        src: &[u8],
        decoder: &Decoder,
    ) -> Result<(), DecodeError> {
        let n = self.row_len;
        match &mut self.buf {
            Buf::F32(o) => decoder.decode(src, &mut o[i * n..(i + 1) * n]),
            Buf::Bytes { dtype, bytes } => {
                let dst = &mut bytes[i * n..(i + 1) * n];
                match dtype {
                    Dtype::Raw => {
                        dst.copy_from_slice(src);
                        Ok(())
                    }
                    Dtype::F32 => {
                        let row = &mut self.row;
                        row.resize(n / 4, 0.0);
                        decoder.decode(src, row)?;
                        f32_row_le(row, dst);
                        Ok(())
                    }
                    Dtype::Bf16 | Dtype::F16 => decoder.decode_half(
                        *dtype == Dtype::Bf16,
                        src,
                        dst,
                        &mut self.row,
                        &mut self.half,
                    ),
                }
            }
        }
    }
}
