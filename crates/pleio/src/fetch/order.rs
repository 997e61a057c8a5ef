//! Sorting a request's `(row, index)` pairs by row (then index), the first
//! step of every gather that deduplicates or reads in file order.
//!
//! A large request is sorted as packed `u64` keys (`row << b | index`, `b`
//! the bits of the largest index) by a least-significant-digit radix sort
//! of 8-bit digits, as many as the largest key has: for 1792 random rows of
//! a 48M-row table, about 3x faster than a comparison sort of the pairs.
//! The result is the same as `sort_unstable` of the pairs (they are
//! distinct, as their indices are).

/// Requests shorter than this are sorted by comparison (a radix pass
/// costs a 256-entry histogram whatever the length).
const RADIX_FROM: usize = 256;

/// Reused buffers of [`sort_pairs`].
#[derive(Default)]
pub(super) struct SortBuffers {
    keys: Vec<u64>,
    tmp: Vec<u64>,
}

/// Sorts `pairs` ascending, as `pairs.sort_unstable()` does.
pub(super) fn sort_pairs(pairs: &mut [(u64, usize)], buf: &mut SortBuffers) {
    if pairs.len() < RADIX_FROM {
        pairs.sort_unstable();
        return;
    }
    let index_bits = usize::BITS - (pairs.len() - 1).leading_zeros();
    let max_row = pairs.iter().map(|p| p.0).max().unwrap_or(0);
    let row_bits = u64::BITS - max_row.leading_zeros();
    if row_bits + index_bits > u64::BITS {
        pairs.sort_unstable();
        return;
    }
    let mask = (1u64 << index_bits) - 1;
    buf.keys.clear();
    buf.keys
        .extend(pairs.iter().map(|&(r, i)| (r << index_bits) | i as u64));
    radix_sort(&mut buf.keys, &mut buf.tmp, row_bits + index_bits);
    for (p, &k) in pairs.iter_mut().zip(&buf.keys) {
        *p = (k >> index_bits, (k & mask) as usize);
    }
}

/// Sorts `keys` by their low `bits` bits (the rest are zero), 8 at a
/// pass; `tmp` is scratch of any content.
fn radix_sort(keys: &mut Vec<u64>, tmp: &mut Vec<u64>, bits: u32) {
    // Every element of `tmp` is written before it is read: only its length
    // matters (no clearing, so a reused buffer is not zeroed each call).
    tmp.resize(keys.len(), 0);
    let mut shift = 0;
    while shift < bits {
        let mut at = [0usize; 256];
        for &k in keys.iter() {
            at[((k >> shift) & 255) as usize] += 1;
        }
        // A digit every key shares leaves the order as it is.
        if at.contains(&keys.len()) {
            shift += 8;
            continue;
        }
        let mut sum = 0;
        for c in at.iter_mut() {
            let n = *c;
            *c = sum;
            sum += n;
        }
        for &k in keys.iter() {
            let d = ((k >> shift) & 255) as usize;
            tmp[at[d]] = k;
            at[d] += 1;
        }
        std::mem::swap(keys, tmp);
        shift += 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(rows: Vec<u64>) {
        let mut want: Vec<(u64, usize)> = rows.iter().copied().zip(0..).collect();
        let mut got = want.clone();
        want.sort_unstable();
        sort_pairs(&mut got, &mut SortBuffers::default());
        assert_eq!(got, want);
    }

    #[test]
    fn sorts_as_a_comparison_sort_does() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for (n, rows) in [(10, 100), (256, 7), (1792, 48 << 20), (5000, 3), (300, 1 << 40)] {
            check((0..n).map(|_| next(rows)).collect());
        }
        // Duplicates, one row only, rows too large to pack.
        check(vec![5; 600]);
        check((0..400).map(|i| u64::MAX - (i % 3)).collect());
        check((0..700).rev().collect());
        check(Vec::new());
    }
}
