//! ggml block formats: the [`GgmlType`] table and exact row decoders.
//!
//! Every decoder reproduces ggml's CPU `to_float` bit for bit: the same
//! operation order, no fused multiply-add, exact half and bf16 conversion.
//! [`decode_row`] is the one entry point; it picks a SIMD kernel at run time
//! where one exists and falls back to the scalar reference otherwise.

mod rounding;
mod types;

use crate::error::{Error, ErrorKind};

pub use rounding::Rounding;
pub use types::GgmlType;

/// Errors from decoding rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The type has no decoder (e.g. integer tensor types).
    #[error("ggml type {0} has no row decoder")]
    Unsupported(GgmlType),
    /// The source is not a whole number of blocks, or the output length does
    /// not match the number of elements the source holds.
    #[error("{ty}: {src_bytes} source bytes and {dst_elems} output floats do not match (block: {block_elems} elements in {block_bytes} bytes)")]
    LengthMismatch {
        /// Type being decoded.
        ty: GgmlType,
        /// Bytes given.
        src_bytes: usize,
        /// Floats of room given.
        dst_elems: usize,
        /// Elements per block of `ty`.
        block_elems: usize,
        /// Bytes per block of `ty`.
        block_bytes: usize,
    },
    /// A checkpoint row's parts do not fit its encoding.
    #[error(transparent)]
    Encoding(#[from] encoding::EncodingError),
    /// An engine's rounding rule asked of a GGUF table.
    #[error("rounding rule {rule} does not apply to GGUF tables (ggml type {ty}): the engine rules are for safetensors checkpoints (use exact)")]
    Rounding {
        /// The rule's name.
        rule: &'static str,
        /// The table's type.
        ty: GgmlType,
    },
}

pub mod convert;
#[allow(unsafe_code)] // SIMD intrinsics behind runtime feature checks
mod convert_simd;
pub mod encoding;
#[allow(unsafe_code)] // SIMD intrinsics behind runtime feature checks
mod encoding_simd;
mod float;
mod fp4;
mod iquant;
mod kquant;
mod legacy;
#[allow(unsafe_code)] // SIMD intrinsics behind runtime feature checks
mod simd;
mod ternary;

/// Decodes whole blocks: `src.len()` is a multiple of the block bytes and
/// `dst.len()` the matching element count (checked by the caller).
pub(crate) type BlockFn = fn(&[u8], &mut [f32]);
/// Decodes whole blocks straight into little-endian 16-bit values.
pub(crate) type HalfFn = fn(&[u8], &mut [u8]);

/// The scalar reference decoder for `ty`, if ggml has one.
fn scalar_kernel(ty: GgmlType) -> Option<BlockFn> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => float::decode_f32,
        T::F16 => float::decode_f16,
        T::BF16 => float::decode_bf16,
        T::Q4_0 => legacy::decode_q4_0,
        T::Q4_1 => legacy::decode_q4_1,
        T::Q5_0 => legacy::decode_q5_0,
        T::Q5_1 => legacy::decode_q5_1,
        T::Q8_0 => legacy::decode_q8_0,
        T::IQ4_NL => legacy::decode_iq4_nl,
        T::IQ4_XS => legacy::decode_iq4_xs,
        T::Q2_K => kquant::decode_q2_k,
        T::Q3_K => kquant::decode_q3_k,
        T::Q4_K => kquant::decode_q4_k,
        T::Q5_K => kquant::decode_q5_k,
        T::Q6_K => kquant::decode_q6_k,
        T::MXFP4 => fp4::decode_mxfp4,
        T::NVFP4 => fp4::decode_nvfp4,
        T::TQ1_0 => ternary::decode_tq1_0,
        T::TQ2_0 => ternary::decode_tq2_0,
        T::IQ1_S => iquant::decode_iq1_s,
        T::IQ1_M => iquant::decode_iq1_m,
        T::IQ2_XXS => iquant::decode_iq2_xxs,
        T::IQ2_XS => iquant::decode_iq2_xs,
        T::IQ2_S => iquant::decode_iq2_s,
        T::IQ3_XXS => iquant::decode_iq3_xxs,
        T::IQ3_S => iquant::decode_iq3_s,
        _ => return None,
    })
}

/// A row decoder for one type, chosen once (SIMD where the CPU has it).
#[derive(Clone, Copy)]
pub struct RowDecoder {
    ty: GgmlType,
    kernel: BlockFn,
    simd: bool,
    /// 16-bit kernels (bf16, f16), where the type has them.
    half: [Option<HalfFn>; 2],
}

impl std::fmt::Debug for RowDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowDecoder").field("ty", &self.ty).finish()
    }
}

impl RowDecoder {
    /// The fastest exact decoder this CPU has for `ty`.
    pub fn new(ty: GgmlType) -> Result<Self, DecodeError> {
        if let Some(kernel) = simd::kernel(ty) {
            return Ok(RowDecoder {
                ty,
                kernel,
                simd: true,
                half: [simd::half_kernel(ty, true), simd::half_kernel(ty, false)],
            });
        }
        Self::scalar(ty)
    }

    /// The portable scalar reference decoder for `ty`.
    pub fn scalar(ty: GgmlType) -> Result<Self, DecodeError> {
        let kernel = scalar_kernel(ty).ok_or(DecodeError::Unsupported(ty))?;
        Ok(RowDecoder {
            ty,
            kernel,
            simd: false,
            half: [None, None],
        })
    }

    /// True if this decoder is a SIMD kernel (false: the scalar reference).
    pub fn is_simd(&self) -> bool {
        self.simd
    }

    /// The type this decoder reads.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Decodes `src` (whole blocks) into `dst`, which must hold exactly the
    /// elements `src` encodes.
    pub fn decode(&self, src: &[u8], dst: &mut [f32]) -> Result<(), DecodeError> {
        let (be, bb) = (self.ty.block_elems(), self.ty.block_bytes());
        if !src.len().is_multiple_of(bb) || src.len() / bb * be != dst.len() {
            return Err(DecodeError::LengthMismatch {
                ty: self.ty,
                src_bytes: src.len(),
                dst_elems: dst.len(),
                block_elems: be,
                block_bytes: bb,
            });
        }
        (self.kernel)(src, dst);
        Ok(())
    }

    /// Decodes `src` (whole blocks) straight into little-endian bf16
    /// (`bf16`) or f16 bits in `dst` (2 bytes an element), rounded to
    /// nearest even from the exact f32 as [`convert`] does,
    /// when this type has such a kernel: `Ok(false)` (nothing written)
    /// when it has none.
    pub fn decode_half(&self, src: &[u8], dst: &mut [u8], bf16: bool) -> Result<bool, DecodeError> {
        let Some(half) = self.half[usize::from(!bf16)] else {
            return Ok(false);
        };
        let (be, bb) = (self.ty.block_elems(), self.ty.block_bytes());
        if !src.len().is_multiple_of(bb) || src.len() / bb * be * 2 != dst.len() {
            return Err(DecodeError::LengthMismatch {
                ty: self.ty,
                src_bytes: src.len(),
                dst_elems: dst.len() / 2,
                block_elems: be,
                block_bytes: bb,
            });
        }
        half(src, dst);
        Ok(true)
    }
}

/// Decodes one row (or any whole number of blocks) of `ty` into `dst`.
///
/// ```
/// use pleio::quant::{decode_row, GgmlType};
/// let bytes = 1.5f32.to_le_bytes();
/// let mut out = [0f32; 1];
/// decode_row(GgmlType::F32, &bytes, &mut out).unwrap();
/// assert_eq!(out[0], 1.5);
/// ```
pub fn decode_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), DecodeError> {
    RowDecoder::new(ty)?.decode(src, dst)
}

/// True if pleio can decode `ty`.
pub fn can_decode(ty: GgmlType) -> bool {
    scalar_kernel(ty).is_some()
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Error {
        Error::new(ErrorKind::Unsupported, e)
    }
}
