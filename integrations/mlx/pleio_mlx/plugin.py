"""The hooks of pleio-mlx into mlx-vlm 0.7.10 (``mlx_vlm/models/qwen4_exp/``).

- ``mlx_vlm.utils.load_config``: a qwen4exp model configured for pleio
  (``PLEIO_MLX_PATH``, or ``text_config.ple_storage.pleio`` in its
  config.json) gets ``text_config.ple_storage = {"pleio": {...}}``, the
  path made absolute. mlx-vlm's own ``sanitize`` then drops the table's
  shards from the weights before they are loaded (as for its
  ``ple-store.json`` reader).
- ``Qwen4ExpNGramEmbedding.__init__`` (``language.py``): with that
  configuration the module's ``ngram_embedding`` is a
  :class:`PleioNGramEmbedding` of the PLE table of its decoder layer,
  checked against the module (rows and width by mlx-vlm's own checks, then
  the row ids of a probe sequence). A bad path, strategy, budget or a table
  that does not fit raises here, while the model is built.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np

import pleio
from pleio._engine import ConfigError, Settings, describe, open_layer
from pleio._engine import settings_from as _settings_from

__all__ = ["ConfigError", "PleioNGramEmbedding", "Settings", "load", "patch", "settings_from"]

TESTED = "0.7.10"
_PATCHED = False


class PleioNGramEmbedding:
    """Stands in for mlx-vlm's ``ShardedEmbedding`` and
    ``QuantizedMMapNGramEmbedding``: ``emb(row_ids)`` returns the rows of
    ``row_ids`` (any shape, ids in ``[0, row_count)``) as bf16
    ``(*row_ids.shape, row_width)``, each as ``mx.dequantize`` gives it for
    an MLX 4-bit table (``rounding="mlx"``; BF16 rows are the stored ones)."""

    def __init__(self, table):
        self.table = table
        self.row_count = table.rows
        self.row_width = table.row_elems

    def __call__(self, row_ids) -> mx.array:
        ids = np.asarray(row_ids, dtype=np.int64)
        out = np.empty((ids.size, self.row_width), dtype=np.uint16)
        if ids.size:
            self.table.gather(ids.reshape(-1), out=out, dtype="bfloat16", rounding="mlx")
        return mx.array(out).view(mx.bfloat16).reshape(*ids.shape, self.row_width)

    lookup = __call__

    def stats(self) -> dict:
        return self.table.stats()

    def __repr__(self) -> str:
        return f"PleioNGramEmbedding({self.table!r})"


def settings_from(ple_storage, env=os.environ) -> Settings | None:
    """The configuration: ``ple_storage["pleio"]`` (config.json's
    ``text_config.ple_storage``) first, else the ``PLEIO_MLX_*``
    environment variables; None when neither is set."""
    cfg = ple_storage.get("pleio") if isinstance(ple_storage, dict) else None
    return _settings_from(cfg, env, prefix="PLEIO_MLX", where="text_config.ple_storage['pleio']")


def _configure(config: dict, model_path) -> dict:
    """``load_config``'s result with pleio's settings in
    ``text_config.ple_storage`` (qwen4exp models only)."""
    if config.get("model_type") != "qwen4_exp":
        return config
    text = config.setdefault("text_config", {})
    storage = text.get("ple_storage")
    s = settings_from(storage)
    if s is None:
        return config
    if isinstance(storage, dict) and storage.get("manifest"):
        raise ConfigError("pleio: text_config.ple_storage has both a manifest (mlx-vlm's reader) and pleio")
    path = Path(s.path)
    if not path.is_absolute():
        path = Path(model_path) / path if (Path(model_path) / path).exists() else path.resolve()
    text["ple_storage"] = {"pleio": {"path": str(path), "strategy": s.strategy, "budget": s.budget}}
    return config


class _Capture:
    """Records the row ids a module asks for; rows of zeros."""

    def __init__(self, width: int):
        self.width = width
        self.ids = None

    def __call__(self, row_ids):
        self.ids = np.array(row_ids)
        return mx.zeros((*self.ids.shape, self.width), dtype=mx.bfloat16)


def _check_row_ids(module, table, what: str, prefix: str) -> None:
    vocab = int(module.unigram_vocab_size)
    eos = int(module.eos_token_id)
    toks = [t % vocab for t in (1, 7, 3, 11, 2)] + [eos % vocab] + [t % vocab for t in (5, 9, 4)]
    served = module.ngram_embedding
    cap = _Capture(served.row_width)
    module.ngram_embedding = cap
    try:
        module(mx.array([toks], dtype=mx.int64), None)
    finally:
        module.ngram_embedding = served
    want = cap.ids.reshape(len(toks), -1)
    got = pleio.row_ids(table, np.array(toks))
    if got.shape != want.shape or not np.array_equal(got, want.astype(got.dtype)):
        raise ConfigError(f"{what}: its row ids differ from those of the model's {prefix} (another seed, layer or geometry)")


def patch() -> None:
    """Installs the hooks once (idempotent)."""
    global _PATCHED
    if _PATCHED:
        return
    import mlx_vlm
    from mlx_vlm import utils
    from mlx_vlm.models.qwen4_exp import language, ple_storage

    if str(getattr(mlx_vlm, "__version__", "")) != TESTED:
        import logging

        logging.getLogger(__name__).warning(
            "pleio-mlx: hooks written for mlx-vlm %s, this is %s; a table is checked when the model is built",
            TESTED, getattr(mlx_vlm, "__version__", "?"),
        )

    orig_load_config = utils.load_config

    def load_config(model_path, **kwargs):
        return _configure(orig_load_config(model_path, **kwargs), model_path)

    ngram = language.Qwen4ExpNGramEmbedding
    orig_init = ngram.__init__
    orig_reader = ple_storage.QuantizedMMapNGramEmbedding
    lock = threading.Lock()

    def __init__(self, config, embedding_dim, layer_idx, ple_layer_index):
        storage = config.ple_storage
        s = settings_from(storage, env={}) if isinstance(storage, dict) and "pleio" in storage else None
        if s is None:
            return orig_init(self, config, embedding_dim, layer_idx, ple_layer_index)
        prefix = f"language_model.model.layers.{layer_idx}.ple.ple_embedding.ngram_embedding"
        table = open_layer(s, int(ple_layer_index), prefix)
        what = describe(s, table)
        served = PleioNGramEmbedding(table)
        # mlx-vlm's external-storage path, with pleio as the reader (only
        # while this module is built).
        config.ple_storage = {"manifest": s.path}
        with lock:
            ple_storage.QuantizedMMapNGramEmbedding = lambda *_a, **_k: served
            try:
                orig_init(self, config, embedding_dim, layer_idx, ple_layer_index)
            except ValueError as e:
                raise ConfigError(f"{what} does not match the model's {prefix}: {e}") from e
            finally:
                config.ple_storage = storage
                ple_storage.QuantizedMMapNGramEmbedding = orig_reader
        _check_row_ids(self, table, what, prefix)

    utils.load_config = load_config
    ngram.__init__ = __init__
    _PATCHED = True


def load(model_path, **kwargs):
    """``mlx_vlm.utils.load_model`` with the hooks installed: the model,
    its PLE tables served by pleio when configured."""
    patch()
    from mlx_vlm.utils import load_model

    return load_model(Path(model_path), **kwargs)
