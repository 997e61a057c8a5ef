//! The ggml tensor types: id, name, block geometry.

use std::fmt;

macro_rules! ggml_types {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $elems:literal, $bytes:literal; )*) => {
        /// A ggml tensor element type, as stored in GGUF tensor infos.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        #[non_exhaustive]
        pub enum GgmlType {
            $( $(#[$doc])* $variant, )*
        }

        impl GgmlType {
            /// Every known type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The type with this GGUF id, if known.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $( $id => Some(GgmlType::$variant), )*
                    _ => None,
                }
            }

            /// The GGUF type id.
            pub fn id(self) -> u32 {
                match self { $( GgmlType::$variant => $id, )* }
            }

            /// The canonical ggml name, e.g. `IQ4_NL`.
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$variant => $name, )* }
            }

            /// Elements per block (1 for plain float and integer types).
            pub fn block_elems(self) -> usize {
                match self { $( GgmlType::$variant => $elems, )* }
            }

            /// Bytes per block.
            pub fn block_bytes(self) -> usize {
                match self { $( GgmlType::$variant => $bytes, )* }
            }
        }
    };
}

ggml_types! {
    /// 32-bit IEEE float.
    F32 = 0, "F32", 1, 4;
    /// 16-bit IEEE half.
    F16 = 1, "F16", 1, 2;
    /// 4-bit, one f16 scale per 32.
    Q4_0 = 2, "Q4_0", 32, 18;
    /// 4-bit, f16 scale and min per 32.
    Q4_1 = 3, "Q4_1", 32, 20;
    /// 5-bit, one f16 scale per 32.
    Q5_0 = 6, "Q5_0", 32, 22;
    /// 5-bit, f16 scale and min per 32.
    Q5_1 = 7, "Q5_1", 32, 24;
    /// 8-bit, one f16 scale per 32.
    Q8_0 = 8, "Q8_0", 32, 34;
    /// 8-bit with f16 scale and sum per 32 (an intermediate type; no decoder).
    Q8_1 = 9, "Q8_1", 32, 36;
    /// 2-bit K-quant.
    Q2_K = 10, "Q2_K", 256, 84;
    /// 3-bit K-quant.
    Q3_K = 11, "Q3_K", 256, 110;
    /// 4-bit K-quant.
    Q4_K = 12, "Q4_K", 256, 144;
    /// 5-bit K-quant.
    Q5_K = 13, "Q5_K", 256, 176;
    /// 6-bit K-quant.
    Q6_K = 14, "Q6_K", 256, 210;
    /// 8-bit K-quant (intermediate type).
    Q8_K = 15, "Q8_K", 256, 292;
    /// 2.06 bpw i-quant.
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    /// 2.31 bpw i-quant.
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    /// 3.06 bpw i-quant.
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    /// 1.56 bpw i-quant.
    IQ1_S = 19, "IQ1_S", 256, 50;
    /// 4-bit non-linear, blocks of 32.
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    /// 3.44 bpw i-quant.
    IQ3_S = 21, "IQ3_S", 256, 110;
    /// 2.5 bpw i-quant.
    IQ2_S = 22, "IQ2_S", 256, 82;
    /// 4-bit non-linear, super-blocks of 256.
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    /// 8-bit integer.
    I8 = 24, "I8", 1, 1;
    /// 16-bit integer.
    I16 = 25, "I16", 1, 2;
    /// 32-bit integer.
    I32 = 26, "I32", 1, 4;
    /// 64-bit integer.
    I64 = 27, "I64", 1, 8;
    /// 64-bit IEEE float.
    F64 = 28, "F64", 1, 8;
    /// 1.75 bpw i-quant.
    IQ1_M = 29, "IQ1_M", 256, 56;
    /// bfloat16.
    BF16 = 30, "BF16", 1, 2;
    /// Ternary, 1.69 bpw.
    TQ1_0 = 34, "TQ1_0", 256, 54;
    /// Ternary, 2.06 bpw.
    TQ2_0 = 35, "TQ2_0", 256, 66;
    /// OCP MX fp4 (e2m1) with an e8m0 scale per 32.
    MXFP4 = 39, "MXFP4", 32, 17;
    /// NVIDIA fp4 (e2m1) with a ue4m3 scale per 16, blocks of 64.
    NVFP4 = 40, "NVFP4", 64, 36;
    /// 1-bit, blocks of 128 (geometry only; no decoder).
    Q1_0 = 41, "Q1_0", 128, 18;
}

impl GgmlType {
    /// The type with this name (case-insensitive), if known.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Bytes of a row of `elems` elements, or `None` if `elems` is not a
    /// whole number of blocks or the size overflows.
    pub fn row_bytes(self, elems: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !elems.is_multiple_of(be) {
            return None;
        }
        (elems / be).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(u32::MAX), None);
    }

    #[test]
    fn row_bytes_of_ple_rows() {
        assert_eq!(GgmlType::IQ4_NL.row_bytes(160), Some(90));
        assert_eq!(GgmlType::Q8_0.row_bytes(160), Some(170));
        assert_eq!(GgmlType::MXFP4.row_bytes(160), Some(85));
        assert_eq!(GgmlType::Q5_K.row_bytes(256 * 42), Some(7392));
        assert_eq!(GgmlType::Q4_K.row_bytes(160), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }
}
