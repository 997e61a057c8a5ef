"""Type stubs of the pleio package (the extension module pleio._pleio)."""

import os
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Sequence as _Seq, Union

import numpy as np
import numpy.typing as npt

__version__: str

#: ids: integers of any shape (list, tuple, NumPy integer array, buffer, or a
#: CPU tensor with __dlpack__, torch's read in Rust); tokens: 1-D.
IntsLike = Union[_Seq[int], npt.ArrayLike, Any]
#: dtype names (or a NumPy dtype of those names).
DtypeLike = Union[
    Literal["float32", "f32", "bfloat16", "bf16", "float16", "f16", "raw", "uint8"],
    np.dtype[Any],
    type,
]
Strategy = Literal["auto", "fault", "advise", "pread", "uring", "uring-direct", "pool", "cached", "shared"]
Rounding = Literal["exact", "vllm", "sglang", "mlx"]

class Error(Exception):
    """Base class of every error pleio raises."""

    kind: str
    path: Optional[Path]
    tensor: Optional[str]
    row: Optional[int]
    offset: Optional[int]

class RowOutOfRangeError(Error, IndexError, ValueError):
    """A row id is negative or not below the row count; nothing was written."""

class NotFoundError(Error, FileNotFoundError):
    """The file (or a shard of its split set) does not exist."""

class ReadError(Error, OSError):
    """Reading the file failed; path and offset say where."""

class InvalidFileError(Error, ValueError):
    """Not a usable model file, no such table, unsupported type or bad row-id metadata."""

class OutputError(Error, ValueError):
    """out has the wrong size, dtype or layout, or is read-only; nothing was written."""

class SetupError(Error, RuntimeError):
    """A read backend or the prefetch worker could not be started."""

def open(
    path: Union[str, "os.PathLike[str]"],
    tensor: Optional[str] = None,
    strategy: Strategy = "auto",
    layer: Optional[int] = None,
    rounding: Optional[Rounding] = None,
    budget: Optional[int] = None,
    cache: Optional[Literal["private", "shared"]] = None,
) -> Table:
    """Opens the per-layer-embedding table of a GGUF file or safetensors
    checkpoint (decoder layer `layer`'s, 0-based; default the first PLE
    layer), or the 2-D tensor `tensor` of a GGUF file; `rounding` is the
    rule of 16-bit outputs; `budget` the bytes of the "cached" strategy's
    row cache, or of the "shared" machine-wide one if this process creates
    it (default 256 MiB); `cache="private"` / `cache="shared"` is
    `strategy="cached"` / `strategy="shared"`."""

def row_ids(table: Table, tokens: IntsLike) -> npt.NDArray[np.int64]:
    """Row ids of `tokens` as one fresh sequence: shape (len(tokens), rows_per_token)."""

class Table:
    """One table of a GGUF file. Safe to use from many threads at once."""

    @property
    def rows(self) -> int: ...
    @property
    def row_elems(self) -> int: ...
    @property
    def row_bytes(self) -> int: ...
    @property
    def encoding(self) -> str:
        """ggml's name of the stored element type, e.g. "IQ4_NL"."""
    @property
    def path(self) -> Path: ...
    @property
    def tensor(self) -> str: ...
    @property
    def strategy(self) -> Strategy: ...
    @property
    def rounding(self) -> Rounding: ...
    @property
    def sigbus_guard(self) -> Literal["active", "displaced", "unprotected"]:
        """Whether a shrinking or failing file is an error now (see docs/reliability.md)."""
    @property
    def layer(self) -> Optional[int]:
        """The decoder layer (0-based) whose PLE table this is."""
    @property
    def ple_layers(self) -> list[int]:
        """Every decoder layer holding a PLE table (0-based, sorted)."""
    def gather(
        self,
        ids: IntsLike,
        out: Optional[Any] = None,
        dtype: Optional[DtypeLike] = None,
        rounding: Optional[Rounding] = None,
    ) -> Any:
        """Rows `ids` as an array of shape ids.shape + (row_elems,) (row_bytes for "raw").

        dtype "float32" (default), "bfloat16" (ml_dtypes.bfloat16 when importable,
        else uint16 bit patterns), "float16", "raw" (uint8). With `out`, writes into
        it in place and returns it. Releases the GIL.
        """
    def prefetch(self, ids: IntsLike) -> Prefetch:
        """Starts fetching `ids` as float32 in the background."""
    def sequence(self) -> Sequence:
        """A new token stream of this file's row-id mapping."""
    def stats(self) -> Dict[str, int]:
        """Totals of every gather since the table was opened."""
    def forget_residency(self) -> None:
        """Forgets which pages "auto" believes resident."""

class Prefetch:
    """A batch being fetched in the background."""

    def wait(self, out: Optional[Any] = None) -> Any:
        """The rows as float32 (shape (n, row_elems)), or copied into `out`, which is returned."""
    def ready(self) -> bool:
        """True once the batch is fetched."""

class Sequence:
    """One token stream's row ids."""

    @property
    def rows_per_token(self) -> int: ...
    def map(self, tokens: IntsLike) -> npt.NDArray[np.int64]:
        """Row ids of the next tokens: shape (len(tokens), rows_per_token)."""
    def reset(self) -> None:
        """Forgets the history: the next token starts a new sequence."""
