#!/usr/bin/env python3
"""The proof of pleio-mlx on Linux CPU: mlx-vlm 0.7.10's own qwen4exp PLE
module (``Qwen4ExpNGramEmbedding`` of ``mlx_vlm/models/qwen4_exp/
language.py``) against the same module with its table served by pleio, bit
for bit.

    integrations/mlx/check.py [--work DIR] [--json OUT]

Checkpoints in mlx-vlm's layout (``language_model.model.layers.N.ple.
ple_embedding.ngram_embedding.shards.{i}.weight``, shards split mlx-vlm's
way): the BF16 table of a tiny model that transformers writes, and that
table quantized by MLX itself (``nn.quantize`` of mlx-vlm's module, affine
4-bit, group 32: what mlx-vlm's conversion does to the PLE shards), saved
with ``mx.save_safetensors``. For each:
- stock: the module's ``ShardedEmbedding`` (``nn.QuantizedEmbedding``
  shards for 4-bit: ``mx.dequantize``) loaded with the checkpoint's
  tensors, and mlx-vlm's ``ple_storage`` reader
  (``QuantizedMMapNGramEmbedding`` over the ``ple-store.json`` that
  ``build_quantized_ple_manifest`` writes; 4-bit only);
- pleio: the module built with ``text_config.ple_storage = {"pleio":
  {...}}`` (the hook), and pleio's own reading of the ``ple-store.json``;
- compared: the module's output (row ids of a sequence with an EOS inside,
  then their rows), the rows of every table row, bit for bit;
- bad configuration fails when the module is built.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import checklib as cl  # noqa: E402
from checklib import record  # noqa: E402

PREFIX = "language_model.model.layers.{}.ple.ple_embedding.ngram_embedding"


def text_config(hf_cfg: dict, storage=None):
    """mlx-vlm's TextConfig of the transformers-written config."""
    from mlx_vlm.models.qwen4_exp.config import TextConfig

    fields = dict(hf_cfg)
    fields.setdefault("linear_conv_kernel_dim", 4)
    fields.setdefault("max_position_embeddings", 4096)
    fields["model_type"] = "qwen4_exp_text"
    fields.pop("rope_parameters", None)  # mlx-vlm's default (M-RoPE): the PLE module does not read it
    fields["ple_storage"] = storage
    known = TextConfig.__dataclass_fields__
    return TextConfig(**{k: v for k, v in fields.items() if k in known})


def write_mlx(tf, work: str) -> tuple[dict, dict]:
    """The BF16 and 4-bit checkpoints in mlx-vlm's layout; name -> path,
    and the transformers config."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_vlm.models.qwen4_exp import language
    import torch
    from safetensors.torch import load_file

    src = os.path.join(work, "hf")
    cl.write_model(tf, src, seed=1, ple_layer_ids=(1, 2), parts=5)
    divmod_dir = os.path.join(work, "hf-divmod")
    tf.resplit_divmod(src, divmod_dir)  # rows % parts != 0: mlx-vlm's split
    with open(os.path.join(src, "config.json")) as f:
        hf_cfg = json.load(f)
    sd = load_file(os.path.join(divmod_dir, "model.safetensors"))
    out = {}
    for name, quant in (("BF16", None), ("MLX 4-bit", {"group_size": 32, "bits": 4, "mode": "affine"})):
        path = os.path.join(work, name.replace(" ", "-"))
        os.makedirs(path, exist_ok=True)
        tensors = {}
        for dense, layer in enumerate(i - 1 for i in hf_cfg["ple_layer_ids"]):
            cfg = text_config(hf_cfg)
            mod = language.Qwen4ExpNGramEmbedding(cfg, cfg.ple_embed_dim, layer, dense)
            shards = mod.ngram_embedding.shards
            for i, sh in enumerate(shards):
                w = sd[f"model.layers.{layer}.ple.ple_embedding.ngram_embedding.shard_{i}.weight"]
                sh.weight = mx.array(w.view(torch.int16).numpy()).view(mx.bfloat16)
            if quant:
                nn.quantize(mod, group_size=quant["group_size"], bits=quant["bits"], mode=quant["mode"])
            for i, sh in enumerate(mod.ngram_embedding.shards):
                for part in ("weight", "scales", "biases"):
                    if part in sh:
                        tensors[f"{PREFIX.format(layer)}.shards.{i}.{part}"] = sh[part]
        mx.eval(tensors)
        mx.save_safetensors(os.path.join(path, "model.safetensors"), tensors, metadata={"format": "mlx"})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": {k: "model.safetensors" for k in tensors}}, f)
        cfg = {"model_type": "qwen4_exp", "architectures": ["Qwen4ExpForConditionalGeneration"],
               "text_config": hf_cfg, "vision_config": {}}
        if quant:
            cfg["quantization"] = quant
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        out[name] = path
    return out, hf_cfg


def load_stock(path: str, hf_cfg: dict, layer: int, dense: int):
    """mlx-vlm's module with its ShardedEmbedding loaded from ``path``."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_vlm.models.qwen4_exp import language

    with open(os.path.join(path, "config.json")) as f:
        quant = json.load(f).get("quantization")
    cfg = text_config(hf_cfg)
    mod = language.Qwen4ExpNGramEmbedding(cfg, cfg.ple_embed_dim, layer, dense)
    if quant:
        nn.quantize(mod, group_size=quant["group_size"], bits=quant["bits"], mode=quant["mode"])
    weights = mx.load(os.path.join(path, "model.safetensors"))
    pre = PREFIX.format(layer) + "."
    mine = [(f"ngram_embedding.{k[len(pre):]}", v) for k, v in weights.items() if k.startswith(pre)]
    # Only the table: the module's hash constants are computed, not loaded.
    mod.load_weights(mine, strict=False)
    want = {k for k, _ in tree_flatten(mod.parameters()) if k.startswith("ngram_embedding.")}
    if want != {k for k, _ in mine}:
        raise ValueError(f"{path}: the table's tensors {sorted(k for k, _ in mine)[:4]}... are not the module's")
    mx.eval(mod.parameters())
    return mod


def probe_ids(vocab: int, eos: int):
    import numpy as np

    g = np.random.default_rng(5)
    toks = g.integers(0, vocab, size=(2, 24))
    toks[0, 7] = eos
    return toks


def as_bits(a):
    import mlx.core as mx
    import numpy as np

    return np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16 else np.array(a)


def check_model(name: str, path: str, hf_cfg: dict, work: str) -> None:
    import mlx.core as mx
    import numpy as np
    from mlx_vlm.models.qwen4_exp import language, ple_storage
    from pleio_mlx.plugin import PleioNGramEmbedding

    import pleio

    for dense, layer in enumerate(i - 1 for i in hf_cfg["ple_layer_ids"]):
        stock = load_stock(path, hf_cfg, layer, dense)
        cfg = text_config(hf_cfg, {"pleio": {"path": path, "strategy": "auto"}})
        served = language.Qwen4ExpNGramEmbedding(cfg, cfg.ple_embed_dim, layer, dense)
        ok_type = isinstance(served.ngram_embedding, PleioNGramEmbedding)
        record(f"{name}, layer {layer}: the module is built around pleio", ok_type, repr(served.ngram_embedding))
        if not ok_type:
            continue
        toks = mx.array(probe_ids(cfg.vocab_size, int(stock.eos_token_id)), dtype=mx.int64)
        a, b = stock(toks, None), served(toks, None)
        nonzero = bool(np.any(as_bits(a) != 0))
        record(f"{name}, layer {layer}: the module's output (row ids, then rows)",
               a.dtype == b.dtype == mx.bfloat16 and a.shape == b.shape and np.array_equal(as_bits(a), as_bits(b))
               and nonzero, f"{tuple(a.shape)} bf16")
        rows = served.ngram_embedding.row_count
        every = mx.arange(rows)
        a, b = stock.ngram_embedding(every), served.ngram_embedding(every)
        same = np.array_equal(as_bits(a), as_bits(b))
        diff = "" if same else f"{int(np.sum(np.any(as_bits(a) != as_bits(b), axis=-1)))} rows differ"
        record(f"{name}, layer {layer}: every row of the table ({rows})", same, diff)
        if name.startswith("MLX") and dense == 0:
            # mlx-vlm's own ple_storage reader over its manifest, and pleio's reading of that manifest.
            # A ple-store.json names no PLE layer: its geometry is the first PLE layer's.
            view = os.path.join(work, f"store-{layer}")
            os.makedirs(view, exist_ok=True)
            one = {k: v for k, v in mx.load(os.path.join(path, "model.safetensors")).items()
                   if k.startswith(PREFIX.format(layer) + ".")}
            mx.save_safetensors(os.path.join(view, "model.safetensors"), one, metadata={"format": "mlx"})
            with open(os.path.join(view, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {}, "weight_map": {k: "model.safetensors" for k in one}}, f)
            with open(os.path.join(path, "config.json")) as f:
                qcfg = json.load(f)
            with open(os.path.join(view, "config.json"), "w") as f:
                json.dump(qcfg, f)
            manifest = os.path.join(view, "ple-store.json")
            ple_storage.build_quantized_ple_manifest(view, manifest)
            reader = ple_storage.QuantizedMMapNGramEmbedding(manifest)
            c = reader(np.arange(rows))
            record(f"{name}, layer {layer}: mlx-vlm's ple_storage reader gives the same rows",
                   np.array_equal(as_bits(c), as_bits(b)))
            t = PleioNGramEmbedding(pleio.open(manifest, strategy="pread"))
            record(f"{name}, layer {layer}: pleio reading mlx-vlm's ple-store.json",
                   np.array_equal(as_bits(t(np.arange(rows))), as_bits(c)))


def expect_errors(path: str, hf_cfg: dict, cases, work: str) -> None:
    from mlx_vlm.models.qwen4_exp import language

    for name, storage, want in cases:
        cfg = text_config(hf_cfg, storage)
        try:
            language.Qwen4ExpNGramEmbedding(cfg, cfg.ple_embed_dim, 0, 0)
            err = None
        except Exception as e:  # noqa: BLE001 - what is raised is the result
            err = f"{type(e).__name__}: {e}"
        record(f"bad configuration when the model is built: {name}",
               err is not None and want in err and "pleio" in err, (err or "no error")[-300:])


def config_checks(model: str) -> None:
    """How the configuration is read: config.json's before the environment,
    a relative path is the model directory's, refusals."""
    from pleio_mlx.plugin import ConfigError, Settings, _configure, settings_from

    env = {"PLEIO_MLX_PATH": "/env", "PLEIO_MLX_STRATEGY": "pread", "PLEIO_MLX_BUDGET": "64M"}
    record("configuration: inert without one", settings_from(None, {}) is None and settings_from({}, {}) is None)
    record("configuration: the environment", settings_from(None, env) == Settings("/env", "pread", 64 << 20))
    record("configuration: config.json before the environment",
           settings_from({"pleio": {"path": "/cfg"}}, env) == Settings("/cfg"))
    got = _configure({"model_type": "qwen4_exp", "text_config": {"ple_storage": {"pleio": {"path": "."}}}}, model)
    record("configuration: a relative path is the model directory's",
           got["text_config"]["ple_storage"]["pleio"]["path"] == str(Path(model) / "."), str(got["text_config"]))
    try:
        _configure({"model_type": "qwen4_exp", "text_config": {"ple_storage": {"manifest": "m", "pleio": "/p"}}}, model)
        record("configuration refused: a manifest and pleio", False, "accepted")
    except ConfigError as e:
        record("configuration refused: a manifest and pleio", str(e).startswith("pleio:"), str(e))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work")
    ap.add_argument("--json")
    a = ap.parse_args()
    import mlx.core as mx
    import mlx_vlm

    import pleio
    from pleio_mlx.plugin import patch

    print(f"mlx {mx.__version__}, mlx-vlm {mlx_vlm.__version__}, pleio {pleio.__version__}", flush=True)
    patch()
    work, tmp = cl.work_dir(a.work, "pleio-mlx-")
    t0 = time.time()
    tf = cl.tf_helpers()
    report: dict = {"mlx": mx.__version__, "mlx_vlm": mlx_vlm.__version__}
    models, hf_cfg = write_mlx(tf, work)
    config_checks(models["BF16"])
    for name, path in models.items():
        try:
            check_model(name, path, hf_cfg, work)
        except Exception as e:  # noqa: BLE001 - reported, not swallowed
            record(f"{name}", False, f"{type(e).__name__}: {e}")
    other = os.path.join(work, "other-geometry")
    cl.write_model(tf, other, seed=2, base=3001)
    reseeded = os.path.join(work, "other-hash-seed")
    cl.write_model(tf, reseeded, seed=1, ple_layer_ids=(1, 2), parts=5, hash_seed=99)
    bf16 = models["BF16"]
    expect_errors(bf16, hf_cfg, [
        ("a wrong path", {"pleio": {"path": os.path.join(work, "missing")}}, "cannot open the PLE table"),
        ("a table of another geometry", {"pleio": {"path": other}}, "does not match the model"),
        ("a table of another hash seed (same geometry)", {"pleio": {"path": reseeded}}, "row ids differ"),
        ("an unknown strategy", {"pleio": {"path": bf16, "strategy": "fastest"}}, "unknown strategy"),
        ("an unknown key", {"pleio": {"path": bf16, "stratgey": "pread"}}, "unknown key"),
        ("a bad budget", {"pleio": {"path": bf16, "budget": "lots"}}, "budget"),
    ], work)
    status = cl.finish(report, a.json, "MLX check", t0)
    if tmp is not None:
        tmp.cleanup()
    return status


if __name__ == "__main__":
    sys.exit(main())
