"""The hooks of pleio-vllm into vLLM's qwen4exp PLE table (vLLM 0.31-0.33).

What is patched (each only acts on a table pleio serves; with no
configuration every hook calls the stock code unchanged):

- ``Qwen4ExpNGramEmbedding.__init__`` (``vllm/models/qwen4_exp/nvidia/
  ngram_embedding.py``): builds the module with a placeholder table (one
  zero row expanded to the table's shape, no memory), then opens the pleio
  table of that PLE layer and checks it against the module (rows, width,
  encoding, the row ids of a probe sequence). A bad path, strategy, budget
  or a table that does not fit raises here, at engine start.
- ``Qwen4ExpNGramEmbedding.load_weights`` drops the table's
  ``ngram_embedding.shard_{i}`` tensors, and the safetensors iterator's
  ``should_skip_weight`` skips them before they are read from disk.
- ``Qwen4ExpPLEDeviceEmbedding.forward`` (the class of
  ``engram_config={"cpu_offload": False}``, a CPU tensor on CPU machines):
  rows from pleio in the table's storage dtype (raw FP8 bytes, or bf16),
  zeros outside this rank's ``[org_vocab_start_index,
  org_vocab_end_index)`` when tensor-parallel, then the stock all-reduce.
- ``Qwen4ExpPLEPinnedHostEmbedding._lookup(input_ids, output)`` (the
  default class on GPU machines): fills ``output`` the way the stock UVA
  kernel does; on CUDA through pinned staging and a host node
  (:mod:`pleio_vllm.cuda`).
- ``Qwen4ExpPLEFp8EmbeddingMethod.process_weights_after_loading``: the
  checkpoint's FP8 scale, which vLLM still loads, must be the table's.
"""

from __future__ import annotations

import os
import re
import threading

import torch

import pleio
import pleio.torch as pt
from pleio._engine import ConfigError, Settings, describe, masked_gather, open_layer, parse_budget, placeholder
from pleio._engine import settings_from as _settings_from

__all__ = ["ConfigError", "Settings", "parse_budget", "patch", "settings_from", "skipped_shards"]

_SHARD = re.compile(r"(^|\.)ngram_embedding\.shard_\d+\.(weight|weight_scale)$")
_PATCHED = False
TESTED = ("0.31.", "0.32.", "0.33.")  # the versions check.sh has run on
_BUILDING = threading.local()
_SERVING = {"active": False, "skipped": 0}


def settings_from(extra, env=os.environ) -> Settings | None:
    """The configuration: ``additional_config["pleio"]`` first, else the
    ``PLEIO_VLLM_*`` environment variables; None when neither is set."""
    cfg = extra.get("pleio") if isinstance(extra, dict) else None
    return _settings_from(cfg, env, prefix="PLEIO_VLLM", where="additional_config['pleio']")


def current_settings() -> Settings | None:
    """The configuration of the vLLM engine being built (None: inert)."""
    from vllm.config import get_current_vllm_config

    try:
        extra = get_current_vllm_config().additional_config
    except Exception:  # noqa: BLE001 - no config being built: fall back to the environment
        extra = None
    return settings_from(extra)


class Served:
    """A PLE table served by pleio for one vLLM embedding module: the
    storage dtype vLLM's lookup writes, and how to gather it."""

    def __init__(self, table, out_dtype: torch.dtype, gather_dtype: torch.dtype, rounding: str | None,
                 cpu_rounding: str | None = None):
        self.table = table
        self.out_dtype = out_dtype
        self.gather_dtype = gather_dtype
        self.rounding = rounding
        # The rule of the device table's lookup when it runs on CPU, if
        # vLLM's CPU code rounds otherwise than its kernel (NVFP4).
        self.cpu_rounding = cpu_rounding or rounding
        self.row_bytes = table.row_elems * torch.empty((), dtype=out_dtype).element_size()

    def fill(self, flat_ids: torch.Tensor, out: torch.Tensor, lo: int | None = None, hi: int | None = None,
             on_cpu: bool = False) -> None:
        """Writes the rows of ``flat_ids`` (CPU int64) into ``out`` (CPU,
        contiguous, ``len(flat_ids)`` rows of the storage dtype); with a
        range, rows of ids outside ``[lo, hi)`` are zeros. ``on_cpu``: as
        the stock lookup computes them on CPU, not in its GPU kernel."""
        dst = out.view(self.gather_dtype) if self.gather_dtype != out.dtype else out
        rule = self.cpu_rounding if on_cpu else self.rounding
        masked_gather(self.table, flat_ids, dst, self.gather_dtype, rule, lo, hi)


def _vllm():
    from vllm.model_executor.model_loader import weight_utils
    from vllm.models.qwen4_exp.common import ngram_embedding as common
    from vllm.models.qwen4_exp.nvidia import ngram_embedding as nvidia

    return common, nvidia, weight_utils


def _method_kind(method, common) -> str:
    if isinstance(method, common.Qwen4ExpPLEFp8EmbeddingMethod):
        return "fp8"
    nvfp4 = getattr(common, "Qwen4ExpPLENvFp4EmbeddingMethod", None)  # vLLM 0.33 on; 0.31 and 0.32 have no NVFP4 PLE
    if nvfp4 is not None and isinstance(method, nvfp4):
        return "nvfp4"
    if isinstance(method, common.Qwen4ExpPLEUnquantizedEmbeddingMethod):
        return "unquantized"
    raise ConfigError(f"pleio: the PLE embedding method {type(method).__name__} is not one pleio serves")


def _attach(module, s: Settings, dense_id: int, prefix: str, common) -> None:
    """Opens the table of PLE layer ``dense_id`` and checks it against the
    module; raises :class:`ConfigError` naming both on any mismatch."""
    emb = module.ngram_embedding
    if not isinstance(emb, (common.Qwen4ExpPLEDeviceEmbedding, common.Qwen4ExpPLEPinnedHostEmbedding)):
        # vLLM 0.34's Qwen4ExpPLEDiskOffloadEmbedding (engram_config disk_offload) reads
        # the checkpoint files itself; a class pleio does not hook is refused, not served.
        raise ConfigError(
            f"pleio: the model's {prefix} is a {type(emb).__name__}, which pleio does not serve; "
            "use engram_config cpu_offload (the default on GPU machines) or the device table"
        )
    table = open_layer(s, dense_id, prefix)
    what = describe(s, table)
    rows, dim = int(emb.org_vocab_size), int(emb.embedding_dim)
    if (table.rows, table.row_elems) != (rows, dim):
        raise ConfigError(f"{what} does not match the model's {prefix}: {rows} rows of {dim}")
    kind = _method_kind(emb.embedding_method, common)
    if kind == "fp8":
        if table.encoding != "fp8":
            raise ConfigError(f"{what}: the model's PLE table is FP8 with one scale (ple_embedding_dtype float8_e4m3fn)")
        served = Served(table, torch.float8_e4m3fn, torch.uint8, None)
    elif kind == "nvfp4":
        if table.encoding != "nvfp4":
            raise ConfigError(f"{what}: the model's PLE table is NVFP4 (ple_embedding_dtype nvfp4)")
        # vLLM's GPU kernel computes (v * scale) * global, pleio's exact
        # rule; its CPU path (dequantize_to_dtype) v * (scale * global).
        served = Served(table, emb.params_dtype, emb.params_dtype, "exact", cpu_rounding="vllm")
    else:
        dtype = emb.weight.dtype
        if table.encoding not in ("bf16", "f16", "f32"):
            raise ConfigError(f"{what}: the model's PLE table is unquantized {dtype} (no ple_embedding_dtype)")
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ConfigError(f"{what}: pleio cannot write the model's table dtype {dtype}")
        served = Served(table, dtype, dtype, "vllm")
    _check_row_ids(module, table, what, prefix)
    emb._pleio = served
    emb._pleio_prefix = prefix


def _check_row_ids(module, table, what: str, prefix: str) -> None:
    """The row ids of a probe sequence (with an EOS inside) must be the
    module's own."""
    buf = module.layer_multipliers
    vocab = int(module.unigram_vocab_size)
    eos = int(module.eos_token_id)
    toks = [t % vocab for t in (1, 7, 3, 11, 2)] + [eos % vocab] + [t % vocab for t in (5, 9, 4)]
    ids = torch.tensor(toks, dtype=torch.long, device=buf.device)
    qsl = torch.tensor([0, len(toks)], dtype=torch.int32, device=buf.device)
    ctx = torch.full((1, module.ngram_size - 1), eos, dtype=torch.long, device=buf.device)
    with torch.no_grad():
        want = module.compute_ngram_ids(ids, qsl, ctx).cpu()
    got = torch.from_numpy(pleio.row_ids(table, torch.tensor(toks).numpy()))
    if got.shape != want.shape or not torch.equal(got, want.to(got.dtype)):
        raise ConfigError(f"{what}: its row ids differ from those of the model's {prefix} (another seed, layer or geometry)")


def _reduce(module, out: torch.Tensor) -> torch.Tensor:
    """The stock tensor-parallel sum of per-rank rows (FP8 as int8 bytes)."""
    from vllm.distributed import tensor_model_parallel_all_reduce

    # vLLM 0.31's VocabParallelEmbedding has no reduce_results: it always reduces.
    if module.tp_size == 1 or not getattr(module, "reduce_results", True):
        return out
    dtype = out.dtype
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        out = out.view(torch.int8)
    group = module.parallel_group
    out = group.all_reduce(out) if group is not None else tensor_model_parallel_all_reduce(out)
    return out.view(dtype)


def device_lookup(module, ids: torch.Tensor) -> torch.Tensor:
    """What ``VocabParallelEmbedding.forward`` returns for ``ids``: the rows
    in the storage dtype; under tensor parallelism zeros outside this rank's
    range, then summed over ranks."""
    srv = module._pleio
    out = torch.empty((*ids.shape, module.embedding_dim), dtype=srv.out_dtype, device=ids.device)
    flat = ids.reshape(-1).long().cpu()
    if flat.numel():
        on_cpu = out.device.type == "cpu"
        host = out if on_cpu else torch.empty(out.shape, dtype=out.dtype)
        if module.tp_size == 1:
            srv.fill(flat, host, on_cpu=on_cpu)
        else:
            si = module.shard_indices
            srv.fill(flat, host, si.org_vocab_start_index, si.org_vocab_end_index, on_cpu=on_cpu)
        if host is not out:
            out.copy_(host)
    return _reduce(module, out)


def patch() -> None:
    """Installs the hooks once (idempotent; vLLM loads plugins in every process)."""
    global _PATCHED
    if _PATCHED:
        return
    try:
        common, nvidia, weight_utils = _vllm()
    except ImportError:
        return  # a vLLM without qwen4exp (before 0.31): nothing to serve
    import vllm
    from vllm.logger import init_logger

    if not str(getattr(vllm, "__version__", "")).startswith(TESTED):
        init_logger(__name__).warning(
            "pleio-vllm: hooks checked on vLLM %s, this is %s; a table is checked at engine start",
            ", ".join(v + "x" for v in TESTED), getattr(vllm, "__version__", "?"),
        )
    ngram = nvidia.Qwen4ExpNGramEmbedding
    device_cls = common.Qwen4ExpPLEDeviceEmbedding
    pinned_cls = common.Qwen4ExpPLEPinnedHostEmbedding

    orig_init = ngram.__init__

    def __init__(self, config, embedding_dim, ple_dense_layer_id, max_total_tokens, *args, **kwargs):
        s = current_settings()
        if s is None:
            return orig_init(self, config, embedding_dim, ple_dense_layer_id, max_total_tokens, *args, **kwargs)
        _BUILDING.active = True
        try:
            orig_init(self, config, embedding_dim, ple_dense_layer_id, max_total_tokens, *args, **kwargs)
        finally:
            _BUILDING.active = False
        _attach(self, s, int(ple_dense_layer_id), kwargs.get("prefix", ""), common)
        _SERVING["active"] = True

    def wrap_alloc(cls, pinned: bool):
        orig = cls.allocate_embedding_weight

        def allocate_embedding_weight(self, num_embeddings, embedding_dim, dtype):
            if not getattr(_BUILDING, "active", False):
                return orig(self, num_embeddings, embedding_dim, dtype)
            return placeholder(num_embeddings, embedding_dim, dtype, pinned)

        cls.allocate_embedding_weight = allocate_embedding_weight

    orig_load = ngram.load_weights

    def load_weights(self, weights):
        if getattr(self.ngram_embedding, "_pleio", None) is None:
            return orig_load(self, weights)
        served = self.ngram_embedding
        dropped: set[str] = set()

        def kept():
            for name, w in weights:
                if _SHARD.search(name):
                    dropped.add(f"ngram_embedding.{name.rsplit('.', 1)[1]}")
                    continue
                yield name, w

        loaded = orig_load(self, kept())
        # The table is pleio's: report its parameters as loaded.
        loaded.update(dropped)
        for name in ("weight",) + (("weight_scale",) if served._pleio.out_dtype != torch.float8_e4m3fn else ()):
            if hasattr(served, name):
                loaded.add(f"ngram_embedding.{name}")
        return loaded

    orig_skip = weight_utils.should_skip_weight

    def should_skip_weight(name, *args, **kwargs):
        if _SERVING["active"] and _SHARD.search(name) and ".ple_embedding." in f".{name}":
            _SERVING["skipped"] += 1
            return True
        return orig_skip(name, *args, **kwargs)

    orig_forward = device_cls.forward

    def forward(self, ngram_ids):
        if getattr(self, "_pleio", None) is None:
            return orig_forward(self, ngram_ids)
        slot_size, slot_offset = self._get_dp_gather_slot(ngram_ids.shape[0])
        gathered = self._gather_dp_ids(ngram_ids, slot_size)
        return self._select_embeddings(device_lookup(self, gathered), ngram_ids.shape[0], slot_offset)

    orig_lookup = pinned_cls._lookup

    def _lookup(self, input_ids, output=None):
        srv = getattr(self, "_pleio", None)
        if srv is None:
            return orig_lookup(self, input_ids, output)
        return pinned_lookup(self, input_ids, output)

    def check_after_loading(method_cls, check):
        """``method_cls.process_weights_after_loading``, then ``check`` of a
        served layer's loaded scale against its table."""
        orig_pwal = method_cls.process_weights_after_loading

        def process_weights_after_loading(self, layer):
            orig_pwal(self, layer)
            srv = getattr(layer, "_pleio", None)
            if srv is not None:
                check(layer, srv)

        method_cls.process_weights_after_loading = process_weights_after_loading

    ngram.__init__ = __init__
    ngram.load_weights = load_weights
    wrap_alloc(device_cls, pinned=False)
    wrap_alloc(pinned_cls, pinned=True)
    device_cls.forward = forward
    pinned_cls._lookup = _lookup
    check_after_loading(common.Qwen4ExpPLEFp8EmbeddingMethod, check_fp8_scale)
    nvfp4 = getattr(common, "Qwen4ExpPLENvFp4EmbeddingMethod", None)
    if nvfp4 is not None:
        check_after_loading(nvfp4, check_nvfp4_scale)
    weight_utils.should_skip_weight = should_skip_weight
    _PATCHED = True


def skipped_shards() -> int:
    """How many PLE shard tensors the safetensors loader skipped unread."""
    return _SERVING["skipped"]


def pinned_lookup(module, input_ids: torch.Tensor, output: torch.Tensor | None = None) -> torch.Tensor:
    """``Qwen4ExpPLEPinnedHostEmbedding._lookup`` served by pleio: ``output``
    ``(*input_ids.shape, D)`` of the lookup dtype gets the rows of ids in
    ``[org_vocab_start_index, org_vocab_end_index)`` and zeros elsewhere,
    as the stock kernel writes them. On CUDA the ids go D2H, the rows are
    gathered into pinned staging by a host node and go H2D, all on the
    current (prefetch) stream."""
    srv = module._pleio
    expected = (*input_ids.shape, module.embedding_dim)
    if output is None:
        output = torch.empty(expected, dtype=srv.out_dtype, device=input_ids.device)
    elif tuple(output.shape) != expected or output.dtype != srv.out_dtype or output.device != input_ids.device:
        raise ValueError("PLE prefetch output must match the input shape, lookup dtype, and input device")
    flat = input_ids.reshape(-1)
    if flat.numel():
        si = module.shard_indices
        if flat.is_cuda:
            from .cuda import lookup_on_stream

            lookup_on_stream(module, srv, flat, output, si.org_vocab_start_index, si.org_vocab_end_index)
        else:
            srv.fill(flat.long(), output, si.org_vocab_start_index, si.org_vocab_end_index)
    return output


def check_nvfp4_scale(layer, srv: Served) -> None:
    """The NVFP4 global scale vLLM loaded (``weight_scale_2``) must be the
    served table's: the table's exact rows equal ``(v * e4m3(block scale))
    * global`` on a few rows."""
    g = layer.weight_scale_2.detach().float().cpu().reshape(-1)[0]
    n = min(64, srv.table.rows)
    ids = torch.linspace(0, srv.table.rows - 1, n).long()
    d = srv.table.row_elems
    raw = pt.gather(srv.table, ids, dtype=torch.uint8)  # d/2 bytes of nibbles, then d/16 E4M3 scales
    packed, scales = raw[:, : d // 2], raw[:, d // 2 :].view(torch.float8_e4m3fn).float()
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(n, d)
    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    want = (lut[codes.long()] * scales.repeat_interleave(16, dim=1)) * g
    exact = pt.gather(srv.table, ids, dtype=torch.float32)
    if not torch.equal(want, exact):
        raise ConfigError(
            f"pleio: the NVFP4 global scale (weight_scale_2) of {layer._pleio_prefix} in the model ({g.item()!r}) "
            f"is not the scale of the table at {str(srv.table.path)!r}"
        )


def check_fp8_scale(layer, srv: Served) -> None:
    """The FP8 scale vLLM loaded must be the served table's: the table's
    exact rows equal ``e4m3 * scale`` (exact in f32) on a few nonzero rows."""
    scale = layer.weight_scale.detach().float().cpu().reshape(-1)[0]
    n = min(64, srv.table.rows)
    ids = torch.linspace(0, srv.table.rows - 1, n).long()
    raw = pt.gather(srv.table, ids, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    exact = pt.gather(srv.table, ids, dtype=torch.float32)
    if not torch.equal(raw * scale, exact):
        raise ConfigError(
            f"pleio: the FP8 scale of {layer._pleio_prefix} in the model ({scale.item()!r}) is not the scale of "
            f"the table at {str(srv.table.path)!r}"
        )
