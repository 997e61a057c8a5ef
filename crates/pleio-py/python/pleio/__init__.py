"""pleio: gather rows of huge on-disk GGUF embedding tables into NumPy arrays.

    import numpy as np, pleio
    t = pleio.open("model-00001-of-00003.gguf")     # its per-layer-embedding table
    rows = t.gather([3, 1_000_000, 3])               # float32, shape (3, t.row_elems)
    ids = pleio.row_ids(t, [9707, 11, 1879]).ravel() # the rows the model asks for
    buf = np.empty((len(ids), t.row_elems), np.float16)
    t.gather(ids, out=buf, dtype="float16")          # in place, GIL released

See docs/python.md: dtypes, errors, threading.
"""

from ._pleio import (
    Error,
    InvalidFileError,
    NotFoundError,
    OutputError,
    Prefetch,
    ReadError,
    RowOutOfRangeError,
    Sequence,
    SetupError,
    Table,
    __version__,
    open,
    row_ids,
)

__all__ = [
    "Error",
    "InvalidFileError",
    "NotFoundError",
    "OutputError",
    "Prefetch",
    "ReadError",
    "RowOutOfRangeError",
    "Sequence",
    "SetupError",
    "Table",
    "__version__",
    "open",
    "row_ids",
]
