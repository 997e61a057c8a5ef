"""pleio-mlx: mlx-vlm's qwen4exp PLE table served from disk by pleio.

mlx-vlm has no plug-in mechanism: call :func:`patch` before loading (or run
mlx-vlm's CLI through ``python -m pleio_mlx``), with the table configured
by the environment

    PLEIO_MLX_PATH=CKPT         # and optionally PLEIO_MLX_STRATEGY, PLEIO_MLX_BUDGET

or in the model's config.json, ``text_config.ple_storage = {"pleio":
{"path": ..., "strategy": ..., "budget": ...}}`` (a relative path is the
model directory's). Every PLE table of the model is then read by pleio
(rows as ``mx.dequantize`` gives them, ``rounding="mlx"``) instead of
mlx-vlm's ``ShardedEmbedding`` (the table in memory) or its
``ple-store.json`` reader; the checkpoint's table shards are never loaded.
See docs/mlx.md.
"""

from .plugin import PleioNGramEmbedding, load, patch

__all__ = ["PleioNGramEmbedding", "load", "patch"]
