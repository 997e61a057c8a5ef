"""The hooks of pleio-sglang into SGLang's qwen4exp PLE table (SGLang 0.5.23,
``sglang/srt/models/qwen4_exp.py``).

What is patched (each only acts on a table pleio serves; with no
configuration every hook calls the stock code unchanged):

- ``Qwen4ExpNGramEmbedding.__init__``: the module is built on SGLang's
  offload path (``Qwen4ExpPinnedHostEmbedding``, the table's metadata on
  the meta device) whatever ``--ple-offload-embedding`` says, and
  ``allocate_ple_host_table`` hands it a placeholder (one zero row expanded
  to the table's shape, no memory) instead of the pinned table or the
  file-backed mapping. Then the pleio table of that PLE layer is opened and
  checked against the module (rows, width, encoding, the row ids of a probe
  sequence). A bad path, strategy, budget or a table that does not fit
  raises here, at engine start.
- ``Qwen4ExpPinnedHostEmbedding.gather(input_ids, out=None)``: bf16
  ``(*input_ids.shape, D)`` as the stock Triton kernel writes it: the
  stored row widened to bf16 (FP8 E4M3 -> bf16 is exact; the scale is
  applied after, by the caller, as stock), zeros for ids outside this
  rank's ``[org_vocab_start_index, org_vocab_end_index)``.
- ``Qwen4ExpForConditionalGeneration.load_weights`` drops the table's
  ``ngram_embedding.shard_{i}.weight`` tensors, and the safetensors
  iterator skips them before they are read; ``weight_scale`` still loads,
  and for FP8 it must be the served table's scale (checked after loading).
"""

from __future__ import annotations

import os
import re
import threading
from contextlib import contextmanager

import torch

import pleio
import pleio.torch as pt
from pleio._engine import ConfigError, Settings, describe, masked_gather, open_layer, placeholder
from pleio._engine import settings_from as _settings_from

__all__ = ["ConfigError", "Settings", "current_settings", "patch", "settings_from", "skipped_shards"]

_SHARD = re.compile(r"\.ngram_embedding\.shard_\d+\.weight$")
_PATCHED = False
TESTED = "0.5.23"
_BUILDING = threading.local()
_SERVING = {"active": False, "skipped": 0}


def settings_from(env=os.environ) -> Settings | None:
    """The configuration: the ``PLEIO_SGLANG_*`` environment variables
    (``_PATH``, ``_STRATEGY``, ``_BUDGET``); None when not set."""
    return _settings_from(None, env, prefix="PLEIO_SGLANG", where="the environment")


current_settings = settings_from


class Served:
    """A PLE table served by pleio for one SGLang embedding module."""

    def __init__(self, table, fp8: bool):
        self.table = table
        self.fp8 = fp8

    def fill(self, flat_ids: torch.Tensor, out: torch.Tensor, lo: int, hi: int) -> None:
        """Writes the bf16 rows of ``flat_ids`` (CPU int64) into ``out``
        (CPU, contiguous bf16, ``len(flat_ids)`` rows), zeros outside
        ``[lo, hi)``: what ``_gather_ple_embedding_from_pinned_kernel``
        writes."""
        if not self.fp8:
            masked_gather(self.table, flat_ids, out, torch.bfloat16, "sglang", lo, hi)
            return
        raw = torch.empty((len(flat_ids), self.table.row_bytes), dtype=torch.uint8)
        masked_gather(self.table, flat_ids, raw, torch.uint8, None, lo, hi)
        out.view(len(flat_ids), -1).copy_(raw.view(torch.float8_e4m3fn))


def _sglang():
    from sglang.srt.model_loader import loader
    from sglang.srt.models import qwen4_exp

    return qwen4_exp, loader


@contextmanager
def _probe_context():
    """A forward context whose request pool has no n-gram window cache:
    what ``Qwen4ExpNGramEmbedding._hash_contexts`` reads outside a batch."""
    from types import SimpleNamespace

    from sglang.srt.model_executor import forward_context as fc

    pool = SimpleNamespace(ple_window_cache=None)
    prev = fc.set_forward_context(SimpleNamespace(attn_backend=SimpleNamespace(req_to_token_pool=pool)))
    try:
        yield
    finally:
        fc.set_forward_context(prev)


def module_row_ids(module, tokens: list[int]) -> torch.Tensor:
    """The row ids ``module`` (a ``Qwen4ExpNGramEmbedding``) computes for one
    fresh sequence ``tokens``: its own hash over the windows SGLang builds
    (EOS history before the first token)."""
    n = module.ngram_size
    eos = module.eos_token_id
    seq = torch.tensor([eos] * (n - 1) + list(tokens), dtype=torch.long, device=module.layer_multipliers.device)
    windows = seq.unfold(0, n, 1)
    with torch.no_grad(), _probe_context():
        return module._hash_contexts(windows).cpu()


def _attach(module, s: Settings, dense_id: int, prefix: str) -> None:
    """Opens the table of PLE layer ``dense_id`` and checks it against the
    module; raises :class:`ConfigError` naming both on any mismatch."""
    emb = module.ngram_embedding
    table = open_layer(s, dense_id, prefix)
    what = describe(s, table)
    rows, dim = int(emb.org_vocab_size), int(emb.embedding_dim)
    if (table.rows, table.row_elems) != (rows, dim):
        raise ConfigError(f"{what} does not match the model's {prefix}: {rows} rows of {dim}")
    fp8 = emb.weight.dtype == torch.float8_e4m3fn
    if fp8 and table.encoding != "fp8":
        raise ConfigError(f"{what}: the model's PLE table is FP8 with one scale (ple_embedding_dtype float8_e4m3fn)")
    if not fp8 and table.encoding != "bf16":
        raise ConfigError(f"{what}: the model's PLE table is bf16 (no ple_embedding_dtype)")
    vocab = int(module.unigram_vocab_size)
    eos = int(module.eos_token_id)
    toks = [t % vocab for t in (1, 7, 3, 11, 2)] + [eos % vocab] + [t % vocab for t in (5, 9, 4)]
    want = module_row_ids(module, toks)
    got = torch.from_numpy(pleio.row_ids(table, torch.tensor(toks).numpy()))
    if got.shape != want.shape or not torch.equal(got, want.to(got.dtype)):
        raise ConfigError(f"{what}: its row ids differ from those of the model's {prefix} (another seed, layer or geometry)")
    emb._pleio = Served(table, fp8)
    emb._pleio_prefix = prefix


def gather(emb, input_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``Qwen4ExpPinnedHostEmbedding.gather`` served by pleio (same checks
    of ``out`` as stock). On CUDA the ids are copied to the host, the rows
    gathered there and copied into ``out`` on the current stream
    (synchronous: not capturable into a CUDA graph)."""
    expected = (*input_ids.shape, emb.embedding_dim)
    if out is None:
        out = emb.allocate_output(expected, input_ids.device)
    else:
        if tuple(out.shape) != expected:
            raise ValueError(f"invalid PLE prefetch output shape: {tuple(out.shape)} != {expected}")
        if out.dtype != torch.bfloat16 or out.device != input_ids.device:
            raise ValueError("PLE prefetch output must be bfloat16 on the id device")
    flat = input_ids.reshape(-1).long()
    if flat.numel():
        si = emb.shard_indices
        lo, hi = si.org_vocab_start_index, si.org_vocab_end_index
        if out.device.type == "cpu" and out.is_contiguous():
            emb._pleio.fill(flat, out, lo, hi)
        else:
            host = torch.empty(expected, dtype=torch.bfloat16)
            emb._pleio.fill(flat.cpu(), host, lo, hi)
            out.copy_(host)
    return out


def check_fp8_scale(emb) -> None:
    """For FP8 the ``weight_scale`` SGLang loaded (bf16) must be the served
    table's scale rounded to bf16: the table's exact rows divided by their
    stored E4M3 values give it, on up to 64 rows."""
    srv = emb._pleio
    scale = emb.weight_scale.detach().cpu().reshape(-1)[0]
    n = min(64, srv.table.rows)
    ids = torch.linspace(0, srv.table.rows - 1, n).long()
    raw = pt.gather(srv.table, ids, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    exact = pt.gather(srv.table, ids, dtype=torch.float32)
    nz = raw != 0
    if not bool(nz.any()):
        return
    ratio = (exact[nz] / raw[nz]).to(torch.bfloat16)
    if not bool((ratio == scale.to(torch.bfloat16)).all()):
        raise ConfigError(
            f"pleio: the FP8 scale of {emb._pleio_prefix} in the model ({scale.item()!r}) is not the scale of "
            f"the table at {str(srv.table.path)!r}"
        )


def patch() -> None:
    """Installs the hooks once (idempotent; SGLang loads plugins in every process)."""
    global _PATCHED
    if _PATCHED:
        return
    try:
        qwen4_exp, loader = _sglang()
    except ImportError:
        return  # an SGLang without qwen4exp: nothing to serve
    import sglang

    if str(getattr(sglang, "__version__", "")) != TESTED:
        qwen4_exp.logger.warning(
            "pleio-sglang: hooks written for SGLang %s, this is %s; a table is checked at engine start",
            TESTED, getattr(sglang, "__version__", "?"),
        )
    ngram = qwen4_exp.Qwen4ExpNGramEmbedding
    host_cls = qwen4_exp.Qwen4ExpPinnedHostEmbedding
    model_cls = qwen4_exp.Qwen4ExpForConditionalGeneration

    orig_init = ngram.__init__

    def __init__(self, config, embedding_dim, ple_layer_index=0, quant_config=None, prefix=""):
        s = current_settings()
        if s is None:
            return orig_init(self, config, embedding_dim, ple_layer_index, quant_config, prefix)
        offload = getattr(config, "ple_offload_embedding", False)
        _BUILDING.active = True
        config.ple_offload_embedding = True
        try:
            orig_init(self, config, embedding_dim, ple_layer_index, quant_config, prefix)
        finally:
            config.ple_offload_embedding = offload
            _BUILDING.active = False
        _attach(self, s, int(ple_layer_index), f"{prefix}.ngram_embedding" if prefix else "ngram_embedding")
        _SERVING["active"] = True

    orig_alloc = qwen4_exp.allocate_ple_host_table

    def allocate_ple_host_table(shape, dtype, backend="pinned", table_dir=None, tag=None):
        if not getattr(_BUILDING, "active", False):
            return orig_alloc(shape, dtype, backend=backend, table_dir=table_dir, tag=tag)
        n, d = (int(x) for x in shape)
        return placeholder(n, d, dtype)

    orig_gather = host_cls.gather

    def gather_hook(self, input_ids, out=None):
        if getattr(self, "_pleio", None) is None:
            return orig_gather(self, input_ids, out)
        return gather(self, input_ids, out)

    orig_load = model_cls.load_weights

    def load_weights(self, weights):
        served = {n for n, m in self.named_modules() if getattr(m, "_pleio", None) is not None}
        if not served:
            return orig_load(self, weights)

        def kept():
            for name, w in weights:
                if _SHARD.search(name):
                    continue
                yield name, w

        loaded = orig_load(self, kept())
        for name, m in self.named_modules():
            srv = getattr(m, "_pleio", None)
            if srv is not None:
                loaded.add(f"{name}.weight")
                if srv.fp8:
                    check_fp8_scale(m)
        return loaded

    orig_iter = loader.safetensors_weights_iterator

    def safetensors_weights_iterator(hf_weights_files, disable_mmap=False, *args, **kwargs):
        if not _SERVING["active"] or disable_mmap:
            yield from orig_iter(hf_weights_files, disable_mmap, *args, **kwargs)
            return
        import safetensors

        for st_file in hf_weights_files:
            with safetensors.safe_open(st_file, framework="pt", device="cpu") as f:
                for name in f.keys():
                    if _SHARD.search(name) and ".ple_embedding." in name:
                        _SERVING["skipped"] += 1
                        continue
                    yield name, f.get_tensor(name)

    ngram.__init__ = __init__
    qwen4_exp.allocate_ple_host_table = allocate_ple_host_table
    host_cls.gather = gather_hook
    model_cls.load_weights = load_weights
    loader.safetensors_weights_iterator = safetensors_weights_iterator
    _PATCHED = True


def skipped_shards() -> int:
    """How many PLE shard tensors the safetensors iterator skipped unread."""
    return _SERVING["skipped"]
