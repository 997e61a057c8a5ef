//! The last stage of a gather: a row's stored bytes become the caller's
//! output in the [`Dtype`] asked for (f32, bf16, f16 or the stored bytes).

use std::fmt;
use std::str::FromStr;

use crate::layout::{Layout, RowFormat};
use crate::quant::convert::{f32_row_le, f32_to_bf16_row_le, f32_to_f16_row_le};
use crate::quant::encoding::{split_parts, EncodingDecoder, RowsOut};
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
        let n = sizes.as_slice().len().min(3);
        let parts = split_parts(src, sizes.as_slice());
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

/// Elements a byte output's batch decode goes through its scratch at a
/// time (16 KiB of f32: the scratch stays in L1/L2; a scratch of the
/// whole batch, 1.1 MiB for 1792 FP8 rows, was allocated and faulted in
/// afresh by every gather).
const SCRATCH_ELEMS: usize = 4096;

/// `staged` (`rows` whole rows, `elems` elements in all) and `out` (the
/// same rows' output bytes) split into matching runs of whole rows of
/// about [`SCRATCH_ELEMS`] elements (at least one row).
fn by_scratch<'s, 'o>(
    staged: &'s [u8],
    out: &'o mut [u8],
    rows: usize,
    elems: usize,
) -> impl Iterator<Item = (&'s [u8], &'o mut [u8])> {
    let rows = rows.max(1);
    let k = (SCRATCH_ELEMS / (elems / rows).max(1)).max(1);
    let (src, dst) = (k * (staged.len() / rows), k * (out.len() / rows));
    staged.chunks(src.max(1)).zip(out.chunks_mut(dst.max(1)))
}

/// Where a gather writes its rows: f32s, or bytes of a [`Dtype`].
pub(crate) struct Out<'a> {
    buf: Buf<'a>,
    /// Output units (floats or bytes) per row.
    row_len: usize,
    /// This thread's decode scratch, taken for the gather.
    scratch: Taken,
}

/// The byte outputs' decode scratch: decoded f32s and 16-bit values, a row
/// or a run of rows at a time.
#[derive(Default)]
struct Scratch {
    row: Vec<f32>,
    half: Vec<u16>,
}

thread_local! {
    /// This thread's [`Scratch`] between gathers. An `Out` lives for one
    /// gather; a scratch of its own was allocated and zeroed by every
    /// gather (16 warm MLX 4-bit rows to bf16: 4.17 -> 4.43 us when it
    /// grew from a row to a run of rows). A second `Out` of the thread at
    /// the same time takes an empty one.
    static SCRATCH: std::cell::Cell<Scratch> = const {
        std::cell::Cell::new(Scratch {
            row: Vec::new(),
            half: Vec::new(),
        })
    };
}

/// This thread's [`Scratch`] while an `Out` holds it; put back when
/// dropped (a guard of its own, not a `Drop` of `Out`, so the output's
/// borrow ends where `Out` is last used).
struct Taken(Scratch);

impl Taken {
    fn new() -> Taken {
        Taken(SCRATCH.take())
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        SCRATCH.set(std::mem::take(&mut self.0));
    }
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
            scratch: Taken::new(),
        }
    }

    /// Rows of `dtype` bytes into `out` (`None` if one row's bytes overflow
    /// `usize`).
    pub(crate) fn bytes(dtype: Dtype, layout: &Layout, out: &'a mut [u8]) -> Option<Out<'a>> {
        let row_len = dtype.row_out_bytes(layout)?;
        Some(Out {
            buf: Buf::Bytes { dtype, bytes: out },
            row_len,
            scratch: Taken::new(),
        })
    }

    /// True if rows are written as their stored bytes ([`Dtype::Raw`]).
    pub(crate) fn is_raw(&self) -> bool {
        matches!(
            self.buf,
            Buf::Bytes {
                dtype: Dtype::Raw,
                ..
            }
        )
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
    /// into the output as one batch, not one decoder call per row (a warm
    /// 1792-row IQ4_NL gather spent as long in per-row calls as in the
    /// decode). A ggml type's rows are whole blocks, so a batch decodes as
    /// its rows do: f32 (floats, or bytes through one scratch buffer), or
    /// bf16/f16 where the type has a one-pass kernel. A checkpoint
    /// encoding's batch goes to [`EncodingDecoder::decode_rows`]. False,
    /// and nothing written, otherwise (or for lengths that do not fit).
    pub(crate) fn put_decoded_rows(
        &mut self,
        staged: &[u8],
        decoder: &Decoder,
    ) -> Result<bool, DecodeError> {
        let (rb, block_elems) = match decoder {
            Decoder::Ggml(d) => (d.ggml_type().block_bytes(), d.ggml_type().block_elems()),
            Decoder::Encoded(d) => (d.part_bytes().total(), d.row_elems()),
        };
        if self.row_len == 0 || rb == 0 || !staged.len().is_multiple_of(rb) {
            return Ok(false);
        }
        let elems = staged.len() / rb * block_elems;
        let Some(units) = self.unit_bytes().and_then(|u| elems.checked_mul(u)) else {
            return Ok(false);
        };
        if !units.is_multiple_of(self.row_len) || units > self.len() {
            return Ok(false);
        }
        match (&mut self.buf, decoder) {
            (Buf::F32(o), Decoder::Ggml(d)) => d.decode(staged, &mut o[..elems])?,
            (Buf::F32(o), Decoder::Encoded(d)) => {
                d.decode_rows(staged, RowsOut::F32(&mut o[..elems]))?
            }
            (
                Buf::Bytes {
                    dtype: Dtype::F32,
                    bytes,
                },
                _,
            ) => {
                let row = &mut self.scratch.0.row;
                for (src, dst) in
                    by_scratch(staged, &mut bytes[..units], units / self.row_len, elems)
                {
                    row.resize(dst.len() / 4, 0.0);
                    match decoder {
                        Decoder::Ggml(d) => d.decode(src, row)?,
                        Decoder::Encoded(d) => d.decode_rows(src, RowsOut::F32(row))?,
                    }
                    f32_row_le(row, dst);
                }
            }
            (
                Buf::Bytes {
                    dtype: dtype @ (Dtype::Bf16 | Dtype::F16),
                    bytes,
                },
                Decoder::Ggml(d),
            ) => return d.decode_half(staged, &mut bytes[..units], *dtype == Dtype::Bf16),
            (
                Buf::Bytes {
                    dtype: dtype @ (Dtype::Bf16 | Dtype::F16),
                    bytes,
                },
                Decoder::Encoded(d),
            ) => {
                let half = &mut self.scratch.0.half;
                for (src, dst) in
                    by_scratch(staged, &mut bytes[..units], units / self.row_len, elems)
                {
                    half.resize(dst.len() / 2, 0);
                    d.decode_rows(src, RowsOut::Half(*dtype == Dtype::Bf16, half))?;
                    for (o, &x) in dst.chunks_exact_mut(2).zip(half.iter()) {
                        o.copy_from_slice(&x.to_le_bytes());
                    }
                }
            }
            (Buf::Bytes { .. }, _) => return Ok(false),
        }
        Ok(true)
    }

    /// Output bytes (or floats) per element; `None` for stored bytes.
    fn unit_bytes(&self) -> Option<usize> {
        match &self.buf {
            Buf::F32(_) => Some(1),
            Buf::Bytes { dtype, .. } => match dtype {
                Dtype::F32 => Some(4),
                Dtype::Bf16 | Dtype::F16 => Some(2),
                Dtype::Raw => None,
            },
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
                        let row = &mut self.scratch.0.row;
                        row.resize(n / 4, 0.0);
                        decoder.decode(src, row)?;
                        f32_row_le(row, dst);
                        Ok(())
                    }
                    Dtype::Bf16 | Dtype::F16 => decoder.decode_half(
                        *dtype == Dtype::Bf16,
                        src,
                        dst,
                        &mut self.scratch.0.row,
                        &mut self.scratch.0.half,
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Shard, ShardPart};
    use crate::quant::encoding::{Encoding, Fp8Scale};
    use crate::quant::GgmlType;

    /// A checkpoint layout of one shard of `rows` rows of `enc`.
    fn encoded(enc: Encoding, row_elems: u64, rows: u64) -> Layout {
        let sizes = enc.part_bytes(row_elems as usize).unwrap();
        let parts = sizes
            .as_slice()
            .iter()
            .map(|&b| ShardPart {
                tensor: "w".into(),
                file: 0,
                offset: 0,
                row_bytes: b as u64,
            })
            .collect();
        let shard = Shard {
            index: 0,
            row_start: 0,
            rows,
            parts,
        };
        Layout::encoded(
            "t".into(),
            enc,
            row_elems,
            rows,
            sizes.total() as u64,
            vec![shard],
        )
        .unwrap()
    }

    /// `rows` rows of `layout`'s stored bytes, random (NaN codes
    /// included: outputs are compared bit for bit).
    fn staged(layout: &Layout, rows: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..rows * layout.row_bytes() as usize)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn a_staged_batch_is_written_as_its_rows_are() {
        // 100 rows of 160 elements: several of the byte outputs' scratch
        // runs, and a last one that is not full.
        let rows = 100;
        let layouts = [
            Layout::new("t", GgmlType::IQ4_NL, &[160, rows], 0, 0).unwrap(),
            Layout::new("t", GgmlType::Q8_0, &[160, rows], 0, 0).unwrap(),
            encoded(Encoding::Fp8(Fp8Scale::PerTensor(2.0e-4)), 160, rows),
            encoded(Encoding::Bf16, 160, rows),
            encoded(Encoding::Mlx4, 160, rows),
            encoded(
                Encoding::Nvfp4 {
                    global_scale: 1.5e-3,
                },
                160,
                rows,
            ),
        ];
        for (k, layout) in layouts.iter().enumerate() {
            let dec = Decoder::for_layout(layout).unwrap();
            let src = staged(layout, rows as usize, k as u64);
            let rb = layout.row_bytes() as usize;
            let n = rows as usize * layout.row_elems() as usize;
            let (mut want, mut got) = (vec![0f32; n], vec![1f32; n]);
            let mut o = Out::f32(&mut got, layout);
            assert!(o.put_decoded_rows(&src, &dec).unwrap(), "{k}");
            let mut o = Out::f32(&mut want, layout);
            for (i, r) in src.chunks_exact(rb).enumerate() {
                o.put(i, r, &dec).unwrap();
            }
            assert!(
                want.iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{k}"
            );
            for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
                let len = dtype.row_out_bytes(layout).unwrap() * rows as usize;
                let (mut want, mut got) = (vec![0u8; len], vec![1u8; len]);
                let mut o = Out::bytes(dtype, layout, &mut got).unwrap();
                if !o.put_decoded_rows(&src, &dec).unwrap() {
                    // No one-pass kernel for this type and output: the
                    // caller writes row by row, and nothing was written.
                    assert!(got.iter().all(|&b| b == 1), "{k} {dtype}");
                    continue;
                }
                let mut o = Out::bytes(dtype, layout, &mut want).unwrap();
                for (i, r) in src.chunks_exact(rb).enumerate() {
                    o.put(i, r, &dec).unwrap();
                }
                assert_eq!(want, got, "{k} {dtype}");
            }
            // A batch that is not whole rows, or longer than the output,
            // is declined with nothing written.
            let mut few = vec![1f32; n - 1];
            let mut o = Out::f32(&mut few, layout);
            assert!(!o.put_decoded_rows(&src, &dec).unwrap());
            assert!(few.iter().all(|&v| v == 1.0));
            let mut o = Out::f32(&mut got, layout);
            assert!(!o.put_decoded_rows(&src[..src.len() - 1], &dec).unwrap());
        }
    }
}
