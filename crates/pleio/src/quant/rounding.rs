//! [`Rounding`]: the rule by which decoded values are rounded to 16-bit
//! outputs.

use std::fmt;
use std::str::FromStr;

/// How outputs are rounded: pleio's exact rule, or an engine's own,
/// reproduced bit for bit so that a drop-in gives the engine's rows (see
/// `docs/rounding.md`). [`Dtype::Raw`](crate::Dtype::Raw) is never affected. A rule that does
/// not apply to a table's encoding is an
/// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) error of
/// [`Table::with_rounding`](crate::Table::with_rounding) /
/// [`OpenOptions::rounding`](crate::OpenOptions::rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Rounding {
    /// The stored value, computed exactly (in f32, where every product of
    /// the encodings is exact) and rounded once to the output type. Every
    /// table.
    #[default]
    Exact,
    /// vLLM's and SGLang's rule (`rows.to(dtype) * weight_scale.to(dtype)`
    /// in torch), for FP8 tables (per-tensor or per-row scale): bf16 is
    /// `bf16(e4m3 * bf16(scale))`, f16 is `f16(e4m3 * f16(scale))` (the
    /// product exact in f32, so rounded once), f32 is exact. NVFP4 tables:
    /// vLLM's CPU `dequantize_to_dtype`, `v * (e4m3(scale) * global)` in
    /// f32 (the block scale times the global one first; `Exact` is
    /// `(v * e4m3(scale)) * global`, vLLM's GPU kernel), every output the
    /// conversion of that f32. BF16, F16 and F32 rows: the same as `Exact`.
    Vllm,
    /// mlx's `mx.dequantize` of MLX affine 4-bit tables, which computes in
    /// the scales' type (bf16) whatever the output type:
    /// `y = bf16(bf16(scale * q) + bias)` (each operation in f32, rounded to
    /// bf16), then bf16 is `y`, f16 is `f16(y)` and f32 is `y` widened (so
    /// f32 outputs change too). BF16 rows: the same as `Exact`.
    Mlx,
}

impl Rounding {
    /// Every rule.
    pub const ALL: &'static [Rounding] = &[Rounding::Exact, Rounding::Vllm, Rounding::Mlx];

    /// The name used on the command line and in the bindings (an engine
    /// has `Display`).
    #[cfg_attr(feature = "internals", visibility::make(pub))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Rounding::Exact => "exact",
            Rounding::Vllm => "vllm",
            Rounding::Mlx => "mlx",
        }
    }
}

impl fmt::Display for Rounding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Rounding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let l = s.to_ascii_lowercase();
        let l = if l == "sglang" { "vllm".to_string() } else { l };
        Rounding::ALL
            .iter()
            .copied()
            .find(|r| r.name() == l)
            .ok_or_else(|| format!("unknown rounding rule {s:?} (known: exact, vllm, sglang, mlx)"))
    }
}
