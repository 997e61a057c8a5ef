#!/usr/bin/env python3
"""The transformers proof of the torch door: tiny seeded Qwen4ExpForCausalLM
models written by transformers' own save_pretrained, run by stock
transformers and with their PLE tables served by pleio (``install`` into a
loaded model, and ``from_pretrained`` that never allocates them), logits
compared bit for bit over a prefill and 16 greedy decode steps, batch 2,
with an EOS inside a prompt.

    integrations/transformers/check.py --pleio PATH/TO/pleio [--work DIR] [--json OUT] [--rss]

Cases (each a PASS or FAIL line, then "N passed, M failed"):
- bf16, one PLE layer, rows a multiple of the parts;
- bf16, two PLE layers ([1, 3]: layers[0] and layers[2]), rows not a
  multiple of the parts (transformers writes ceil-sized shards), and the
  same table re-split mlx-vlm's way (the first rows % parts shards one
  row longer);
- FP8 with a bf16 scale and with an f32 scale (the table converted from the
  bf16 model's), against stock transformers given the engine's own
  dequantization of those bytes: exact (``f32(e4m3) * f32(scale)`` rounded
  once) and vLLM's (``e4m3.to(bf16) * scale.to(bf16)``), which must differ;
- row ids at the released geometry (320M rows, 128 shards) on a sparse
  table, pleio's against transformers' own n-gram module, for PLE layer
  index 0 and 1;
- with --rss: peak RSS of stock from_pretrained against pleio's, on a model
  whose table is about 1.3 GB (printed, and put in --json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen4ExpForCausalLM, Qwen4ExpTextConfig

import pleio
import pleio.torch as pt

EOS = 5
RESULTS: list[tuple[str, bool, str]] = []


def record(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def tiny_config(ple_layer_ids=(1,), parts=4, base=4001, layers=4, layer_types=None, **extra) -> Qwen4ExpTextConfig:
    return Qwen4ExpTextConfig(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        hc_count=2,
        hc_lowrank=8,
        ple_layer_ids=list(ple_layer_ids),
        ple_embed_dim=2560,
        ngram_vocab_size_base=base,
        split_ngram_parts=parts,
        # Linear attention, then one indexed-attention layer (a cache of
        # linear-attention layers only cannot generate).
        layer_types=layer_types or ["linear_attention"] * (layers - 1) + ["indexed_attention"],
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=32,
        indexer_budget=16,
        indexer_compress_ratio=4,
        eos_token_id=EOS,
        architectures=["Qwen4ExpForCausalLM"],
        **extra,
    )


def write_model(path: str, cfg: Qwen4ExpTextConfig, seed: int) -> None:
    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM(cfg).to(torch.bfloat16)
    # Table rows of realistic spread (the default init is N(0, 0.02)).
    with torch.no_grad():
        for m in pt.ple_modules(model):
            m.ngram_embedding.weight.normal_(0.0, 0.5)
    model.save_pretrained(path)


def prompts() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(6, 1024, (2, 24), generator=g)
    ids[0, 9] = EOS  # an EOS inside a prompt resets the n-gram history
    return ids


def run(model) -> list[torch.Tensor]:
    """Prefill logits, then 16 greedy steps' logits and the tokens."""
    ids = prompts()
    with torch.no_grad():
        prefill = model(ids).logits
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=16,
            min_new_tokens=16,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    return [prefill, *out.logits, out.sequences]


def bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


def identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[bool, str]:
    if len(a) != len(b):
        return False, f"{len(a)} outputs against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or not torch.equal(bits(x), bits(y)):
            diff = (x.float() - y.float()).abs().max().item() if x.shape == y.shape else "shape"
            return False, f"output {i} differs (max abs diff {diff})"
    return True, f"{len(a) - 2} decode steps + prefill, bit-identical"


def load(path: str, **kw):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kw)


def stock_tables(model) -> list:
    return [m.ngram_embedding for m in pt.ple_modules(model)]


def check_model(name: str, path: str, open_kwargs: dict, ref: list[torch.Tensor], stock_path: str | None = None):
    """``install`` into a stock-loaded model, and ``from_pretrained``, each
    against ``ref``; an exception is a FAIL of the case, and the run goes on."""
    try:
        _check_model(name, path, open_kwargs, ref, stock_path)
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        record(f"{name}", False, f"{type(e).__name__}: {e}")


def _check_model(name, path, open_kwargs, ref, stock_path):
    base = load(stock_path or path)
    n = pt.install(base, path, **open_kwargs)
    ok, detail = identical(run(base), ref)
    layers = len(pt.ple_modules(base))
    record(f"{name}: install ({n} of {layers} PLE tables)", ok and n == layers and n > 0, detail)
    leftover = [type(e).__name__ for e in stock_tables(base) if not isinstance(e, pt.PleEmbedding)]
    record(f"{name}: install frees the stock tables", not leftover, ", ".join(leftover))
    del base
    model = pt.from_pretrained(path, pleio_options=open_kwargs, dtype=torch.bfloat16)
    ok, detail = identical(run(model), ref)
    embs = stock_tables(model)
    served = all(isinstance(e, pt.PleEmbedding) for e in embs) and len(embs) == layers
    dtypes = {str(e.weight.dtype) for e in embs}
    record(f"{name}: from_pretrained", ok and served and dtypes == {"torch.bfloat16"}, f"{detail}; {dtypes}")


def table_keys(sd: dict) -> dict[str, list[str]]:
    """Prefix -> its shard weight names, in shard order."""
    out: dict[str, list[str]] = {}
    for k in sd:
        if ".ngram_embedding.shard_" in k and k.endswith(".weight"):
            prefix = k[: k.index("ngram_embedding.shard_")]
            out.setdefault(prefix, []).append(k)
    for v in out.values():
        v.sort(key=lambda k: int(k.rsplit("shard_", 1)[1].split(".")[0]))
    return out


def resplit_divmod(src: str, dst: str) -> None:
    """``src``'s tables re-split the mlx-vlm way (first rows % parts shards
    one row longer)."""
    os.makedirs(dst, exist_ok=True)
    sd = load_file(os.path.join(src, "model.safetensors"))
    for prefix, names in table_keys(sd).items():
        whole = torch.cat([sd.pop(k) for k in names])
        parts = len(names)
        q, r = divmod(whole.shape[0], parts)
        start = 0
        for i in range(parts):
            n = q + (1 if i < r else 0)
            sd[f"{prefix}ngram_embedding.shard_{i}.weight"] = whole[start : start + n].clone()
            start += n
    save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    for f in ("config.json", "generation_config.json"):
        with open(os.path.join(src, f)) as i, open(os.path.join(dst, f), "w") as o:
            o.write(i.read())


def to_fp8(src: str, dst: str, scale_dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``src`` with every PLE table as FP8 E4M3 and one ``weight_scale`` of
    ``scale_dtype`` per table; returns prefix -> (whole FP8 table, scale)."""
    os.makedirs(dst, exist_ok=True)
    sd = load_file(os.path.join(src, "model.safetensors"))
    tables = {}
    for prefix, names in table_keys(sd).items():
        whole = torch.cat([sd[k] for k in names]).float()
        amax = whole.abs().max().item()
        # A scale that is not a short binary fraction: bf16 and f32 differ.
        scale = torch.tensor(amax / 448.0 * 1.0123457, dtype=torch.float32).to(scale_dtype)
        q = (whole / scale.float()).to(torch.float8_e4m3fn)
        start = 0
        for k in names:
            n = sd[k].shape[0]
            sd[k] = q[start : start + n].clone()
            start += n
        sd[f"{prefix}ngram_embedding.weight_scale"] = scale.clone()
        tables[prefix] = (q, scale)
    save_converted(src, dst, sd, "float8_e4m3fn")
    return tables


def save_converted(src: str, dst: str, sd: dict, ple_embedding_dtype: str) -> None:
    """Writes ``sd`` as ``dst``'s weights, with ``src``'s configs and
    ``ple_embedding_dtype`` set in ``dst``'s config.json."""
    save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["ple_embedding_dtype"] = ple_embedding_dtype
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(src, "generation_config.json")) as i, open(os.path.join(dst, "generation_config.json"), "w") as o:
        o.write(i.read())


def reference_with_tables(bf16_path: str, tables: dict, rule: str) -> list[torch.Tensor]:
    """Stock transformers (the bf16 model's other weights) with each PLE
    table set to the engine's own dequantization of the FP8 bytes."""
    model = load(bf16_path)
    for m in pt.ple_modules(model):
        prefix = next(p for p in tables if p.startswith(f"model.layers.{m.layer_idx}."))
        q, scale = tables[prefix]
        if rule == "vllm":
            w = q.to(torch.bfloat16) * scale.to(torch.bfloat16)
        else:
            w = (q.float() * scale.float()).to(torch.bfloat16)
        with torch.no_grad():
            m.ngram_embedding.weight.copy_(w)
    return run(model)


def released_ids(work: str, pleio_bin: str) -> None:
    """Row ids at the released geometry (a sparse full-size checkpoint
    written by ``pleio synth``) against transformers' own module."""
    from transformers.models.qwen4_exp import modeling_qwen4_exp as modeling

    for ple_layers in ("2", "2,4"):
        ckpt = os.path.join(work, f"released-{ple_layers.replace(',', '-')}")
        cmd = [pleio_bin, "synth", "--format", "safetensors", "--encoding", "fp8", "--rows", "full", "--sparse",
               "--ple-layers", ple_layers, "-o", ckpt]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            record(f"released geometry, ple_layer_ids [{ple_layers}]: pleio synth", False, done.stderr.strip()[-400:])
            continue
        cfg = transformers.AutoConfig.from_pretrained(ckpt)
        text = getattr(cfg, "text_config", cfg)
        g = torch.Generator().manual_seed(11)
        toks = torch.randint(0, text.vocab_size, (1, 3000), generator=g)
        toks[0, ::97] = text.eos_token_id if isinstance(text.eos_token_id, int) else text.eos_token_id[0]
        for index, layer_id in enumerate(text.ple_layer_ids):
            layer = layer_id - 1
            real = torch.nn.Embedding
            torch.nn.Embedding = lambda *a, **k: real(*a, **{**k, "device": "meta"})
            try:
                module = modeling.Qwen4ExpTextNGramEmbedding(text, text.ple_embed_dim, layer, index)
            finally:
                torch.nn.Embedding = real
            cap = pt._Capture(module.ngram_embedding.embedding_dim)
            rows = module.ngram_embedding.num_embeddings
            module.ngram_embedding = cap
            with torch.no_grad():
                module(toks, None)
            want = cap.ids.reshape(toks.shape[1], -1)
            t = pleio.open(ckpt, layer=layer)
            got = torch.from_numpy(pleio.row_ids(t, toks[0].numpy()))
            ok = t.rows == rows and got.shape == want.shape and torch.equal(got, want)
            record(
                f"released geometry, ple_layer_ids [{ple_layers}], layers[{layer}]: row ids equal transformers'",
                ok,
                f"{want.numel():,} ids, table {t.rows:,} rows (transformers {rows:,})",
            )


RSS_CHILD = r"""
import glob, json, os, sys, time, torch
path, mode = sys.argv[1], sys.argv[2]
# Both runs start with the checkpoint evicted from the page cache.
for f in glob.glob(os.path.join(path, "*.safetensors")):
    fd = os.open(f, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
t0 = time.time()
if mode == "stock":
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
else:
    import pleio.torch as pt
    m = pt.from_pretrained(path, dtype=torch.bfloat16)
ids = torch.randint(6, 1024, (1, 64))
with torch.no_grad():
    m(ids)
# VmHWM, not ru_maxrss: the latter survives exec (it would be the parent's).
st = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/self/status") if ":" in l and l.split()[1:2] and l.split()[1].isdigit()}
print(json.dumps({"peak_rss_kib": st["VmHWM"], "rss_anon_kib": st["RssAnon"], "rss_file_kib": st["RssFile"],
                  "seconds": time.time() - t0}))
"""


def peak_rss(work: str) -> dict:
    path = os.path.join(work, "rss-model")
    cfg = tiny_config(base=250_000, parts=8)
    write_model(path, cfg, seed=3)
    table_bytes = sum(
        os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors")
    )
    out = {"checkpoint_bytes": table_bytes}
    for mode in ("stock", "pleio"):
        done = subprocess.run([sys.executable, "-c", RSS_CHILD, path, mode], capture_output=True, text=True)
        if done.returncode != 0:
            record(f"peak RSS, {mode}", False, done.stderr.strip()[-400:])
            return out
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    saved = (out["stock"]["peak_rss_kib"] - out["pleio"]["peak_rss_kib"]) * 1024
    rows = pleio.open(path).rows
    table = rows * 160 * 2
    out["table_bytes"] = table
    record(
        "peak RSS of from_pretrained: pleio against stock",
        saved >= 0.8 * table,
        f"peak RSS stock {out['stock']['peak_rss_kib'] / 1024:.0f} MiB, pleio {out['pleio']['peak_rss_kib'] / 1024:.0f} MiB "
        f"(anonymous {out['stock']['rss_anon_kib'] / 1024:.0f} / {out['pleio']['rss_anon_kib'] / 1024:.0f} MiB; "
        f"table {table / 2**20:.0f} MiB)",
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pleio", required=True, help="the pleio CLI (for synth)")
    ap.add_argument("--work", help="directory for the models (default: a temporary one)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--rss", action="store_true", help="also measure peak RSS on a 1.3 GB table")
    a = ap.parse_args()
    torch.set_num_threads(2)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, pleio {pleio.__version__}", flush=True)
    tmp = None
    work = a.work
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="pleio-tf-")
        work = tmp.name
    os.makedirs(work, exist_ok=True)
    report: dict = {"transformers": transformers.__version__, "torch": torch.__version__}
    t0 = time.time()

    one = os.path.join(work, "bf16-one-layer")
    write_model(one, tiny_config(ple_layer_ids=(1,), parts=4), seed=1)
    ref = run(load(one))
    check_model("bf16, 1 PLE layer", one, {}, ref)
    check_model("bf16, 1 PLE layer, strategy cached", one, {"strategy": "cached"}, ref)

    two = os.path.join(work, "bf16-two-layers")
    write_model(two, tiny_config(ple_layer_ids=(1, 3), parts=5), seed=2)
    ref2 = run(load(two))
    check_model("bf16, PLE layers [1, 3], ceil shards", two, {}, ref2)
    dm = os.path.join(work, "bf16-two-layers-divmod")
    resplit_divmod(two, dm)
    check_model("bf16, PLE layers [1, 3], divmod shards", dm, {}, ref2)

    for sdt in (torch.bfloat16, torch.float32):
        name = "bf16" if sdt == torch.bfloat16 else "f32"
        fp8 = os.path.join(work, f"fp8-{name}-scale")
        tables = to_fp8(two, fp8, sdt)
        refs = {rule: reference_with_tables(two, tables, rule) for rule in ("exact", "vllm")}
        differ = not identical(refs["exact"], refs["vllm"])[0]
        if sdt == torch.float32:
            record(f"FP8 {name} scale: the exact and vLLM rules give different logits", differ)
        for rule in ("exact", "vllm"):
            check_model(f"FP8 {name} scale, rounding {rule}", fp8, {"rounding": rule}, refs[rule], stock_path=two)

    released_ids(work, a.pleio)
    if a.rss:
        report["rss"] = peak_rss(work)
    report["seconds"] = round(time.time() - t0, 1)
    passed = sum(ok for _, ok, _ in RESULTS)
    failed = len(RESULTS) - passed
    report["results"] = [{"check": n, "ok": ok, "detail": d} for n, ok, d in RESULTS]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    print(f"{passed} passed, {failed} failed")
    if tmp is not None:
        tmp.cleanup()
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
