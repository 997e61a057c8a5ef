"""What the engine plug-ins share (pleio-vllm, pleio-sglang, pleio-mlx):
their configuration, opening the PLE table of one decoder layer with
errors that name what is wrong, and the tensor-parallel masked gather.

Private to those plug-ins (``integrations/*``): not part of pleio's API.
torch is imported only by the functions that need it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from . import Error
from . import open as _open

STRATEGIES = ("auto", "fault", "advise", "pread", "uring", "uring-direct", "pool", "cached", "shared")
KEYS = frozenset({"path", "strategy", "budget"})
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class ConfigError(ValueError):
    """A pleio configuration an engine cannot start with (raised at engine
    start, while the model is built)."""


@dataclass(frozen=True)
class Settings:
    """Where and how the PLE tables are read."""

    path: str
    strategy: str = "auto"
    budget: int | None = None


def parse_budget(value) -> int | None:
    """Bytes of a budget given as an int or a string like ``"256M"``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"pleio: budget must be a size like 256M or a number of bytes, not {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(value))
        if not m:
            raise ConfigError(f"pleio: budget must be a size like 256M or a number of bytes, not {value!r}")
        n = int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))
    if n <= 0:
        raise ConfigError(f"pleio: budget must be positive, not {value!r}")
    return n


def settings_from(cfg, env=os.environ, *, prefix: str, where: str) -> Settings | None:
    """The configuration: ``cfg`` (an engine's own config value: a dict with
    ``path``/``strategy``/``budget``, or a path) first, else the
    environment variables ``{prefix}_PATH``, ``{prefix}_STRATEGY``,
    ``{prefix}_BUDGET``; None when neither is set. ``where`` names ``cfg``
    in errors."""
    if cfg is not None:
        if isinstance(cfg, str):
            cfg = {"path": cfg}
        if not isinstance(cfg, dict):
            raise ConfigError(f"pleio: {where} must be an object, not {type(cfg).__name__}")
        unknown = sorted(set(cfg) - KEYS)
        if unknown:
            raise ConfigError(f"pleio: unknown key(s) {unknown} in {where} (known: {sorted(KEYS)})")
    elif env.get(f"{prefix}_PATH"):
        cfg = {"path": env[f"{prefix}_PATH"]}
        if env.get(f"{prefix}_STRATEGY"):
            cfg["strategy"] = env[f"{prefix}_STRATEGY"]
        if env.get(f"{prefix}_BUDGET"):
            cfg["budget"] = env[f"{prefix}_BUDGET"]
    if cfg is None:
        return None
    path = cfg.get("path")
    if not isinstance(path, str) or not path:
        raise ConfigError("pleio: 'path' (the checkpoint or GGUF file holding the PLE table) is required")
    strategy = cfg.get("strategy") or "auto"
    if strategy not in STRATEGIES:
        raise ConfigError(f"pleio: unknown strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
    return Settings(path=path, strategy=strategy, budget=parse_budget(cfg.get("budget")))


def _open_layer(s: Settings, layer: int | None):
    kwargs = {"strategy": s.strategy, "layer": layer}
    if s.budget is not None:
        kwargs["budget"] = s.budget
    try:
        return _open(s.path, **kwargs)
    except (Error, ValueError, OSError) as e:
        raise ConfigError(f"pleio: cannot open the PLE table at {s.path!r}: {e}") from e


def open_layer(s: Settings, dense_id: int, prefix: str):
    """The table of PLE layer ``dense_id`` (the model's ``dense_id``-th PLE
    module, named ``prefix``); its decoder layer must be the one in
    ``prefix`` (``...layers.N.``) when it names one."""
    first = _open_layer(s, None)
    layers = list(first.ple_layers)
    if dense_id >= len(layers):
        raise ConfigError(
            f"pleio: {s.path!r} has PLE tables for decoder layers {layers}; the model's "
            f"{prefix} is PLE layer index {dense_id}"
        )
    layer = layers[dense_id]
    m = LAYER.search(prefix)
    if m and int(m.group(1)) != layer:
        raise ConfigError(
            f"pleio: the model's {prefix} is decoder layer {m.group(1)}, but PLE table {dense_id} "
            f"of {s.path!r} belongs to decoder layer {layer}"
        )
    return first if first.layer == layer else _open_layer(s, layer)


def describe(s: Settings, table) -> str:
    """How errors name a table."""
    return f"pleio: the table at {s.path!r} (layer {table.layer}, {table.encoding}, {table.rows} x {table.row_elems})"


def placeholder(n: int, d: int, dtype, pinned: bool = False):
    """One zero row expanded to ``n x d``: the shape checks hold, no memory."""
    import torch

    row = torch.zeros((1, d), dtype=dtype, device="cpu", pin_memory=pinned)
    return row.expand(n, d)


def masked_gather(table, flat_ids, out, dtype, rounding=None, lo=None, hi=None) -> None:
    """Writes the rows of ``flat_ids`` (CPU int64) into ``out`` (CPU,
    contiguous, ``len(flat_ids)`` rows of ``dtype``: a torch dtype
    :func:`pleio.torch.gather` writes); with a range, rows of ids outside
    ``[lo, hi)`` (another tensor-parallel rank's) are zeros."""
    import torch

    import pleio.torch as pt

    if lo is None:
        pt.gather(table, flat_ids, dtype=dtype, out=out, rounding=rounding)
        return
    owned = (flat_ids >= lo) & (flat_ids < hi)
    if bool(owned.all()):
        pt.gather(table, flat_ids, dtype=dtype, out=out, rounding=rounding)
        return
    # Rows another rank owns are read as row 0, then zeroed.
    ids = torch.where(owned, flat_ids, torch.zeros((), dtype=flat_ids.dtype))
    pt.gather(table, ids, dtype=dtype, out=out, rounding=rounding)
    out.view(len(flat_ids), -1)[~owned] = 0
