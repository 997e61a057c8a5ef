//! The warm floor (`limit-warm` in `pleio bench` and `pleio demo`): the least
//! a warm gather of a batch can cost on this machine, single thread. The
//! batch's distinct rows' stored bytes are read once (untimed) into one
//! resident buffer; a timed pass then writes every requested row from that
//! buffer into the output by a plain loop: copied as they are for `raw`,
//! decoded by the engine's decoder (the fastest it has here) for f32, bf16
//! and f16. No mapping, no residency bookkeeping, no staging, no locks:
//! what is left is the copy and the decode every strategy must do too.

use pleio::{Dtype, Error, Strategy, Table};

/// Why a warm floor could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum WarmFloorError {
    /// The batch's distinct rows do not fit in memory.
    #[error("the warm floor's {rows} distinct rows do not fit in memory")]
    TooBig {
        /// Distinct rows of the batch.
        rows: usize,
    },
    /// Reading the rows failed.
    #[error(transparent)]
    Read(#[from] Error),
}

/// The resident copy of one batch's rows, and where each request's row is.
#[derive(Debug, Clone)]
pub struct WarmFloor {
    stored: Vec<u8>,
    order: Vec<u32>,
}

impl WarmFloor {
    /// Reads the stored bytes of the distinct rows of `rows` (positioned
    /// reads, untimed) into one buffer.
    pub fn new(t: &Table, rows: &[u64]) -> Result<WarmFloor, WarmFloorError> {
        let mut distinct = rows.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let too_big = || WarmFloorError::TooBig {
            rows: distinct.len(),
        };
        let bytes = t
            .out_bytes(Dtype::Raw, distinct.len())
            .ok_or_else(too_big)?;
        let mut stored = Vec::new();
        stored.try_reserve_exact(bytes).map_err(|_| too_big())?;
        stored.resize(bytes, 0);
        t.gather_as_with(Strategy::Pread, Dtype::Raw, &distinct, &mut stored)?;
        // Every request's row is among the distinct ones, and fewer than
        // 2^32 of them fit any output.
        let order = rows
            .iter()
            .map(|r| distinct.binary_search(r).map_or(u32::MAX, |k| k as u32))
            .collect();
        Ok(WarmFloor { stored, order })
    }

    /// One pass as f32 into `out` (`rows.len() * row_elems` floats).
    pub fn run(&self, t: &Table, out: &mut [f32]) -> Result<(), Error> {
        t.decode_stored(&self.stored, &self.order, out)
    }

    /// One pass as `dtype` bytes into `out`.
    pub fn run_as(&self, t: &Table, dtype: Dtype, out: &mut [u8]) -> Result<(), Error> {
        t.decode_stored_as(dtype, &self.stored, &self.order, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::SynthSpec;
    use pleio::quant::GgmlType;

    #[test]
    fn a_bad_order_or_output_is_an_error_not_a_panic() {
        let file = tempfile::NamedTempFile::new().unwrap();
        SynthSpec::qwen(GgmlType::Q8_0, 1000, 4)
            .write(file.reopen().unwrap(), &mut |_| {})
            .unwrap();
        let t = Table::open(file.path()).unwrap();
        let f = WarmFloor::new(&t, &[3, 9, 3]).unwrap();
        let e = t.row_elems();
        let mut out = vec![0f32; 3 * e];
        f.run(&t, &mut out).unwrap();
        let mut want = vec![0f32; 3 * e];
        t.gather(&[3, 9, 3], &mut want).unwrap();
        assert_eq!(out, want);
        // Too short an output, an index past the stored rows.
        assert!(f.run(&t, &mut out[..e]).is_err());
        let stored = vec![0u8; t.row_bytes() as usize];
        assert!(t.decode_stored(&stored, &[1], &mut out[..e]).is_err());
        assert!(t
            .decode_stored(&stored, &[u32::MAX], &mut out[..e])
            .is_err());
        let mut bytes = vec![0u8; t.out_bytes(Dtype::Bf16, 1).unwrap()];
        assert!(t
            .decode_stored_as(Dtype::Bf16, &stored, &[0], &mut bytes)
            .is_ok());
        assert!(t
            .decode_stored_as(Dtype::Bf16, &stored, &[0, 0], &mut bytes)
            .is_err());
    }
}
