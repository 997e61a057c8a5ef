#!/usr/bin/env python3
"""The CPU proof of the pleio SGLang plugin: SGLang's own qwen4exp PLE
module (``Qwen4ExpNGramEmbedding`` of ``sglang/srt/models/qwen4_exp.py``)
is built on CPU for tiny models that transformers writes, its table loaded
by SGLang's own ``Qwen4ExpForConditionalGeneration.load_weights`` from the
checkpoint through SGLang's safetensors iterator, once stock and once with
the plugin (loaded by SGLang's plugin loader, ``load_plugins()``), and what
it computes is compared bit for bit.

    integrations/sglang/check.py [--work DIR] [--json OUT] [--rss]

Each side runs in its own process (``child``) and saves what the module
gives and its peak RSS; the parent compares:
- the row ids (the module's own hash, ``_hash_contexts``) of two
  sequences, one with an EOS inside;
- ``Qwen4ExpPinnedHostEmbedding.gather(ids)``: stock is SGLang's Triton
  kernel, run by Triton's interpreter on CPU (``TRITON_INTERPRET=1``),
  over the file-backed host table (``--ple-offload-backend file``: the
  pinned one needs CUDA); also with ``out=``;
- the module's lookup with the scale applied after (``_embed_ngram_ids``);
- ``gather`` under tensor-parallel rank ranges other than the full one, set
  on the module directly (stock: the rank's slice of the table);
- the stock default (``--no-ple-offload-embedding``) table, a
  ``VocabParallelEmbedding`` on CPU, gives the same rows;
- the table is never allocated (the module's weight storage is one row)
  and its shards are skipped unread;
- bad configuration fails at engine start (the module's build or the
  load) with a clear error;
- with --rss: peak RSS with the plugin against stock on a model whose
  table is over 1 GiB.
Models: BF16, FP8 with a bf16 scale, FP8 with an f32 scale.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import checklib as cl  # noqa: E402
from checklib import bits, record, same  # noqa: E402

RANGES = ((0, "half"), ("half", None), ("third", "2third"))

# ---------------------------------------------------------------- the child


def init_sglang() -> None:
    """One rank's distributed groups on CPU (gloo), as SGLang's layer tests
    set them up (``sglang/test/layer_ut_utils.py``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    publish(ServerArgs(model_path="dummy", tp_size=1, ep_size=1, pp_size=1), role="test", ranks=SpawnRanks(world_rank=0))
    if parallel_state._WORLD is not None:
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
    initialize_model_parallel(backend="gloo")


def text_config(model: str, offload: bool, table_dir: str):
    from sglang.srt.configs.qwen4_exp import Qwen4ExpTextConfig

    with open(os.path.join(model, "config.json")) as f:
        raw = json.load(f)
    raw = raw.get("text_config", raw)
    raw = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}
    cfg = Qwen4ExpTextConfig(**raw)
    cfg.ple_offload_embedding = offload
    cfg.ple_offload_backend = "file"
    cfg.ple_offload_dir = table_dir
    return cfg


def build(model: str, offload: bool, table_dir: str):
    """SGLang's PLE modules of ``model`` (its ``ple_layer_ids``, 1-based),
    under ``model.layers.N.ple.ple_embedding`` as in the model, loaded by
    ``Qwen4ExpForConditionalGeneration.load_weights`` from the checkpoint."""
    import torch
    from sglang.srt.model_loader import loader
    from sglang.srt.models import qwen4_exp as q

    cfg = text_config(model, offload, table_dir)

    class Ple(torch.nn.Module):
        def __init__(self, layer: int, dense: int):
            super().__init__()
            self.ple_embedding = q.Qwen4ExpNGramEmbedding(
                cfg, cfg.ple_embed_dim, ple_layer_index=dense, prefix=f"model.layers.{layer}.ple.ple_embedding")

    class Layer(torch.nn.Module):
        def __init__(self, layer: int):
            super().__init__()
            ids = [i - 1 for i in cfg.ple_layer_ids]
            if layer in ids:
                self.ple = Ple(layer, ids.index(layer))

    class Holder(torch.nn.Module):
        """What ``load_weights`` reads of the model: its config, layers
        range, and modules."""

        def __init__(self):
            super().__init__()
            self.config = cfg
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([Layer(i) for i in range(cfg.num_hidden_layers)])
            self.start_layer, self.end_layer = 0, cfg.num_hidden_layers
            self.language_model_only = True
            self.pp_group = type("PP", (), {"is_first_rank": True, "is_last_rank": True})()

    # The stock loader's own PLE buffer loading.
    Holder._load_qwen4_exp_ple_buffer = q.Qwen4ExpForConditionalGeneration._load_qwen4_exp_ple_buffer
    holder = Holder()
    files = sorted(os.path.join(model, f) for f in os.listdir(model) if f.endswith(".safetensors"))
    weights = ((n, w) for n, w in loader.safetensors_weights_iterator(files) if ".ple.ple_embedding." in n)
    q.Qwen4ExpForConditionalGeneration.load_weights(holder, weights)
    return holder, cfg


def rank_range(indices, lo: int, hi: int):
    """The shard indices of a tensor-parallel rank owning rows ``[lo, hi)``."""
    import dataclasses

    return dataclasses.replace(
        indices, padded_org_vocab_start_index=lo, padded_org_vocab_end_index=hi, org_vocab_start_index=lo,
        org_vocab_end_index=hi, padded_added_vocab_start_index=hi, padded_added_vocab_end_index=hi,
        added_vocab_start_index=hi, added_vocab_end_index=hi,
    )


def _range(spec, rows: int) -> int:
    return {None: rows, 0: 0, "half": rows // 2, "third": rows // 3, "2third": 2 * rows // 3}[spec]


def probe(holder) -> dict:
    """What each PLE module computes."""
    import torch
    from pleio_sglang.plugin import module_row_ids  # the module's own hash, outside a batch
    from sglang.srt.models import qwen4_exp as q

    out = {}
    for name, mod in holder.named_modules():
        if not isinstance(mod, q.Qwen4ExpNGramEmbedding):
            continue
        emb = mod.ngram_embedding
        vocab, eos = int(mod.unigram_vocab_size), int(mod.eos_token_id)
        g = torch.Generator().manual_seed(5)
        a = torch.randint(0, vocab, (25,), generator=g).tolist()
        b = torch.randint(0, vocab, (15,), generator=g).tolist()
        a[7] = eos
        ids = torch.cat([module_row_ids(mod, a), module_row_ids(mod, b)])
        res = {"ids": ids.clone(), "rows": int(emb.org_vocab_size), "class": type(emb).__name__,
               "storage_bytes": emb.weight.untyped_storage().nbytes(), "weight_scale": emb.weight_scale.clone()}
        with torch.no_grad():
            if isinstance(emb, q.Qwen4ExpPinnedHostEmbedding):
                res["gather"] = emb.gather(ids).clone()
                dst = torch.full((*ids.shape, emb.embedding_dim), 7.0, dtype=torch.bfloat16)
                emb.gather(ids, out=dst)
                res["gather out="] = dst
                res["scaled"] = mod._embed_ngram_ids(ids, None, ids.shape[0]).clone()
                full, saved = emb.weight, emb.shard_indices
                rows = int(emb.org_vocab_size)
                for lo_s, hi_s in RANGES:
                    lo, hi = _range(lo_s, rows), _range(hi_s, rows)
                    emb.shard_indices = rank_range(saved, lo, hi)
                    if getattr(emb, "_pleio", None) is None:
                        # The stock table of this rank: rows [lo, hi) of the whole one.
                        emb.weight = torch.nn.Parameter(full.data[lo:hi], requires_grad=False)
                    try:
                        res[f"range {lo}-{hi}"] = emb.gather(ids).clone()
                    finally:
                        emb.weight, emb.shard_indices = full, saved
            else:
                res["device lookup"] = emb(ids).clone()
                res["scaled"] = mod._embed_ngram_ids(ids, None, ids.shape[0]).clone()
        out[name] = res
    return out


def child(a) -> int:
    import torch

    init_sglang()
    if a.plugin:
        from sglang.srt.plugins import load_plugins

        load_plugins()  # SGLang's own plugin loader: finds pleio-sglang's entry point
    if a.errors:
        return child_errors(a)
    from pleio_sglang.plugin import skipped_shards

    res = {}
    for model in a.model:
        if a.serve_self:
            os.environ["PLEIO_SGLANG_PATH"] = model  # each model's table from its own checkpoint
        t0 = time.time()
        holder, _ = build(model, a.offload, a.table_dir)
        res[model] = probe(holder)
        res[model]["_meta"] = {"build_seconds": time.time() - t0}
        del holder
    res["_meta"] = {"rss": cl.peak_rss_kib(), "skipped_shards": skipped_shards()}
    torch.save(res, a.out)
    return 0


def child_errors(a) -> int:
    """Builds and loads ``a.model[0]`` with each configuration (environment)
    of the JSON list ``a.errors`` in turn; writes the error each raised."""
    got = []
    for env in json.loads(a.errors):
        for k in ("PLEIO_SGLANG_PATH", "PLEIO_SGLANG_STRATEGY", "PLEIO_SGLANG_BUDGET"):
            os.environ.pop(k, None)
        os.environ.update(env)
        try:
            build(a.model[0], a.offload, a.table_dir)
            got.append(None)
        except Exception as e:  # noqa: BLE001 - what is raised is the result
            got.append(f"{type(e).__name__}: {e}")
    with open(a.out, "w") as f:
        json.dump(got, f)
    return 0


# --------------------------------------------------------------- the parent


def run_child(models: list[str], out: str, work: str, *, plugin: str | None = None, offload: bool = True,
              errors: list | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, os.path.abspath(__file__), "child", "--out", out,
           "--table-dir", os.path.join(work, "ple-files")]
    for m in models:
        cmd += ["--model", m]
    env = dict(os.environ)
    for k in ("PLEIO_SGLANG_PATH", "PLEIO_SGLANG_STRATEGY", "PLEIO_SGLANG_BUDGET"):
        env.pop(k, None)
    if plugin is not None or errors is not None:
        cmd.append("--plugin")
    if plugin == "self":
        cmd.append("--serve-self")
    elif plugin is not None:
        env["PLEIO_SGLANG_PATH"] = plugin
    if offload:
        cmd.append("--offload")
    if errors is not None:
        cmd += ["--errors", json.dumps(errors)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def compare(name: str, stock: dict, served: dict, device: dict | None) -> None:
    layers = [k for k in stock if not k.startswith("_")]
    record(f"{name}: the same PLE modules", layers == [k for k in served if not k.startswith("_")] and len(layers) > 0,
           ", ".join(layers))
    for layer in layers:
        s, p = stock[layer], served[layer]
        record(f"{name}: row ids (the module's hash)", same(s["ids"], p["ids"]), f"{tuple(s['ids'].shape)} int64 ids")
        nonzero = bool(bits(s["gather"]).ne(0).any())
        record(f"{name}: gather (stock: SGLang's Triton kernel, interpreted)", same(s["gather"], p["gather"]) and nonzero,
               f"{tuple(s['gather'].shape)} {s['gather'].dtype}")
        record(f"{name}: gather into out=", same(s["gather out="], p["gather out="]))
        record(f"{name}: lookup with the scale applied after", same(s["scaled"], p["scaled"]),
               f"weight_scale {s['weight_scale'].item()!r} ({s['weight_scale'].dtype})")
        record(f"{name}: the same weight_scale loaded", same(s["weight_scale"], p["weight_scale"]))
        for key in [k for k in s if k.startswith("range ")]:
            zeros = int(bits(s[key]).reshape(-1, s[key].shape[-1]).eq(0).all(-1).sum())
            record(f"{name}: gather, rank {key}", same(s[key], p[key]) and 0 < zeros < s[key].shape[0] * s[key].shape[1],
                   f"{zeros} zero rows")
        if device is not None:
            d = device[layer]
            record(f"{name}: the stock device table (no offload) gives the same rows",
                   same(d["device lookup"], s["gather"]) and same(d["scaled"], s["scaled"]))
        table = s["rows"] * s["gather"].shape[-1] * (1 if "FP8" in name else 2)
        record(f"{name}: the table is never allocated",
               s["storage_bytes"] >= table and p["storage_bytes"] <= s["gather"].shape[-1] * 2,
               f"weight storage stock {s['storage_bytes']} B ({s['class']}), pleio {p['storage_bytes']} B ({p['class']})")


def expect_errors(model: str, cases: list[tuple[str, dict, str]], work: str) -> None:
    out = os.path.join(work, "errors.json")
    done = run_child([model], out, work, errors=[c for _, c, _ in cases])
    if done.returncode != 0:
        record(f"bad configuration at engine start ({os.path.basename(model)})", False, done.stderr.strip()[-600:])
        return
    with open(out) as f:
        got = json.load(f)
    for (name, _, want), err in zip(cases, got):
        ok = err is not None and want in err and "pleio" in err
        record(f"bad configuration at engine start: {name}", ok, (err or "no error")[-300:])


def config_checks() -> None:
    from pleio_sglang.plugin import ConfigError, Settings, settings_from

    env = {"PLEIO_SGLANG_PATH": "/env", "PLEIO_SGLANG_STRATEGY": "pread", "PLEIO_SGLANG_BUDGET": "64M"}
    record("configuration: inert without PLEIO_SGLANG_PATH", settings_from({}) is None)
    record("configuration: the environment", settings_from(env) == Settings("/env", "pread", 64 << 20))
    for name, bad in (("an unknown strategy", {"PLEIO_SGLANG_STRATEGY": "fastest"}),
                      ("budget 0", {"PLEIO_SGLANG_BUDGET": "0"}), ("budget 12Q", {"PLEIO_SGLANG_BUDGET": "12Q"})):
        try:
            settings_from({**env, **bad})
            record(f"configuration refused: {name}", False, "accepted")
        except ConfigError as e:
            record(f"configuration refused: {name}", str(e).startswith("pleio:"), str(e))


def scale_shape_1(path: str) -> None:
    """The FP8 checkpoint's ``weight_scale`` tensors of shape [] as [1]:
    SGLang 0.5.23's loader accepts only its buffer's shape (1,)."""
    import torch
    from safetensors.torch import load_file, save_file

    f = os.path.join(path, "model.safetensors")
    sd = load_file(f)
    for k, v in sd.items():
        if k.endswith("ngram_embedding.weight_scale") and v.dim() == 0:
            sd[k] = v.reshape(1)
    save_file(sd, f, metadata={"format": "pt"})
    del torch


def double_scale(src: str, dst: str) -> None:
    """``src`` with every ``weight_scale`` doubled (the same FP8 bytes)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    f = os.path.join(dst, "model.safetensors")
    sd = load_file(f)
    for k in [k for k in sd if k.endswith("ngram_embedding.weight_scale")]:
        sd[k] = sd[k] * 2
    save_file(sd, f, metadata={"format": "pt"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("child")
    c.add_argument("--model", action="append", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--table-dir", required=True)
    c.add_argument("--plugin", action="store_true", help="load SGLang's plugins (pleio-sglang among them)")
    c.add_argument("--offload", action="store_true", help="the host-table class (file backend)")
    c.add_argument("--errors", help="a JSON list of environments that must fail")
    c.add_argument("--serve-self", action="store_true", help="PLEIO_SGLANG_PATH: each model's own checkpoint")
    ap.add_argument("--work")
    ap.add_argument("--json")
    ap.add_argument("--rss", action="store_true")
    a = ap.parse_args()
    if a.cmd == "child":
        return child(a)

    import sglang
    import torch

    import pleio

    print(f"sglang {sglang.__version__}, torch {torch.__version__}, pleio {pleio.__version__}", flush=True)
    work, tmp = cl.work_dir(a.work, "pleio-sglang-")
    t0 = time.time()
    config_checks()
    tf = cl.tf_helpers()
    report: dict = {"sglang": sglang.__version__, "torch": torch.__version__}

    models = cl.write_models(tf, work, post=scale_shape_1, ple_layer_ids=(1, 2))
    bf16 = models["BF16"]
    paths = list(models.values())
    outs = {}
    for mode, kw in (("stock", {}), ("stock, no offload", {"offload": False}), ("pleio", {"plugin": "self"})):
        out = os.path.join(work, "out.pt")
        done = run_child(paths, out, work, **kw)
        if done.returncode == 0:
            outs[mode] = torch.load(out, weights_only=False)
        record(f"SGLang module build and load, {mode}", done.returncode == 0, done.stderr.strip()[-800:]
               if done.returncode else "")
        if os.path.exists(out):
            os.remove(out)
    if len(outs) == 3:
        for name, p in models.items():
            compare(name, outs["stock"][p], outs["pleio"][p], outs["stock, no offload"][p])
        record("the shards are skipped unread by the safetensors iterator",
               outs["pleio"]["_meta"]["skipped_shards"] > 0 and outs["stock"]["_meta"]["skipped_shards"] == 0,
               f"{outs['pleio']['_meta']['skipped_shards']} shard tensors of the three models")

    other = os.path.join(work, "other-geometry")
    cl.write_model(tf, other, seed=2, base=3001, ple_layer_ids=(1, 2))
    reseeded = os.path.join(work, "other-hash-seed")
    cl.write_model(tf, reseeded, seed=1, hash_seed=99, ple_layer_ids=(1, 2))
    one_layer = os.path.join(work, "one-ple-layer")
    cl.write_model(tf, one_layer, seed=1, ple_layer_ids=(1,))
    expect_errors(bf16, [
        ("a wrong path", {"PLEIO_SGLANG_PATH": os.path.join(work, "missing")}, "cannot open the PLE table"),
        ("a table of another geometry", {"PLEIO_SGLANG_PATH": other}, "does not match the model"),
        ("a table of another hash seed (same geometry)", {"PLEIO_SGLANG_PATH": reseeded}, "row ids differ"),
        ("a checkpoint without the model's second PLE layer", {"PLEIO_SGLANG_PATH": one_layer}, "PLE layer index 1"),
        ("an FP8 table for a bf16 model", {"PLEIO_SGLANG_PATH": models["FP8, bf16 scale"]}, "is bf16"),
        ("an unknown strategy", {"PLEIO_SGLANG_PATH": bf16, "PLEIO_SGLANG_STRATEGY": "fastest"}, "unknown strategy"),
        ("a bad budget", {"PLEIO_SGLANG_PATH": bf16, "PLEIO_SGLANG_BUDGET": "lots"}, "budget"),
    ], work)
    # SGLang rounds the scale to bf16, so the f32-scale table is not "another scale" for it:
    # the same FP8 table with its scale doubled is.
    doubled = os.path.join(work, "FP8-doubled-scale")
    double_scale(models["FP8, bf16 scale"], doubled)
    expect_errors(models["FP8, bf16 scale"], [
        ("a bf16 table for an FP8 model", {"PLEIO_SGLANG_PATH": bf16}, "FP8"),
        ("an FP8 table with another scale", {"PLEIO_SGLANG_PATH": doubled}, "is not the scale"),
    ], work)

    if a.rss:
        report["rss"] = peak_rss(tf, work)
    status = cl.finish(report, a.json, "SGLang check", t0)
    if tmp is not None:
        tmp.cleanup()
    return status


def peak_rss(tf, work: str) -> dict:
    """Peak RSS (VmHWM) of the build and load, stock (the file-backed host
    table) and with the plugin, on a model whose bf16 table is over 1 GiB,
    the checkpoint evicted before each run."""
    import torch

    def run(mode: str, path: str):
        res = os.path.join(work, f"rss-{mode}.pt")
        done = run_child([path], res, work, plugin=None if mode == "stock" else path)
        files = os.path.join(work, "ple-files")
        for f in os.listdir(files) if os.path.isdir(files) else ():
            os.remove(os.path.join(files, f))  # stock's file-backed table
        if done.returncode != 0:
            return done.stderr.strip()
        got = torch.load(res, weights_only=False)["_meta"]
        os.remove(res)
        return got

    return cl.rss_compare(tf, work, "the SGLang module build and load on CPU", run)


if __name__ == "__main__":
    sys.exit(main())
