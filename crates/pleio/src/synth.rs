//! Synthetic model files: the real architectures' metadata and PLE tensor
//! shape, filled with seeded random valid blocks (or left as a sparse hole).
//!
//! Used by `pleio synth`, the demo and the tests.

use crate::quant::GgmlType;

/// Released qwen4exp n-gram layer multipliers (`qwen4exp.ple.layer_multipliers`).
pub const QWEN_MULTIPLIERS: [u64; 3] = [23703573157769, 20109073645365, 8052911324071];
/// Rows of the released qwen4exp PLE table (`ne[1]`).
pub const QWEN_FULL_ROWS: u64 = 320_001_536;
/// Elements per qwen4exp PLE row.
pub const QWEN_ROW_ELEMS: u64 = 160;
/// qwen4exp n-gram reset token.
pub const QWEN_EOS: u32 = 248044;
/// qwen4exp image token.
pub const QWEN_IMAGE: u32 = 248056;
/// Heads of the released qwen4exp table: (ngram_size - 1) * heads_per_ngram.
pub const QWEN_HEADS: usize = 16;
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
        let sum_from = |start: u64| -> u64 { primes_from(start).take(QWEN_HEADS).sum() };
        if sum_from(2) > rows {
            return None;
        }
        // Largest start with sum_from(start) <= rows; the sum grows with start.
        let (mut lo, mut hi) = (2u64, rows / QWEN_HEADS as u64 + 1);
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if sum_from(mid) <= rows {
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

    /// Rows the heads address (the table may have padding rows after them).
    pub fn addressed_rows(&self) -> u64 {
        self.sizes.iter().sum()
    }
}

fn is_prime(n: u64) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n % 2 == 0 {
        return false;
    }
    let mut d = 3u64;
    while d.saturating_mul(d) <= n {
        if n % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

fn primes_from(start: u64) -> impl Iterator<Item = u64> {
    (start..).filter(|&n| is_prime(n))
}

/// Elements per row of a Gemma 4 PLE table with `n_layer` layers.
pub fn gemma_row_elems(n_layer: u64) -> u64 {
    GEMMA_PER_LAYER * n_layer
}

/// True if `ty` can hold a qwen4exp row (160 elements is whole blocks).
pub fn fits_qwen_row(ty: GgmlType) -> bool {
    ty.row_bytes(QWEN_ROW_ELEMS).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_size_heads_are_the_released_primes() {
        let h = QwenHeads::for_rows(QWEN_FULL_ROWS).unwrap();
        assert_eq!(
            h.sizes,
            [
                20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
                20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171
            ]
        );
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
}
