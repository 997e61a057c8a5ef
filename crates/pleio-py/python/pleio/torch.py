"""pleio.torch: the torch door (``pip install pleio[torch]``; torch is
imported only by this module).

    import torch, pleio, pleio.torch as pt
    t = pleio.open("ckpt/", strategy="auto")
    rows = pt.gather(t, ids, dtype=torch.bfloat16)        # ids: any shape -> ids.shape + (160,)
    pt.gather(t, ids, dtype=torch.bfloat16, out=pinned)   # in place, GIL released

    model = pt.from_pretrained("ckpt/", dtype=torch.bfloat16)  # PLE tables never allocated
    n = pt.install(model, "ckpt/")                              # or: swap them in a loaded model

Every function here is a thin layer over :meth:`pleio.Table.gather`, which
reads torch tensors (ids of any integer dtype, ``out`` of float32,
bfloat16, float16 or uint8, pinned memory included) through DLPack, in
Rust, with no NumPy round trip. Rows come out bit-exact: the checkpoint's
value rounded once to the output type (``rounding="exact"``), or the rule
of the engine named by ``rounding`` ("vllm"/"sglang", "mlx").
"""

from __future__ import annotations

import contextlib
import gc
import threading

import torch

from . import Table, _pleio, open as _open

__all__ = ["PleEmbedding", "from_pretrained", "gather", "install", "ple_modules"]

_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.uint8: "raw",
}


def _dtype_name(dtype) -> str:
    try:
        return _NAMES[dtype]
    except (KeyError, TypeError):
        raise TypeError(
            f"dtype must be torch.float32, torch.bfloat16, torch.float16 or torch.uint8 "
            f"(the stored bytes), not {dtype!r}"
        ) from None


# pleio.torch.gather(table, ids, dtype=torch.float32, out=None, rounding=None),
# in Rust (see its docstring) to keep the call's cost near the NumPy door's.
gather = _pleio.torch_gather


class PleEmbedding(torch.nn.Module):
    """An ``nn.Module`` that stands in for an ``nn.Embedding``-shaped PLE
    table: ``forward(ids)`` returns the rows of ``ids`` (any shape) from
    the table on disk, as ``ids.shape + (embedding_dim,)`` in the module's
    dtype (that of its ``weight``, a 0-row buffer that follows
    ``model.to(dtype)`` and tells engines the device, as transformers'
    ``ngram_embedding.weight.device`` does). Rows are not trainable."""

    def __init__(self, table: Table, dtype=None, rounding: str | None = None):
        super().__init__()
        self.table = table
        self.rounding = rounding
        self.num_embeddings = table.rows
        self.embedding_dim = table.row_elems
        dtype = dtype if dtype is not None else torch.get_default_dtype()
        _dtype_name(dtype)
        self.register_buffer(
            "weight", torch.empty((0, table.row_elems), dtype=dtype), persistent=False
        )

    def forward(self, ids):
        return gather(self.table, ids, dtype=self.weight.dtype, rounding=self.rounding)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, pleio {self.table.encoding} "
            f"strategy={self.table.strategy} rounding={self.rounding or 'exact'} "
            f"path={str(self.table.path)!r}"
        )


def ple_modules(model) -> list:
    """The n-gram embedding modules of a transformers qwen4exp model (one
    per PLE layer, in layer order): the modules that own
    ``ngram_embedding`` and ``layer_multipliers``."""
    found = [
        m
        for m in model.modules()
        if hasattr(m, "ngram_embedding") and hasattr(m, "layer_multipliers") and hasattr(m, "layer_idx")
    ]
    return sorted(found, key=lambda m: m.layer_idx)


class _Capture(torch.nn.Module):
    """Stands in for a table to record the row ids a module asks for."""

    def __init__(self, dim: int):
        super().__init__()
        self.ids = None
        self.register_buffer("weight", torch.empty((0, dim)), persistent=False)

    def forward(self, ids):
        self.ids = ids.clone()
        return torch.zeros((*ids.shape, 1))


def _probe_tokens(module) -> torch.Tensor:
    vocab = int(module.unigram_vocab_size)
    eos = int(module.eos_token_id)
    toks = [t % vocab for t in (1, 7, 3, 11, 2)] + [eos % vocab, 5 % vocab, 9 % vocab]
    return torch.tensor([toks], dtype=torch.long)


def _check(table: Table, module, what: str) -> None:
    """Refuses a table whose geometry or row ids differ from the module's."""
    emb = module.ngram_embedding
    rows, dim = int(emb.num_embeddings), int(emb.embedding_dim)
    if (table.rows, table.row_elems) != (rows, dim):
        raise ValueError(
            f"{what}: the table at {str(table.path)!r} has {table.rows} rows of {table.row_elems} "
            f"elements, the model's PLE layer {module.layer_idx} needs {rows} x {dim}"
        )
    probe = _probe_tokens(module)
    saved = module.ngram_embedding
    capture = _Capture(dim)
    module.ngram_embedding = capture
    try:
        with torch.no_grad():
            module(probe, None)
    finally:
        module.ngram_embedding = saved
    want = capture.ids.reshape(probe.shape[1], -1)
    from . import row_ids

    got = torch.from_numpy(row_ids(table, probe[0].numpy()))
    if got.shape != want.shape or not torch.equal(got, want.to(got.dtype)):
        raise ValueError(
            f"{what}: the row ids of the table at {str(table.path)!r} (layer "
            f"{table.layer}) differ from those the model's PLE layer {module.layer_idx} "
            f"computes (another seed, layer or geometry)"
        )


def install(model, path, **open_kwargs) -> int:
    """Replaces every PLE table of a loaded transformers qwen4exp model
    (each layer of ``ple_layer_ids``) with a :class:`PleEmbedding` served
    from ``path`` (a checkpoint directory, index, ``.safetensors`` file,
    ``ple-store.json`` or GGUF file), frees the stock tables and returns
    how many it replaced. ``open_kwargs`` go to :func:`pleio.open`
    (``strategy``, ``rounding``; ``layer`` is each module's own). Each
    table is checked against its module first (rows, width, and the row ids
    of a probe sequence); a mismatch raises ``ValueError`` and leaves the
    model as it was."""
    if "layer" in open_kwargs:
        raise TypeError("install opens each PLE layer's own table: do not pass layer=")
    mods = ple_modules(model)
    swaps = []
    for m in mods:
        table = _open(path, layer=m.layer_idx, **open_kwargs)
        _check(table, m, "pleio.torch.install")
        dtype = m.ngram_embedding.weight.dtype
        if dtype not in _NAMES or dtype == torch.uint8:
            dtype = torch.get_default_dtype()
        swaps.append((m, PleEmbedding(table, dtype=dtype, rounding=open_kwargs.get("rounding"))))
    for m, new in swaps:
        m.ngram_embedding = new
    del swaps
    gc.collect()
    return len(mods)


_PATCH_LOCK = threading.Lock()
_IGNORE = r"ple_embedding\.ngram_embedding\."


@contextlib.contextmanager
def _tables_from_pleio(path, open_kwargs, opened):
    """While active, transformers' n-gram embedding modules are built with
    a :class:`PleEmbedding` in place of their table, which is made on the
    meta device and dropped (so never allocated), and its shards are
    ignored by the loader (no ``...ngram_embedding.weight`` parameter to
    load them into, so they are never read)."""
    from transformers.models.qwen4_exp import modeling_qwen4_exp as modeling

    cls = modeling.Qwen4ExpTextNGramEmbedding
    pretrained = modeling.Qwen4ExpPreTrainedModel
    orig_init = cls.__init__
    real_embedding = torch.nn.Embedding

    def meta_embedding(*args, **kwargs):
        kwargs["device"] = "meta"
        return real_embedding(*args, **kwargs)

    def init(self, config, embedding_dim, layer_idx, *args, **kwargs):
        torch.nn.Embedding = meta_embedding
        try:
            orig_init(self, config, embedding_dim, layer_idx, *args, **kwargs)
        finally:
            torch.nn.Embedding = real_embedding
        table = _open(path, layer=layer_idx, **open_kwargs)
        meta = self.ngram_embedding
        if (table.rows, table.row_elems) != (meta.num_embeddings, meta.embedding_dim):
            raise ValueError(
                f"pleio.torch.from_pretrained: the table at {str(table.path)!r} has {table.rows} "
                f"rows of {table.row_elems} elements, PLE layer {layer_idx} needs "
                f"{meta.num_embeddings} x {meta.embedding_dim}"
            )
        self.ngram_embedding = PleEmbedding(
            table, dtype=torch.get_default_dtype(), rounding=open_kwargs.get("rounding")
        )
        opened.append(self)

    ignore = list(getattr(pretrained, "_keys_to_ignore_on_load_unexpected", None) or [])
    with _PATCH_LOCK:
        cls.__init__ = init
        pretrained._keys_to_ignore_on_load_unexpected = ignore + [_IGNORE]
        try:
            yield
        finally:
            cls.__init__ = orig_init
            pretrained._keys_to_ignore_on_load_unexpected = ignore or None


def from_pretrained(path, *, pleio_options: dict | None = None, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(path, **kwargs)`` with every
    PLE table served by pleio from ``path``: the tables are never
    allocated and their shards never read (peak memory is the rest of the
    model). ``pleio_options`` go to :func:`pleio.open` (``strategy``,
    ``rounding``). Each table is checked against its module (rows, width,
    the row ids of a probe sequence)."""
    from transformers import AutoModelForCausalLM

    open_kwargs = dict(pleio_options or {})
    if "layer" in open_kwargs:
        raise TypeError("from_pretrained opens each PLE layer's own table: do not pass layer=")
    opened: list = []
    with _tables_from_pleio(path, open_kwargs, opened):
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    for m in opened:
        emb = m.ngram_embedding
        if emb.weight.is_meta:
            emb.weight = torch.empty((0, emb.embedding_dim), dtype=emb.weight.dtype)
        _check(emb.table, m, "pleio.torch.from_pretrained")
    return model
