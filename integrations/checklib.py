"""What the engine checks share (integrations/{vllm,sglang,mlx}/check.py):
PASS/FAIL records and the closing "N passed, M failed" line, bit-for-bit
comparison of tensors, peak RSS of a process, evicting a checkpoint from
the page cache, and the tiny qwen4exp models that transformers writes
(integrations/transformers/check.py's writer).

    sys.path.insert(0, os.path.join(HERE, ".."))
    import checklib as cl
"""

from __future__ import annotations

import importlib.util
import json
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS: list[tuple[str, bool, str]] = []


def record(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def finish(report: dict, json_path: str | None, label: str, t0: float) -> int:
    """Puts the results in ``report`` (written to ``json_path``), prints the
    closing lines; the exit status."""
    report["seconds"] = round(time.time() - t0, 1)
    passed = sum(ok for _, ok, _ in RESULTS)
    failed = len(RESULTS) - passed
    report["results"] = [{"check": n, "ok": ok, "detail": d} for n, ok, d in RESULTS]
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
    print(f"{label}: {report['seconds']} s")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


def peak_rss_kib() -> dict:
    """VmHWM, VmRSS, RssAnon, RssFile of this process, in KiB."""
    st = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                st[k] = int(v.split()[0])
    return st


def evict(path: str) -> None:
    """Drops the page cache of the checkpoint's own .safetensors files."""
    for f in os.listdir(path):
        if f.endswith(".safetensors"):
            fd = os.open(os.path.join(path, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def bits(t):
    """A torch tensor as integers of its width (compare bits, not values)."""
    import torch

    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


def same(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def tf_helpers():
    """integrations/transformers/check.py: how the tiny models are written."""
    spec = importlib.util.spec_from_file_location("tfcheck", os.path.join(HERE, "transformers", "check.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_model(tf, path: str, seed: int, base: int = 4001, parts: int = 4, hash_seed: int | None = None,
                ple_layer_ids=(1,)) -> None:
    """A tiny all-linear-attention model (weights seeded by ``seed``;
    ``hash_seed`` the config's n-gram hash seed, default 1234)."""
    extra = {} if hash_seed is None else {"seed": hash_seed}
    # All linear attention: the engines' indexed attention needs a GPU.
    # (Given to the constructor: transformers 5.17, vLLM 0.31's, refuses a
    # config with "indexed_attention", its name there being "qwen_sparse_attention".)
    cfg = tf.tiny_config(ple_layer_ids=ple_layer_ids, parts=parts, base=base, layers=3,
                         layer_types=["linear_attention"] * 3, **extra)
    cfg.output_gate_type = "silu"  # vLLM reads it; transformers' default (None) means hidden_act, silu
    # vLLM 0.31 checks the indexer's geometry (budget / compress ratio 512 or
    # 2048) even with no indexed layer; nothing else reads it here.
    cfg.indexer_budget = 512 * cfg.indexer_compress_ratio
    tf.write_model(path, cfg, seed=seed)


def work_dir(work: str | None, prefix: str):
    """``work`` (made if missing), or a temporary directory; the second
    value is the TemporaryDirectory to clean up, or None."""
    import tempfile

    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix=prefix)
        work = tmp.name
    os.makedirs(work, exist_ok=True)
    return work, tmp


def write_models(tf, work: str, post=None, **kw) -> dict:
    """The BF16 model (seed 1) and its FP8 conversions, one with a bf16
    scale, one with an f32 scale: name -> path. ``post(path)`` is applied
    to each FP8 checkpoint; ``kw`` goes to :func:`write_model`."""
    import torch

    bf16 = os.path.join(work, "bf16")
    write_model(tf, bf16, seed=1, **kw)
    models = {"BF16": bf16}
    for sdt, name in ((torch.bfloat16, "FP8, bf16 scale"), (torch.float32, "FP8, f32 scale")):
        path = os.path.join(work, name.replace(", ", "-").replace(" ", "-"))
        tf.to_fp8(bf16, path, sdt)
        if post is not None:
            post(path)
        models[name] = path
    return models


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def nvfp4_quantize(whole):
    """NVFP4 of an f32 table ``[rows, D]``: (packed E2M1 ``uint8 [rows,
    D/2]``, low nibble first; E4M3 block scales ``[rows, D/16]``; the
    global scale, amax / (448 * 6), as a float)."""
    import torch

    rows, d = whole.shape
    g = whole.abs().max().item() / (448.0 * 6.0)
    blocks = whole.reshape(rows, d // 16, 16)
    scale = (blocks.abs().amax(-1) / (6.0 * g)).to(torch.float8_e4m3fn)
    denom = (scale.float() * g).unsqueeze(-1)
    x = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, 1.0), 0.0).reshape(rows, d)
    grid = torch.tensor(E2M1)
    mag = (x.abs().unsqueeze(-1) - grid).abs().argmin(-1).to(torch.uint8)
    codes = mag | torch.where(x < 0, 8, 0).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), scale.contiguous(), g


def nvfp4_orders_differ(packed, scale, gs) -> list[int]:
    """For each global scale of ``gs``: how many elements of the table round
    to other bf16 values under vLLM's two NVFP4 decodes, its GPU kernel's
    ``(v * s) * g`` and its CPU ``dequantize_to_dtype``'s ``v * (s * g)``."""
    import torch

    mag = torch.stack((packed & 7, packed >> 4 & 7), -1).reshape(packed.shape[0], -1, 16).long()
    sf = scale.view(torch.uint8).long().unsqueeze(-1).expand(mag.shape)
    count = torch.bincount((sf * 8 + mag).reshape(-1), minlength=256 * 8).reshape(256, 8)
    used = count.nonzero()  # (scale byte, magnitude) pairs present
    s = torch.tensor(used[:, 0].tolist(), dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    v = torch.tensor(E2M1)[used[:, 1]]
    w = count[used[:, 0], used[:, 1]]
    g = torch.tensor(list(gs), dtype=torch.float32)[:, None]
    kernel = ((v * s)[None, :] * g).to(torch.bfloat16).view(torch.int16)
    cpu = (v[None, :] * (s[None, :] * g)).to(torch.bfloat16).view(torch.int16)
    return ((kernel != cpu).long() * w[None, :]).sum(-1).tolist()


def nvfp4_tie_scales(scale, g0: float) -> list[float]:
    """Global scales within 1% of ``g0`` that put ``v * s * g`` (``v`` in
    1.5, 3, 6; ``s`` the table's most used block scales) next to a bf16
    rounding tie, where the two orders of the products can round apart."""
    import numpy as np
    import torch

    used, counts = scale.view(torch.uint8).unique(return_counts=True)
    top = used[counts.argsort(descending=True)[:16]].view(torch.float8_e4m3fn).float().tolist()
    out = []
    for s in top:
        for v in (1.5, 3.0, 6.0):
            x = np.float32(v * s * g0)
            ulp = np.float32(2.0) ** (np.floor(np.log2(x)) - 7)  # bf16's unit in the last place at x
            for m in range(-40, 41):
                tie = (np.floor(x / ulp) + 0.5 + m) * ulp
                base = np.float32(tie / np.float32(v * s))
                for k in range(-3, 4):
                    g = float(np.nextafter(base, np.float32(np.inf if k > 0 else -np.inf)) if k else base)
                    for _ in range(abs(k) - 1):
                        g = float(np.nextafter(np.float32(g), np.float32(np.inf if k > 0 else -np.inf)))
                    if abs(g / g0 - 1.0) <= 1e-2:
                        out.append(g)
    return out or [g0]


def to_nvfp4(src: str, dst: str, nudge: float = 0.0) -> dict:
    """``src`` (a BF16 model) with every PLE table in vLLM's NVFP4 layout:
    ``shard_{i}.weight`` U8, ``shard_{i}.weight_scale`` F8_E4M3, one
    table-level ``ngram_embedding.weight_scale_2`` F32, and
    ``ple_embedding_dtype`` "nvfp4". The global scale is moved (by at most
    1%; the codes stay) to one under which vLLM's CPU and GPU decodes
    differ on many elements, so a lookup shows which one was followed;
    ``nudge`` then scales it by ``1 + nudge``. Returns prefix -> the global
    scale and the count of such elements."""
    import numpy as np
    import torch
    from safetensors.torch import load_file

    tf = tf_helpers()
    os.makedirs(dst, exist_ok=True)
    sd = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for prefix, names in tf.table_keys(sd).items():
        whole = torch.cat([sd[k] for k in names]).float()
        packed, scale, g0 = nvfp4_quantize(whole)
        gs = nvfp4_tie_scales(scale, g0)
        counts = nvfp4_orders_differ(packed, scale, gs)
        g = float(np.float32(gs[int(np.argmax(counts))] * (1.0 + nudge)))
        start = 0
        for k in names:
            n = sd[k].shape[0]
            sd[k] = packed[start : start + n].clone()
            sd[k[: -len("weight")] + "weight_scale"] = scale[start : start + n].clone()
            start += n
        sd[f"{prefix}ngram_embedding.weight_scale_2"] = torch.tensor(g, dtype=torch.float32)
        out[prefix] = {"global_scale": g, "orders_differ": nvfp4_orders_differ(packed, scale, [g])[0]}
    tf.save_converted(src, dst, sd, "nvfp4")
    return out


def rss_compare(tf, work: str, what: str, run) -> dict:
    """Peak RSS (VmHWM), stock against pleio, on a tiny model whose bf16
    table is over 1 GiB (written here), the checkpoint evicted before each
    run. ``run(mode, path)`` runs one side ("stock", "pleio") in a fresh
    process and returns its ``{"rss": peak_rss_kib(), ...}``, or an error
    string. Records whether pleio saves at least 0.8x the table's bytes."""
    import pleio

    path = os.path.join(work, "rss-model")
    write_model(tf, path, seed=3, base=220_000, parts=8)
    t = pleio.open(path)
    table = t.rows * t.row_bytes
    out = {"table_bytes": table}
    for mode in ("stock", "pleio"):
        evict(path)
        got = run(mode, path)
        if isinstance(got, str):
            record(f"peak RSS, {mode}", False, got[-600:])
            return out
        out[mode] = got
    saved = (out["stock"]["rss"]["VmHWM"] - out["pleio"]["rss"]["VmHWM"]) * 1024
    out["saved_bytes"] = saved
    record(
        f"peak RSS of {what}: pleio against stock",
        table >= 2**30 and saved >= 0.8 * table,
        f"stock {out['stock']['rss']['VmHWM'] / 1024:.0f} MiB, pleio {out['pleio']['rss']['VmHWM'] / 1024:.0f} MiB: "
        f"{saved / 2**20:.0f} MiB less, {saved / table:.2f}x the table's {table / 2**20:.0f} MiB",
    )
    return out
