//! The last stage of a gather: a row's stored bytes become the caller's
//! output in the [`Dtype`] asked for (f32, bf16, f16 or the stored bytes).

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use crate::fetch::GatherError;
use crate::layout::Layout;
use crate::quant::convert::{f32_to_bf16, f32_to_f16};
use crate::quant::{DecodeError, RowDecoder};

/// The element type rows are gathered as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Dtype {
    /// Little-endian f32, exactly ggml's `to_float` (the default).
    #[default]
    F32,
    /// bfloat16 bits, rounded to nearest even from the exact f32.
    Bf16,
    /// IEEE binary16 bits, rounded to nearest even from the exact f32.
    F16,
    /// The row's stored bytes, undecoded (for engines that dequantize on
    /// the GPU).
    Raw,
}

impl Dtype {
    /// Every output type.
    pub const ALL: &'static [Dtype] = &[Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::Raw];

    /// The name used on the command line and in the bindings.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::Raw => "raw",
        }
    }

    /// Output bytes of one row of `layout` in this type (`None` on overflow).
    pub fn row_out_bytes(self, layout: &Layout) -> Option<usize> {
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

thread_local! {
    /// One decoded row, for the 16-bit outputs.
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where a gather writes its rows: f32s, or bytes of a [`Dtype`].
pub(crate) struct Out<'a> {
    buf: Buf<'a>,
    /// Output units (floats or bytes) per row.
    row_len: usize,
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
        }
    }

    /// Rows of `dtype` bytes into `out`.
    pub(crate) fn bytes(
        dtype: Dtype,
        layout: &Layout,
        out: &'a mut [u8],
    ) -> Result<Out<'a>, GatherError> {
        let row_len = dtype
            .row_out_bytes(layout)
            .ok_or(GatherError::OutputLength {
                got: out.len(),
                need: usize::MAX,
                rows: 1,
                row_elems: layout.row_elems(),
            })?;
        Ok(Out {
            buf: Buf::Bytes { dtype, bytes: out },
            row_len,
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

    /// Writes the row whose stored bytes are `src` into output slot `i`.
    #[inline]
    pub(crate) fn put(
        &mut self,
        i: usize,
        src: &[u8],
        decoder: &RowDecoder,
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
                    Dtype::F32 => with_row(n / 4, |row| {
                        decoder.decode(src, row)?;
                        for (d, x) in dst.chunks_exact_mut(4).zip(row.iter()) {
                            d.copy_from_slice(&x.to_le_bytes());
                        }
                        Ok(())
                    }),
                    Dtype::Bf16 | Dtype::F16 => with_row(n / 2, |row| {
                        decoder.decode(src, row)?;
                        let conv = if *dtype == Dtype::Bf16 {
                            f32_to_bf16
                        } else {
                            f32_to_f16
                        };
                        for (d, &x) in dst.chunks_exact_mut(2).zip(row.iter()) {
                            d.copy_from_slice(&conv(x).to_le_bytes());
                        }
                        Ok(())
                    }),
                }
            }
        }
    }
}

/// Runs `f` with this thread's row scratch of `elems` floats.
fn with_row<R>(elems: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    ROW.with(|cell| match cell.try_borrow_mut() {
        Ok(mut row) => {
            row.resize(elems, 0.0);
            f(&mut row[..elems])
        }
        Err(_) => f(&mut vec![0.0; elems]),
    })
}
