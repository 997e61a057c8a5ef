"""pleio-vllm: vLLM's qwen4exp PLE table served from disk by pleio.

A vLLM general plugin (entry point ``vllm.general_plugins``). It is inert
unless the engine is started with

    --additional-config '{"pleio": {"path": "CKPT", "strategy": "auto", "budget": "256M"}}'

(``LLM(..., additional_config={"pleio": {...}})``) or with the environment
variable ``PLEIO_VLLM_PATH`` (and optionally ``PLEIO_VLLM_STRATEGY``,
``PLEIO_VLLM_BUDGET``). Then every PLE table of the model is served by
pleio: the stock table is never allocated and its shards are never read.
See docs/vllm.md.
"""

__all__ = ["register"]


def register() -> None:
    """The entry point vLLM calls in every process: installs the hooks
    (they do nothing until a table is configured)."""
    from .plugin import patch

    patch()
