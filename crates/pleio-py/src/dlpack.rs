//! DLPack tensors (torch and any other `__dlpack__` producer) read in
//! Rust: ids copied out once, `out` borrowed for writing, bfloat16
//! (`kDLBfloat`) included, with no NumPy round trip.
//!
//! The one module of the bindings with `unsafe`: a DLPack capsule is a raw
//! C struct. Every read of it is checked here (capsule name, pointer
//! non-null, `ndim` and shape non-negative and bounded, element count and
//! byte length checked, strides C-contiguous) before a slice is made, and
//! the slice never outlives the capsule (which keeps the producer's tensor
//! alive: an unconsumed capsule's destructor calls the tensor's deleter).

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

use pleio::Dtype;

use crate::convert::IntSlice;
use crate::errors;

const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

/// `DLDeviceType` values pleio reads from.
const DL_CPU: i32 = 1;
/// Pinned host memory (torch's `pin_memory()`), readable by the CPU.
const DL_CUDA_HOST: i32 = 3;

/// `DLDataTypeCode` values.
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;

/// Largest `ndim` accepted.
const MAX_NDIM: i32 = 32;

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (DLPack < 1.0): the tensor comes first.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack >= 1.0): flags, then the tensor.
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;

/// `torch._C._to_dlpack` (the C function behind `torch.utils.dlpack`,
/// 10x cheaper than `Tensor.__dlpack__`'s Python wrapper) and
/// `torch.Tensor`, looked up once torch is imported.
struct Torch {
    tensor: Py<PyAny>,
    to_dlpack: Py<PyAny>,
    empty: Py<PyAny>,
    /// torch.float32, bfloat16, float16, uint8 and the pleio dtype of each.
    dtypes: [(Py<PyAny>, Dtype); 4],
}

static TORCH: PyOnceLock<Option<Torch>> = PyOnceLock::new();

fn torch(py: Python<'_>) -> Option<&Torch> {
    if let Some(t) = TORCH.get(py) {
        return t.as_ref();
    }
    // Only once the caller has imported torch: never import it ourselves.
    let loaded = py
        .import("sys")
        .and_then(|s| s.getattr("modules"))
        .and_then(|m| m.contains("torch"))
        .unwrap_or(false);
    if !loaded {
        return None;
    }
    TORCH
        .get_or_init(py, || {
            let t = py.import("torch").ok()?;
            let dt = |name: &str, d: Dtype| Some((t.getattr(name).ok()?.unbind(), d));
            Some(Torch {
                tensor: t.getattr("Tensor").ok()?.unbind(),
                to_dlpack: t
                    .getattr("_C")
                    .and_then(|c| c.getattr("_to_dlpack"))
                    .ok()?
                    .unbind(),
                empty: t.getattr("empty").ok()?.unbind(),
                dtypes: [
                    dt("float32", Dtype::F32)?,
                    dt("bfloat16", Dtype::Bf16)?,
                    dt("float16", Dtype::F16)?,
                    dt("uint8", Dtype::Raw)?,
                ],
            })
        })
        .as_ref()
}

fn torch_or_err(py: Python<'_>) -> PyResult<&Torch> {
    torch(py)
        .ok_or_else(|| PyTypeError::new_err("pleio.torch needs torch (pip install pleio[torch])"))
}

/// The pleio dtype of a torch dtype (`None`: float32), and the torch dtype.
pub fn torch_dtype<'py>(
    py: Python<'py>,
    dtype: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Dtype, Bound<'py, PyAny>)> {
    let t = torch_or_err(py)?;
    let Some(d) = dtype else {
        return Ok((Dtype::F32, t.dtypes[0].0.bind(py).clone()));
    };
    for (obj, pd) in &t.dtypes {
        if d.is(obj.bind(py)) {
            return Ok((*pd, d.clone()));
        }
    }
    Err(PyTypeError::new_err(format!(
        "dtype must be torch.float32, torch.bfloat16, torch.float16 or torch.uint8 (the stored \
         bytes), not {}",
        d.repr().map(|r| r.to_string()).unwrap_or_default()
    )))
}

/// A new torch tensor of `dtype` and `shape` (`elems` elements in all),
/// allocated flat and viewed (cheaper in torch than a shaped `empty`).
pub fn torch_empty<'py>(
    py: Python<'py>,
    elems: usize,
    shape: &[usize],
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let t = torch_or_err(py)?;
    let kw = pyo3::types::PyDict::new(py);
    kw.set_item("dtype", dtype)?;
    let flat = t.empty.bind(py).call((elems,), Some(&kw))?;
    flat.call_method1("view", (pyo3::types::PyTuple::new(py, shape)?,))
}

/// A DLPack tensor borrowed from Python for one call.
pub struct DlView<'py> {
    /// Keeps the producer's memory alive.
    _capsule: Bound<'py, PyCapsule>,
    data: NonNull<u8>,
    /// Elements.
    elems: usize,
    /// Bytes per element.
    itemsize: usize,
    shape: Vec<usize>,
    code: u8,
    bits: u8,
    device: i32,
    contiguous: bool,
    read_only: bool,
}

impl<'py> DlView<'py> {
    /// `obj` as a DLPack tensor: `None` if it has no `__dlpack__`. A torch
    /// tensor goes through `torch._C._to_dlpack`; anything else through its
    /// `__dlpack__()`. A producer that refuses (a read-only array, a tensor
    /// that requires grad) raises a `ValueError` naming `what`.
    pub fn of(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Option<DlView<'py>>> {
        DlView::of_with(obj, what, |_, m| PyValueError::new_err(m))
    }

    /// [`DlView::of`] for an output: a refusing producer raises
    /// `pleio.OutputError`.
    pub fn of_out(obj: &Bound<'py, PyAny>) -> PyResult<Option<DlView<'py>>> {
        DlView::of_with(obj, "out", errors::output)
    }

    fn of_with(
        obj: &Bound<'py, PyAny>,
        what: &str,
        refused: fn(Python<'_>, String) -> PyErr,
    ) -> PyResult<Option<DlView<'py>>> {
        let py = obj.py();
        let capsule = match torch(py) {
            Some(t) if obj.is_instance(t.tensor.bind(py))? => t
                .to_dlpack
                .bind(py)
                .call1((obj,))
                .map_err(|e| refused(py, format!("{what}: {e}")))?,
            _ => {
                if !obj.hasattr("__dlpack__")? {
                    return Ok(None);
                }
                obj.call_method0("__dlpack__")
                    .map_err(|e| refused(py, format!("{what}: {e}")))?
            }
        };
        let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
            PyTypeError::new_err(format!("{what}: __dlpack__() did not return a capsule"))
        })?;
        DlView::from_capsule(capsule, what).map(Some)
    }

    fn from_capsule(capsule: Bound<'py, PyCapsule>, what: &str) -> PyResult<DlView<'py>> {
        let bad = |m: &str| PyValueError::new_err(format!("{what}: {m}"));
        let (tensor, read_only) = if let Ok(p) = capsule.pointer_checked(Some(LEGACY)) {
            // SAFETY: a capsule named "dltensor" holds a `DLManagedTensor*`
            // (DLPack's contract), valid while the capsule is unconsumed
            // and alive, which `self._capsule` ensures.
            let m = unsafe { &*p.cast::<DlManagedTensor>().as_ptr() };
            (&m.dl_tensor, false)
        } else if let Ok(p) = capsule.pointer_checked(Some(VERSIONED)) {
            // SAFETY: as above, for a "dltensor_versioned" capsule's
            // `DLManagedTensorVersioned*`.
            let m = unsafe { &*p.cast::<DlManagedTensorVersioned>().as_ptr() };
            if m.version.major != 1 {
                return Err(bad(&format!(
                    "DLPack version {}.{} is not supported (1.x is)",
                    m.version.major, m.version.minor
                )));
            }
            (&m.dl_tensor, m.flags & FLAG_READ_ONLY != 0)
        } else {
            return Err(bad(
                "the DLPack capsule was already consumed or is not a DLPack tensor",
            ));
        };
        if tensor.ndim < 0 || tensor.ndim > MAX_NDIM {
            return Err(bad(&format!("ndim {} is out of range", tensor.ndim)));
        }
        if tensor.dtype.lanes != 1 {
            return Err(bad("vector dtypes (lanes > 1) are not supported"));
        }
        let ndim = tensor.ndim as usize;
        let shape: &[i64] = if ndim == 0 {
            &[]
        } else if tensor.shape.is_null() {
            return Err(bad("the DLPack tensor has no shape"));
        } else {
            // SAFETY: DLPack guarantees `shape` points at `ndim` int64s
            // (checked non-null and 0 <= ndim <= 32 above).
            unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }
        };
        let mut dims = Vec::with_capacity(ndim);
        let mut elems = 1usize;
        for &d in shape {
            let d = usize::try_from(d).map_err(|_| bad(&format!("negative dimension {d}")))?;
            elems = elems
                .checked_mul(d)
                .ok_or_else(|| bad("the element count overflows"))?;
            dims.push(d);
        }
        let itemsize = usize::from(tensor.dtype.bits).div_ceil(8);
        let len = elems
            .checked_mul(itemsize)
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(|| bad("the byte length overflows"))?;
        let contiguous = if tensor.strides.is_null() || elems <= 1 {
            true
        } else {
            // SAFETY: non-null `strides` points at `ndim` int64s (DLPack).
            let strides = unsafe { std::slice::from_raw_parts(tensor.strides, ndim) };
            let mut want = 1i64;
            let mut ok = true;
            for (&d, &s) in dims.iter().zip(strides).rev() {
                if d != 1 && s != want {
                    ok = false;
                    break;
                }
                want = want.saturating_mul(d as i64);
            }
            ok
        };
        let offset =
            usize::try_from(tensor.byte_offset).map_err(|_| bad("the byte offset overflows"))?;
        let data = if len == 0 {
            NonNull::dangling()
        } else {
            let base = NonNull::new(tensor.data.cast::<u8>())
                .ok_or_else(|| bad("the DLPack tensor has no data"))?;
            // SAFETY: DLPack's data pointer plus byte_offset addresses the
            // first element of a tensor of `len` bytes (the producer's
            // contract); the sum stays inside that allocation.
            unsafe { base.add(offset) }
        };
        Ok(DlView {
            _capsule: capsule,
            data,
            elems,
            itemsize,
            shape: dims,
            code: tensor.dtype.code,
            bits: tensor.dtype.bits,
            device: tensor.device.device_type,
            contiguous,
            read_only,
        })
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// True when the elements are C-contiguous.
    pub fn is_contiguous(&self) -> bool {
        self.contiguous
    }

    fn dtype_name(&self) -> String {
        let kind = match self.code {
            DL_INT => "int",
            DL_UINT => "uint",
            DL_FLOAT => "float",
            DL_BFLOAT => "bfloat",
            _ => "code",
        };
        format!("{kind}{}", self.bits)
    }

    fn device_name(&self) -> String {
        match self.device {
            DL_CPU => "cpu".into(),
            DL_CUDA_HOST => "cuda_host (pinned)".into(),
            2 => "cuda".into(),
            other => format!("DLPack device type {other}"),
        }
    }

    fn check_host(&self, py: Python<'_>, what: &str) -> PyResult<()> {
        if self.device == DL_CPU || self.device == DL_CUDA_HOST {
            return Ok(());
        }
        Err(errors::output(
            py,
            format!(
                "{what} is on {}: pleio reads and writes host memory only (CPU or pinned)",
                self.device_name()
            ),
        ))
    }

    /// The bytes, read-only (C-contiguous, host memory).
    fn bytes(&self) -> &[u8] {
        // SAFETY: `data` addresses `elems * itemsize` bytes of the
        // producer's host tensor (checked above), alive while the capsule
        // is held by `self`; the caller checked C-contiguity and device.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.elems * self.itemsize) }
    }

    /// Checks that the tensor can hold ids: in host memory, C-contiguous,
    /// of an integer dtype.
    pub fn check_ids(&self, what: &str) -> PyResult<()> {
        if self.device != DL_CPU && self.device != DL_CUDA_HOST {
            return Err(PyValueError::new_err(format!(
                "{what} is on {}: pass CPU ids (ids.cpu())",
                self.device_name()
            )));
        }
        if !self.contiguous {
            return Err(PyValueError::new_err(format!(
                "{what} must be contiguous (shape {:?}); use .contiguous()",
                self.shape
            )));
        }
        if !matches!((self.code, self.bits), (DL_INT | DL_UINT, 8 | 16 | 32 | 64)) {
            return Err(PyTypeError::new_err(format!(
                "{what} must hold integers, got a tensor of dtype {}",
                self.dtype_name()
            )));
        }
        Ok(())
    }

    /// The ids in place (after [`DlView::check_ids`]), when they are
    /// 32- or 64-bit and aligned: the engine copies them once, then checks
    /// and uses that copy ([`crate::convert::IntSlice::rows_into`]), as it
    /// does NumPy's. `None` for narrower or misaligned ids: see
    /// [`DlView::widened_ids`].
    pub fn int_slice(&self) -> Option<IntSlice<'_>> {
        let b = self.bytes();
        Some(match (self.code, self.bits) {
            (DL_INT, 64) => IntSlice::I64(bytemuck::try_cast_slice(b).ok()?),
            (DL_UINT, 64) => IntSlice::U64(bytemuck::try_cast_slice(b).ok()?),
            (DL_INT, 32) => IntSlice::I32(bytemuck::try_cast_slice(b).ok()?),
            (DL_UINT, 32) => IntSlice::U32(bytemuck::try_cast_slice(b).ok()?),
            _ => return None,
        })
    }

    /// The ids copied out (once) and widened to int64, for the dtypes and
    /// alignments [`DlView::int_slice`] does not take in place.
    pub fn widened_ids(&self) -> Vec<i64> {
        let b = self.bytes();
        macro_rules! widen {
            ($t:ty) => {{
                const N: usize = std::mem::size_of::<$t>();
                b.chunks_exact(N)
                    .map(|c| <$t>::from_ne_bytes(c.try_into().expect("N bytes")) as i64)
                    .collect()
            }};
        }
        match (self.code, self.bits) {
            (DL_INT, 64) => widen!(i64),
            (DL_INT, 32) => widen!(i32),
            (DL_INT, 16) => widen!(i16),
            (DL_INT, 8) => widen!(i8),
            // uint64 above 2^63 - 1 turns negative: still refused, as negative
            (DL_UINT, 64) => widen!(u64),
            (DL_UINT, 32) => widen!(u32),
            (DL_UINT, 16) => widen!(u16),
            _ => widen!(u8),
        }
    }

    /// The memory of `out` for a gather of `dtype` needing `elems`
    /// elements: the dtype must match (bfloat16 or uint16 for bf16,
    /// float16 or uint16 for f16, float32, uint8 for raw), the tensor be
    /// C-contiguous, writable, in host memory and of exactly that size.
    pub fn out_bytes(&mut self, py: Python<'_>, dtype: Dtype, elems: usize) -> PyResult<&mut [u8]> {
        let err = |m: String| errors::output(py, m);
        let ok = match dtype {
            Dtype::F32 => self.code == DL_FLOAT && self.bits == 32,
            Dtype::Bf16 => (self.code == DL_BFLOAT || self.code == DL_UINT) && self.bits == 16,
            Dtype::F16 => (self.code == DL_FLOAT || self.code == DL_UINT) && self.bits == 16,
            _ => self.code == DL_UINT && self.bits == 8,
        };
        if !ok {
            let wanted = match dtype {
                Dtype::F32 => "float32",
                Dtype::Bf16 => "bfloat16 or uint16",
                Dtype::F16 => "float16 or uint16",
                _ => "uint8",
            };
            return Err(err(format!(
                "out has dtype {} but dtype={:?} needs {wanted}",
                self.dtype_name(),
                dtype.to_string()
            )));
        }
        self.check_host(py, "out")?;
        if !self.contiguous {
            return Err(err(format!(
                "out must be C-contiguous (shape {:?})",
                self.shape
            )));
        }
        if self.read_only {
            return Err(err("out is read-only".into()));
        }
        if self.elems != elems {
            return Err(err(format!(
                "out has {} elements (shape {:?}) but the rows need {elems}",
                self.elems, self.shape
            )));
        }
        // SAFETY: as in `bytes`, and the producer exported the tensor
        // writable (not flagged read-only); `&mut self` makes this the one
        // live borrow of it from this view.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.data.as_ptr(), self.elems * self.itemsize)
        })
    }
}
