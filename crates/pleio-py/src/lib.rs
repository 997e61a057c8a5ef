//! The `pleio` Python package's extension module (`pleio._pleio`): PyO3
//! bindings of the engine's [`pleio::Table`], re-exported by
//! `python/pleio/__init__.py`.
//!
//! The bindings convert and check arguments and nothing more: ids and
//! tokens are read in place from NumPy arrays (or copied from lists),
//! `out` buffers are borrowed through rust-numpy's borrow checking, DLPack
//! tensors (torch) are read by `dlpack`, the one module with `unsafe`
//! (a capsule is a raw C struct), engine errors become `pleio.Error`
//! subclasses, and every gather, prefetch and wait runs with the GIL
//! released.
#![deny(unsafe_code)]

mod convert;
#[allow(unsafe_code)] // DLPack capsules: raw C structs, checked before use
mod dlpack;
mod errors;
mod table;

use pyo3::prelude::*;

#[pymodule]
fn _pleio(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<table::Table>()?;
    m.add_class::<table::Prefetch>()?;
    m.add_class::<table::Sequence>()?;
    m.add_function(wrap_pyfunction!(table::open, m)?)?;
    m.add_function(wrap_pyfunction!(table::row_ids, m)?)?;
    m.add_function(wrap_pyfunction!(table::torch_gather, m)?)?;
    m.add_function(wrap_pyfunction!(table::_panic_for_test, m)?)?;
    Ok(())
}
