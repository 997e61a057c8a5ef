//! Fetching rows: the strategies that turn row ids into decoded f32 rows.
//!
//! Every strategy produces identical bytes for the same request; they differ
//! only in how the row bytes get from the disk into memory. This stage
//! validates every id before any I/O, so a bad id never yields partial output.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::model::Model;
use crate::quant::{DecodeError, RowDecoder};
use crate::table::{Table, TableError};

/// How row bytes are brought in from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// Plain read-only mapping: each cold row is a synchronous page fault.
    Fault,
}

impl Strategy {
    /// Every strategy this build has.
    pub const ALL: &'static [Strategy] = &[Strategy::Fault];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Fault => "fault",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .iter()
            .copied()
            .find(|st| st.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<_> = Strategy::ALL.iter().map(|s| s.name()).collect();
                format!("unknown strategy {s:?} (known: {})", names.join(", "))
            })
    }
}

/// Errors from a gather.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatherError {
    /// A row id is out of range (nothing was read or written).
    #[error(transparent)]
    Table(#[from] TableError),
    /// The table's type cannot be decoded.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A row's bytes are not inside the mapped file (the table was built by
    /// hand with a wrong offset, or the file shrank).
    #[error("row bytes at offset {offset} (+{len}) are outside the file")]
    OutsideFile {
        /// Absolute offset of the row.
        offset: u64,
        /// Row bytes.
        len: u64,
    },
    /// The output buffer does not hold `rows * row_elems` floats.
    #[error("output holds {got} floats but {rows} rows of {row_elems} need {need}")]
    OutputLength {
        /// Floats given.
        got: usize,
        /// Floats needed.
        need: usize,
        /// Rows requested.
        rows: usize,
        /// Elements per row.
        row_elems: u64,
    },
}

/// What one gather did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GatherStats {
    /// Row ids requested (duplicates counted).
    pub rows: u64,
    /// Row bytes copied out of the file (duplicates counted).
    pub bytes: u64,
}

/// Gathers rows of one table of an open model.
#[derive(Debug, Clone)]
pub struct TableReader {
    model: Arc<Model>,
    table: Table,
    decoder: RowDecoder,
}

impl TableReader {
    /// A reader for `table` of `model`; fails if the type has no decoder.
    pub fn new(model: Arc<Model>, table: Table) -> Result<TableReader, GatherError> {
        let decoder = RowDecoder::new(table.ty)?;
        Ok(TableReader {
            model,
            table,
            decoder,
        })
    }

    /// The table read.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Floats one row decodes to.
    pub fn row_elems(&self) -> usize {
        self.table.row_elems as usize
    }

    /// Decodes `rows` (in request order, duplicates repeated) into `out`,
    /// which must hold `rows.len() * row_elems` floats.
    pub fn gather(
        &self,
        strategy: Strategy,
        rows: &[u64],
        out: &mut [f32],
    ) -> Result<GatherStats, GatherError> {
        let elems = self.row_elems();
        let need = rows.len().saturating_mul(elems);
        if out.len() != need {
            return Err(GatherError::OutputLength {
                got: out.len(),
                need,
                rows: rows.len(),
                row_elems: self.table.row_elems,
            });
        }
        self.table.check_rows(rows)?;
        match strategy {
            Strategy::Fault => self.gather_mapped(rows, out),
        }
    }

    /// The straight mapped path: copy-free decode from the mapping.
    fn gather_mapped(&self, rows: &[u64], out: &mut [f32]) -> Result<GatherStats, GatherError> {
        let bytes = self
            .model
            .shard_mapping(self.table.shard)
            .map_or(&[][..], |m| m.as_slice());
        let rb = self.table.row_bytes as usize;
        for (&row, dst) in rows.iter().zip(out.chunks_exact_mut(self.row_elems())) {
            let start = self.table.row_offset(row)?;
            // The model checked at open that the tensor lies inside its file.
            let src = usize::try_from(start)
                .ok()
                .and_then(|s| bytes.get(s..s + rb))
                .ok_or(GatherError::OutsideFile {
                    offset: start,
                    len: rb as u64,
                })?;
            self.decoder.decode(src, dst)?;
        }
        Ok(GatherStats {
            rows: rows.len() as u64,
            bytes: rows.len() as u64 * self.table.row_bytes,
        })
    }
}
