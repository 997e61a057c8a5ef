//! `pleio.Error` and its subclasses, each also deriving from the matching
//! builtin so callers can catch either:
//!
//! | class | also | raised for |
//! |---|---|---|
//! | `RowOutOfRangeError` | `IndexError`, `ValueError` | a row id negative or past the end (the message names it and the limit) |
//! | `NotFoundError` | `FileNotFoundError` | the file (or a shard) does not exist |
//! | `ReadError` | `OSError` | reading the file failed (the message names the path and offset), or a table published to Redis could not be read (`kind == "remote"`: the message names the node, key and row) |
//! | `InvalidFileError` | `ValueError` | not a GGUF file, no such table, unsupported type, bad row-id metadata, a token outside a gemma4 table |
//! | `OutputError` | `ValueError` | `out` has the wrong size, dtype or layout, or is read-only |
//! | `SetupError` | `RuntimeError` | a read backend or the prefetch worker could not start |
//!
//! Every instance carries `kind` (the engine's error kind) and `path`,
//! `tensor`, `row`, `offset` (None where unknown).
//!
//! A Rust panic (a bug in pleio) never reaches Python as PyO3's
//! `PanicException` (a `BaseException`): every entry point runs inside
//! [`guard`], which raises it as `pleio.Error` with `kind == "internal"`.

use pyo3::exceptions::{
    PyException, PyFileNotFoundError, PyIndexError, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use pleio::ErrorKind;

/// The exception classes, created once per interpreter.
struct Classes {
    error: Py<PyType>,
    row_out_of_range: Py<PyType>,
    not_found: Py<PyType>,
    read: Py<PyType>,
    invalid_file: Py<PyType>,
    output: Py<PyType>,
    setup: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn make<'py>(
    py: Python<'py>,
    name: &str,
    bases: &[Bound<'py, PyType>],
    doc: &str,
) -> PyResult<Py<PyType>> {
    let ns = PyDict::new(py);
    ns.set_item("__module__", "pleio")?;
    ns.set_item("__doc__", doc)?;
    let bases = PyTuple::new(py, bases)?;
    let ty = py.get_type::<PyType>().call1((name, bases, ns))?;
    Ok(ty.cast_into::<PyType>()?.unbind())
}

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let error = make(
            py,
            "Error",
            &[py.get_type::<PyException>()],
            "Base class of every error pleio raises. Attributes: kind (str), path, \
             tensor, row, offset (None where unknown).",
        )?;
        let base = error.bind(py).clone();
        let sub = |name: &str, builtins: &[Bound<'_, PyType>], doc: &str| {
            let mut bases = vec![base.clone()];
            bases.extend(builtins.iter().cloned());
            make(py, name, &bases, doc)
        };
        Ok(Classes {
            row_out_of_range: sub(
                "RowOutOfRangeError",
                &[py.get_type::<PyIndexError>(), py.get_type::<PyValueError>()],
                "A row id is negative or not below the table's row count; nothing was \
                 read or written. `row` is the id when it is not negative.",
            )?,
            not_found: sub(
                "NotFoundError",
                &[py.get_type::<PyFileNotFoundError>()],
                "The file, or a shard of its split set, does not exist.",
            )?,
            read: sub(
                "ReadError",
                &[py.get_type::<PyOSError>()],
                "Reading the file failed; `path` and `offset` say where.",
            )?,
            invalid_file: sub(
                "InvalidFileError",
                &[py.get_type::<PyValueError>()],
                "The file is not a usable model file: not GGUF, no such table, an \
                 unsupported type, bad row-id metadata, or a token outside a gemma4 table.",
            )?,
            output: sub(
                "OutputError",
                &[py.get_type::<PyValueError>()],
                "`out` has the wrong size, dtype or layout, or is read-only; nothing \
                 was written to it.",
            )?,
            setup: sub(
                "SetupError",
                &[py.get_type::<PyRuntimeError>()],
                "A read backend or the prefetch worker could not be started.",
            )?,
            error,
        })
    })
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let c = classes(py)?;
    for ty in [
        &c.error,
        &c.row_out_of_range,
        &c.not_found,
        &c.read,
        &c.invalid_file,
        &c.output,
        &c.setup,
    ] {
        let ty = ty.bind(py);
        m.add(ty.name()?, ty)?;
    }
    Ok(())
}

fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotFound => "not_found",
        ErrorKind::Io => "io",
        ErrorKind::InvalidFile => "invalid_file",
        ErrorKind::NoTable => "no_table",
        ErrorKind::Unsupported => "unsupported",
        ErrorKind::RowOutOfRange => "row_out_of_range",
        ErrorKind::OutputSize => "output_size",
        ErrorKind::Setup => "setup",
        ErrorKind::RowIds => "row_ids",
        ErrorKind::Remote => "remote",
        _ => "other",
    }
}

/// Builds an instance of `ty` with `message` and the attributes.
fn raise(
    py: Python<'_>,
    ty: &Py<PyType>,
    message: String,
    kind: &str,
    e: Option<&pleio::Error>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let value = ty.bind(py).call1((message,))?;
        value.setattr("kind", kind)?;
        value.setattr("path", e.and_then(|e| e.path()).map(|p| p.to_path_buf()))?;
        value.setattr("tensor", e.and_then(|e| e.tensor()))?;
        value.setattr("row", e.and_then(|e| e.row()))?;
        value.setattr("offset", e.and_then(|e| e.offset()))?;
        Ok(PyErr::from_value(value))
    };
    build().unwrap_or_else(|err| err)
}

/// The Python exception for an engine error.
pub fn to_py(py: Python<'_>, e: pleio::Error) -> PyErr {
    let c = match classes(py) {
        Ok(c) => c,
        Err(err) => return err,
    };
    let ty = match e.kind() {
        ErrorKind::RowOutOfRange => &c.row_out_of_range,
        ErrorKind::NotFound => &c.not_found,
        ErrorKind::Io | ErrorKind::Remote => &c.read,
        ErrorKind::InvalidFile
        | ErrorKind::NoTable
        | ErrorKind::Unsupported
        | ErrorKind::RowIds => &c.invalid_file,
        ErrorKind::OutputSize => &c.output,
        ErrorKind::Setup => &c.setup,
        _ => &c.error,
    };
    raise(py, ty, e.to_string(), kind_name(e.kind()), Some(&e))
}

/// An `OutputError` raised by the bindings' own checks of `out`.
pub fn output(py: Python<'_>, message: String) -> PyErr {
    match classes(py) {
        Ok(c) => raise(py, &c.output, message, "output_size", None),
        Err(err) => err,
    }
}

/// Runs the body of a Python entry point, turning a panic into
/// `pleio.Error` (kind `"internal"`) naming the panic's message.
pub fn guard<R>(py: Python<'_>, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(match classes(py) {
                Ok(c) => raise(
                    py,
                    &c.error,
                    format!("internal error (a bug in pleio, please report it): {what}"),
                    "internal",
                    None,
                ),
                Err(err) => err,
            })
        }
    }
}

/// Extension trait: `pleio::Result<T>` into `PyResult<T>`.
pub trait IntoPy<T> {
    /// The Python exception of an engine error.
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for pleio::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
