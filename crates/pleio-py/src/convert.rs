//! Python arguments into slices the engine takes: integer ids and tokens
//! (lists, NumPy arrays, buffers, `__dlpack__` tensors) and `out` buffers
//! (NumPy arrays, buffers, `__dlpack__` tensors), borrowed without copying
//! where the layout allows, and checked before anything is gathered.

use numpy::ndarray::IxDyn;
use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArray1,
    PyReadwriteArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};

use pleio::Dtype;

use crate::dlpack::DlView;
use crate::errors;

/// `numpy` functions called from here, looked up once.
struct Numpy {
    asarray: Py<PyAny>,
    from_dlpack: Py<PyAny>,
    uint16: Py<PyAny>,
    int64: Py<PyAny>,
}

static NUMPY: PyOnceLock<Numpy> = PyOnceLock::new();

fn numpy(py: Python<'_>) -> PyResult<&Numpy> {
    NUMPY.get_or_try_init(py, || {
        let np = py.import("numpy")?;
        Ok(Numpy {
            asarray: np.getattr("asarray")?.unbind(),
            from_dlpack: np.getattr("from_dlpack")?.unbind(),
            uint16: np.getattr("uint16")?.unbind(),
            int64: np.getattr("int64")?.unbind(),
        })
    })
}

/// `ml_dtypes.bfloat16`, when ml_dtypes is importable.
static BF16: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();

/// True when bfloat16 output is `ml_dtypes.bfloat16` (else `uint16` bits).
pub fn has_bfloat16(py: Python<'_>) -> bool {
    BF16.get_or_init(py, || {
        py.import("ml_dtypes")
            .and_then(|m| m.getattr("bfloat16"))
            .ok()
            .map(Bound::unbind)
    })
    .is_some()
}

/// Integers borrowed from a Python object (or copied when they had to be
/// converted).
pub enum Ints<'py> {
    /// An int64 array.
    I64(PyReadonlyArray1<'py, i64>),
    /// A uint64 array.
    U64(PyReadonlyArray1<'py, u64>),
    /// An int32 array.
    I32(PyReadonlyArray1<'py, i32>),
    /// A uint32 array.
    U32(PyReadonlyArray1<'py, u32>),
    /// A C-contiguous DLPack tensor of 32- or 64-bit integers, read in
    /// place (the view keeps the tensor alive).
    Dl(DlView<'py>),
    /// Copied (a list, an array that was not contiguous, narrow DLPack
    /// integers).
    Owned(Vec<i64>),
}

/// The integers of [`Ints`] as a slice, to hand to the engine without the
/// GIL.
#[derive(Clone, Copy)]
pub enum IntSlice<'a> {
    /// int64.
    I64(&'a [i64]),
    /// uint64.
    U64(&'a [u64]),
    /// int32.
    I32(&'a [i32]),
    /// uint32.
    U32(&'a [u32]),
}

impl IntSlice<'_> {
    /// How many.
    pub fn len(self) -> usize {
        match self {
            IntSlice::I64(s) => s.len(),
            IntSlice::U64(s) => s.len(),
            IntSlice::I32(s) => s.len(),
            IntSlice::U32(s) => s.len(),
        }
    }

    /// Copies the ids into `rows` (once, widened), then checks that copy
    /// against `table` ([`pleio::Table::rows_from`]). The one way ids reach
    /// the engine from Python: NumPy arrays and DLPack tensors are read in
    /// place by this copy only, so another thread changing them meanwhile
    /// can change what is gathered, never make an unchecked id be read.
    pub fn rows_into(self, table: &pleio::Table, rows: &mut Vec<u64>) -> pleio::Result<()> {
        match self {
            IntSlice::I64(s) => table.rows_from(s, rows),
            IntSlice::U64(s) => table.rows_from(s, rows),
            IntSlice::I32(s) => table.rows_from(s, rows),
            IntSlice::U32(s) => table.rows_from(s, rows),
        }
    }

    /// As token ids (`u32`): a negative or too large value is a
    /// `ValueError` naming it.
    pub fn tokens(self) -> PyResult<Vec<u32>> {
        fn conv<T: Copy + std::fmt::Display>(
            s: &[T],
            f: impl Fn(T) -> Option<u32>,
        ) -> PyResult<Vec<u32>> {
            s.iter()
                .enumerate()
                .map(|(i, &t)| {
                    f(t).ok_or_else(|| {
                        PyValueError::new_err(format!(
                            "token {t} (at index {i}) is not a token id (0..=4294967295)"
                        ))
                    })
                })
                .collect()
        }
        match self {
            IntSlice::I64(s) => conv(s, |t| u32::try_from(t).ok()),
            IntSlice::U64(s) => conv(s, |t| u32::try_from(t).ok()),
            IntSlice::I32(s) => conv(s, |t| u32::try_from(t).ok()),
            IntSlice::U32(s) => Ok(s.to_vec()),
        }
    }
}

impl<'py> Ints<'py> {
    /// The integers.
    pub fn slice(&self) -> IntSlice<'_> {
        // as_slice cannot fail: only contiguous arrays are kept borrowed.
        match self {
            Ints::I64(a) => IntSlice::I64(a.as_slice().unwrap_or(&[])),
            Ints::U64(a) => IntSlice::U64(a.as_slice().unwrap_or(&[])),
            Ints::I32(a) => IntSlice::I32(a.as_slice().unwrap_or(&[])),
            Ints::U32(a) => IntSlice::U32(a.as_slice().unwrap_or(&[])),
            // Only views int_slice takes are kept as `Dl`.
            Ints::Dl(v) => v.int_slice().unwrap_or(IntSlice::I64(&[])),
            Ints::Owned(v) => IntSlice::I64(v),
        }
    }

    /// Reads `obj` as integers of any shape (see [`Ints::extract`]) and
    /// returns them with that shape (a list or tuple is 1-D).
    pub fn extract_shaped(
        obj: &Bound<'py, PyAny>,
        what: &str,
    ) -> PyResult<(Ints<'py>, Vec<usize>)> {
        if let Ok(arr) = obj.cast::<PyUntypedArray>() {
            let shape = arr.shape().to_vec();
            return Ok((Ints::extract(obj, what)?, shape));
        }
        let mut dl_shape = None;
        if obj.cast::<PyList>().is_err() && obj.cast::<PyTuple>().is_err() {
            if let Some(view) = DlView::of(obj, what)? {
                dl_shape = Some(view.shape().to_vec());
                if view.is_contiguous() {
                    view.check_ids(what)?;
                    let shape = view.shape().to_vec();
                    let ints = if view.int_slice().is_some() {
                        Ints::Dl(view)
                    } else {
                        Ints::Owned(view.widened_ids())
                    };
                    return Ok((ints, shape));
                }
            }
        }
        let ints = Ints::extract(obj, what)?;
        let n = ints.slice().len();
        Ok((ints, dl_shape.unwrap_or_else(|| vec![n])))
    }

    /// Reads `obj` as a 1-D sequence of integers: a list or tuple of ints, a
    /// NumPy array of any integer type, anything `numpy.asarray` takes
    /// (buffers, `range`), or a tensor with `__dlpack__` (on the CPU).
    /// `what` names the argument in errors.
    pub fn extract(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Ints<'py>> {
        if let Some(ints) = Ints::from_array(obj, what)? {
            return Ok(ints);
        }
        if let Ok(list) = obj.cast::<PyList>() {
            return Ints::from_items(list.iter(), what);
        }
        if let Ok(tuple) = obj.cast::<PyTuple>() {
            return Ints::from_items(tuple.iter(), what);
        }
        let py = obj.py();
        let np = numpy(py)?;
        let arr = if obj.hasattr("__dlpack__")? {
            np.from_dlpack.bind(py).call1((obj,))?
        } else {
            np.asarray.bind(py).call1((obj,)).map_err(|e| {
                PyTypeError::new_err(format!(
                    "{what} must be a 1-D sequence of integers, not {}: {e}",
                    type_name(obj)
                ))
            })?
        };
        match Ints::from_array(&arr, what)? {
            Some(ints) => Ok(ints),
            None => Err(PyTypeError::new_err(format!(
                "{what} must be a 1-D sequence of integers, not {}",
                type_name(obj)
            ))),
        }
    }

    fn from_items(
        items: impl Iterator<Item = Bound<'py, PyAny>>,
        what: &str,
    ) -> PyResult<Ints<'py>> {
        items
            .enumerate()
            .map(|(i, item)| {
                item.extract::<i64>().map_err(|_| {
                    PyTypeError::new_err(format!(
                        "{what}[{i}] is {} {}, not an integer",
                        type_name(&item),
                        item.repr().map(|r| r.to_string()).unwrap_or_default()
                    ))
                })
            })
            .collect::<PyResult<Vec<i64>>>()
            .map(Ints::Owned)
    }

    /// `obj` if it is a NumPy array: `None` when it is not one, an error
    /// when it is not 1-D of integers.
    fn from_array(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Option<Ints<'py>>> {
        let Ok(arr) = obj.cast::<PyUntypedArray>() else {
            return Ok(None);
        };
        if arr.ndim() == 0 {
            return Err(PyTypeError::new_err(format!(
                "{what} must be a 1-D sequence of integers, not a scalar ({})",
                type_name(obj)
            )));
        }
        let flat;
        let arr = if arr.ndim() == 1 {
            arr
        } else {
            // Any shape: its elements in C order (a view when contiguous).
            flat = arr.call_method0("ravel")?.cast_into::<PyUntypedArray>()?;
            &flat
        };
        macro_rules! borrowed {
            ($t:ty, $variant:ident) => {
                if let Ok(a) = arr.cast::<PyArray1<$t>>() {
                    let r = a
                        .try_readonly()
                        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
                    return Ok(Some(if r.as_slice().is_ok() {
                        Ints::$variant(r)
                    } else {
                        Ints::Owned(r.as_array().iter().map(|&v| v as i64).collect())
                    }));
                }
            };
        }
        borrowed!(i64, I64);
        borrowed!(u64, U64);
        borrowed!(i32, I32);
        borrowed!(u32, U32);
        let kind = arr.dtype().kind();
        if kind == b'i' || kind == b'u' {
            // int8, int16, uint8, uint16 and the like: widen.
            let wide = arr.call_method1("astype", (numpy(obj.py())?.int64.bind(obj.py()),))?;
            let a = wide.cast::<PyArray1<i64>>()?;
            let r = a
                .try_readonly()
                .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
            return Ok(Some(Ints::Owned(r.as_array().to_vec())));
        }
        Err(PyTypeError::new_err(format!(
            "{what} must hold integers, got an array of dtype {}",
            arr.dtype()
        )))
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A writable, C-contiguous buffer of the exact size, borrowed for one
/// gather (rust-numpy's borrow flag keeps other extensions off it).
pub enum OutBuf<'py> {
    /// float32 elements.
    F32(PyReadwriteArrayDyn<'py, f32>),
    /// 2-byte elements (bfloat16 or float16 bits).
    U16(PyReadwriteArrayDyn<'py, u16>),
    /// bfloat16 (ml_dtypes) elements.
    Bf16(PyReadwriteArrayDyn<'py, half::bf16>),
    /// float16 elements.
    F16(PyReadwriteArrayDyn<'py, half::f16>),
    /// Bytes.
    U8(PyReadwriteArrayDyn<'py, u8>),
}

/// Where a gather writes: f32s for `float32`, else bytes.
pub enum Target<'a> {
    /// Decoded straight into floats.
    F32(&'a mut [f32]),
    /// Bytes of the dtype.
    Bytes(&'a mut [u8]),
}

impl<'a> Target<'a> {
    /// `bytes` for `dtype`: as floats for float32 when they are aligned
    /// (the engine decodes straight into them), else as bytes.
    pub fn of_bytes(dtype: Dtype, bytes: &'a mut [u8]) -> Target<'a> {
        let aligned = (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>());
        if dtype == Dtype::F32 && aligned && bytes.len().is_multiple_of(4) {
            return Target::F32(bytemuck::cast_slice_mut(bytes));
        }
        Target::Bytes(bytes)
    }
}

impl<'py> OutBuf<'py> {
    /// The memory to write, as the engine takes it.
    pub fn target(&mut self) -> PyResult<Target<'_>> {
        let err = |e: numpy::AsSliceError| PyValueError::new_err(format!("out: {e}"));
        Ok(match self {
            OutBuf::F32(a) => Target::F32(a.as_slice_mut().map_err(err)?),
            OutBuf::U16(a) => {
                Target::Bytes(bytemuck::cast_slice_mut(a.as_slice_mut().map_err(err)?))
            }
            OutBuf::Bf16(a) => {
                Target::Bytes(bytemuck::cast_slice_mut(a.as_slice_mut().map_err(err)?))
            }
            OutBuf::F16(a) => {
                Target::Bytes(bytemuck::cast_slice_mut(a.as_slice_mut().map_err(err)?))
            }
            OutBuf::U8(a) => Target::Bytes(a.as_slice_mut().map_err(err)?),
        })
    }

    /// A new array of `shape` for `dtype` (zeros until gathered into).
    pub fn new(
        py: Python<'py>,
        dtype: Dtype,
        shape: &[usize],
    ) -> PyResult<(Bound<'py, PyAny>, OutBuf<'py>)> {
        let dims = IxDyn(shape);
        macro_rules! fresh {
            ($t:ty, $variant:ident) => {{
                let a = PyArrayDyn::<$t>::zeros(py, dims, false);
                let rw = a
                    .try_readwrite()
                    .map_err(|e| PyValueError::new_err(e.to_string()))?;
                Ok((a.into_any(), OutBuf::$variant(rw)))
            }};
        }
        match dtype {
            Dtype::F32 => fresh!(f32, F32),
            Dtype::Bf16 if has_bfloat16(py) => fresh!(half::bf16, Bf16),
            Dtype::Bf16 => fresh!(u16, U16),
            Dtype::F16 => fresh!(half::f16, F16),
            _ => fresh!(u8, U8),
        }
    }

    /// Borrows the caller's `out` for `dtype`, which must hold exactly
    /// `elems` elements: a NumPy array, a writable buffer (memoryview,
    /// bytearray, array.array), or a CPU tensor with `__dlpack__`. Raises
    /// `pleio.OutputError` (a `ValueError`) for a wrong dtype, size or
    /// layout or a read-only buffer, and `TypeError` for an object that is
    /// none of these.
    pub fn borrow(obj: &Bound<'py, PyAny>, dtype: Dtype, elems: usize) -> PyResult<OutBuf<'py>> {
        let py = obj.py();
        let np = numpy(py)?;
        let arr = if obj.cast::<PyUntypedArray>().is_ok() {
            obj.clone()
        } else if obj.hasattr("__dlpack__")? {
            np.from_dlpack.bind(py).call1((obj,))?
        } else {
            let view = py
                .get_type::<pyo3::types::PyMemoryView>()
                .call1((obj,))
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "out must be a writable buffer (NumPy array, memoryview, bytearray, a \
                         tensor with __dlpack__), not {}",
                        type_name(obj)
                    ))
                })?;
            np.asarray.bind(py).call1((view,))?
        };
        let arr = arr.cast_into::<PyUntypedArray>()?;
        let out_err = |m: String| errors::output(py, m);
        let dt = arr.dtype();
        let (kind, size) = (dt.kind(), dt.itemsize());
        let ok = match dtype {
            Dtype::F32 => kind == b'f' && size == 4,
            Dtype::Bf16 => {
                size == 2 && (kind == b'u' || dt.typeobj().name().is_ok_and(|n| n == "bfloat16"))
            }
            Dtype::F16 => size == 2 && (kind == b'u' || kind == b'f'),
            _ => size == 1 && kind == b'u',
        };
        let wanted = match dtype {
            Dtype::F32 => "float32",
            Dtype::Bf16 => "bfloat16 or uint16",
            Dtype::F16 => "float16 or uint16",
            _ => "uint8",
        };
        if !ok || dt.is_native_byteorder() == Some(false) {
            return Err(out_err(format!(
                "out has dtype {dt} but dtype={:?} needs {wanted}",
                dtype.to_string()
            )));
        }
        if !arr.is_c_contiguous() {
            return Err(out_err(format!(
                "out must be C-contiguous (shape {:?}, strides {:?})",
                arr.shape(),
                arr.strides()
            )));
        }
        if arr.len() != elems {
            return Err(out_err(format!(
                "out has {} elements (shape {:?}) but the rows need {elems}",
                arr.len(),
                arr.shape()
            )));
        }
        let rw_err =
            |e: numpy::BorrowError| errors::output(py, format!("out cannot be written: {e}"));
        macro_rules! take {
            ($a:expr, $t:ty, $variant:ident) => {{
                let a = $a.cast::<PyArrayDyn<$t>>()?;
                Ok(OutBuf::$variant(a.try_readwrite().map_err(rw_err)?))
            }};
        }
        match dtype {
            Dtype::F32 => take!(arr, f32, F32),
            Dtype::Raw => take!(arr, u8, U8),
            _ if kind == b'u' => take!(arr, u16, U16),
            _ => {
                // float16 or bfloat16: written as their bits through a view
                let bits = arr.call_method1("view", (np.uint16.bind(py),))?;
                take!(bits, u16, U16)
            }
        }
    }
}
