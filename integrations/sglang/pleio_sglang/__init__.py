"""pleio-sglang: SGLang's qwen4exp PLE table served from disk by pleio.

An SGLang general plugin (entry point ``sglang.srt.plugins``, loaded by
SGLang in every server process). It is inert unless the environment has

    PLEIO_SGLANG_PATH=CKPT      # and optionally PLEIO_SGLANG_STRATEGY, PLEIO_SGLANG_BUDGET

Then every PLE table of a qwen4exp model is served by pleio: the stock
table (pinned host memory, a file-backed mapping, or a device tensor) is
never allocated and its shards are never read. See docs/sglang.md.
"""

__all__ = ["register"]


def register() -> None:
    """The entry point SGLang calls in every process: installs the hooks
    (they do nothing until a table is configured)."""
    from .plugin import patch

    patch()
