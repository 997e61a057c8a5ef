//! Stored elements decoded without a table: whole blocks of a ggml type
//! (the bytes a `Dtype::Raw` gather returns, say) to f32, bf16 or f16,
//! by the same decoders a gather uses.

use crate::error::{Error, ErrorKind, Result};
use crate::output::{Decoder, Dtype};
use crate::quant::convert::f32_row_le;
use crate::quant::{GgmlType, RowDecoder};

/// Why a decode's arguments were refused.
#[derive(Debug, thiserror::Error)]
enum BlocksError {
    #[error("ggml type {0} is not a type pleio knows")]
    UnknownType(u32),
    #[error("{len} bytes of {ty} are not whole blocks ({block} bytes each)")]
    NotWholeBlocks {
        ty: GgmlType,
        len: usize,
        block: usize,
    },
    #[error("the output holds {got} bytes: {elems} elements as {dtype} take {need}")]
    OutputSize {
        got: usize,
        elems: usize,
        dtype: Dtype,
        need: usize,
    },
    #[error("decode writes f32, bf16 or f16 (raw is the input itself)")]
    RawOutput,
}

fn err(kind: ErrorKind, e: BlocksError) -> Error {
    Error::new(kind, e)
}

/// The decoder of the ggml type numbered `ggml_type`, and the elements
/// `src` holds as whole blocks of it.
fn decoder(ggml_type: u32, src: &[u8]) -> Result<(RowDecoder, usize)> {
    let ty = GgmlType::from_id(ggml_type)
        .ok_or_else(|| err(ErrorKind::Unsupported, BlocksError::UnknownType(ggml_type)))?;
    let dec = RowDecoder::new(ty)?;
    let block = ty.block_bytes();
    if !src.len().is_multiple_of(block) {
        let len = src.len();
        return Err(err(
            ErrorKind::OutputSize,
            BlocksError::NotWholeBlocks { ty, len, block },
        ));
    }
    Ok((dec, src.len() / block * ty.block_elems()))
}

/// Checks that `got` output bytes hold `elems` elements of `size` bytes.
fn room(dtype: Dtype, elems: usize, size: usize, got: usize) -> Result<usize> {
    let need = elems.saturating_mul(size);
    if got < need {
        let e = BlocksError::OutputSize {
            got,
            elems,
            dtype,
            need,
        };
        return Err(err(ErrorKind::OutputSize, e));
    }
    Ok(need)
}

/// Decodes `src`, whole blocks of the ggml type numbered `ggml_type` (20
/// for IQ4_NL), into the first elements of `out`, exactly as a gather
/// decodes a GGUF table's rows; returns the elements written.
///
/// Errors: `Unsupported` for a type pleio does not decode, `OutputSize` for
/// a `src` that is not whole blocks or an `out` too small (nothing written).
///
/// ```
/// let bytes = 1.5f32.to_le_bytes();
/// let mut out = [0f32; 2];
/// assert_eq!(pleio::decode_blocks_f32(0, &bytes, &mut out).unwrap(), 1);
/// assert_eq!(out[0], 1.5);
/// ```
pub fn decode_blocks_f32(ggml_type: u32, src: &[u8], out: &mut [f32]) -> Result<usize> {
    let (dec, elems) = decoder(ggml_type, src)?;
    room(Dtype::F32, elems, 4, out.len().saturating_mul(4))?;
    dec.decode(src, &mut out[..elems])?;
    Ok(elems)
}

/// [`decode_blocks_f32`] into bytes of `dtype`: f32 little-endian, or bf16
/// / f16 bits rounded to nearest even from the exact f32 (as a gather's
/// 16-bit outputs); returns the elements written. `Dtype::Raw` is
/// `Unsupported`.
pub fn decode_blocks(ggml_type: u32, src: &[u8], dtype: Dtype, out: &mut [u8]) -> Result<usize> {
    let size = match dtype {
        Dtype::F32 => 4,
        Dtype::Bf16 | Dtype::F16 => 2,
        Dtype::Raw => return Err(err(ErrorKind::Unsupported, BlocksError::RawOutput)),
    };
    let (dec, elems) = decoder(ggml_type, src)?;
    let need = room(dtype, elems, size, out.len())?;
    let out = &mut out[..need];
    let mut row = Vec::new();
    if dtype == Dtype::F32 {
        row.resize(elems, 0.0);
        dec.decode(src, &mut row)?;
        f32_row_le(&row, out);
    } else {
        // a gather's 16-bit path: one pass where the type has a kernel
        let bf16 = dtype == Dtype::Bf16;
        Decoder::Ggml(dec).decode_half(bf16, src, out, &mut row, &mut Vec::new())?;
    }
    Ok(elems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::convert::{f32_to_bf16_row_le, f32_to_f16_row_le};

    /// Two IQ4_NL blocks: every output type equals the row decoder's f32,
    /// converted; bad lengths and types fail without writing.
    #[test]
    fn blocks_decode_as_a_gather_does_and_refuse_bad_arguments() {
        let ty = GgmlType::IQ4_NL;
        let mut src = vec![0u8; 2 * ty.block_bytes()];
        for (i, b) in src.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        // finite scales: the f16 d of each block
        for blk in src.chunks_exact_mut(ty.block_bytes()) {
            blk[..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        }
        let mut want = vec![0f32; 64];
        RowDecoder::new(ty)
            .unwrap()
            .decode(&src, &mut want)
            .unwrap();
        let mut f = vec![0f32; 65];
        assert_eq!(decode_blocks_f32(ty.id(), &src, &mut f).unwrap(), 64);
        assert_eq!(&f[..64], &want[..]);
        assert_eq!(f[64], 0.0);
        let mut b = vec![0u8; 256];
        assert_eq!(
            decode_blocks(ty.id(), &src, Dtype::F32, &mut b).unwrap(),
            64
        );
        let le: Vec<u8> = want.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(b, le);
        for (dtype, conv) in [
            (Dtype::Bf16, f32_to_bf16_row_le as fn(&[f32], &mut [u8])),
            (Dtype::F16, f32_to_f16_row_le),
        ] {
            let mut w = vec![0u8; 128];
            conv(&want, &mut w);
            let mut h = vec![0u8; 128];
            assert_eq!(decode_blocks(ty.id(), &src, dtype, &mut h).unwrap(), 64);
            assert_eq!(h, w, "{dtype}");
        }
        let mut small = vec![7f32; 63];
        let e = decode_blocks_f32(ty.id(), &src, &mut small).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutputSize);
        assert!(small.iter().all(|&x| x == 7.0));
        let e = decode_blocks_f32(ty.id(), &src[..35], &mut f).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutputSize);
        assert!(e.to_string().contains("35 bytes of IQ4_NL"), "{e}");
        let e = decode_blocks_f32(9999, &src, &mut f).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.to_string().contains("9999"), "{e}");
        let e = decode_blocks(ty.id(), &src, Dtype::Raw, &mut b).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
    }
}
