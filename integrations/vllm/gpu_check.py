#!/usr/bin/env python3
"""The GPU proof of the pleio vLLM plugin, for a machine with a CUDA GPU
(not yet run: the project has had none). vLLM's default engram config
(``cpu_offload=True``) builds ``Qwen4ExpPLEPinnedHostEmbedding``; stock, its
``_lookup`` is a Triton kernel reading the pinned table through UVA; with the
plugin it is D2H ids, a host-node gather into pinned staging and H2D rows on
the prefetch stream.

    integrations/vllm/gpu_check.py [--work DIR]

Per model (BF16, FP8 with bf16 and f32 scales), stock and with the plugin,
each engine in its own process:
- ``compute_ngram_ids`` on CUDA (the Triton path), bit for bit;
- ``_lookup`` on CUDA, on a side stream, for the full range and rank ranges
  set on the module (stock: the table of that rank);
- ``_lookup`` captured into a CUDA graph (``torch.cuda.graph``) and replayed
  with new ids copied into the captured input, bit for bit with stock;
- greedy generation with CUDA graphs on (no ``enforce_eager``): tokens and
  logprobs equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check as cpu  # noqa: E402


def gpu_probe(model):
    import torch
    from vllm.models.qwen4_exp.nvidia.ngram_embedding import Qwen4ExpNGramEmbedding

    out = {}
    for name, mod in [(n, m) for n, m in model.named_modules() if isinstance(m, Qwen4ExpNGramEmbedding)]:
        emb = mod.ngram_embedding
        dev = mod.layer_multipliers.device
        vocab, eos = int(mod.unigram_vocab_size), int(mod.eos_token_id)
        g = torch.Generator().manual_seed(5)
        toks = torch.randint(0, vocab, (40,), generator=g)
        toks[7] = eos
        qsl = torch.tensor([0, 25, 40], dtype=torch.int32)
        ctx = torch.tensor([[eos, eos], [int(toks[3]), int(toks[9])]], dtype=torch.long)[:, : mod.ngram_size - 1]
        res = {"served": getattr(emb, "_pleio", None) is not None}
        with torch.no_grad():
            ids = mod.compute_ngram_ids(toks.to(dev), qsl.to(dev), ctx.to(dev))
            res["ids"] = ids.cpu()
            side = torch.cuda.Stream()
            rows = int(emb.org_vocab_size)
            saved = emb.shard_indices
            full = emb.weight.data
            for lo_s, hi_s in cpu.RANGES:
                lo, hi = cpu._range(lo_s, rows), cpu._range(hi_s, rows)
                emb.shard_indices = cpu.rank_range(saved, lo, hi)
                if not res["served"]:
                    emb.weight.data = full[lo:hi]
                    emb._uva_weight = _uva(emb.weight)
                try:
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        o = emb._lookup(ids)
                    torch.cuda.current_stream().wait_stream(side)
                    res[f"range {lo}-{hi}"] = o.cpu()
                finally:
                    emb.weight.data = full
                    emb._uva_weight = _uva(emb.weight) if not res["served"] else emb._uva_weight
                    emb.shard_indices = saved
            # CUDA graph capture, then replay with other ids.
            static_ids = ids.clone()
            static_out = torch.empty((*ids.shape, emb.embedding_dim), dtype=emb.embedding_method.lookup_dtype(emb),
                                     device=dev)
            emb._lookup(static_ids, static_out)  # warm-up: staging allocated before capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                emb._lookup(static_ids, static_out)
            replays = []
            for seed in (6, 7):
                g = torch.Generator().manual_seed(seed)
                t2 = torch.randint(0, vocab, (40,), generator=g).to(dev)
                static_ids.copy_(mod.compute_ngram_ids(t2, qsl.to(dev), ctx.to(dev)))
                graph.replay()
                torch.cuda.synchronize()
                replays.append((static_ids.cpu(), static_out.cpu()))
            res["graph"] = replays
        out[name] = res
    return out


def _uva(t):
    from vllm.utils.torch_utils import get_accelerator_view_from_cpu_tensor

    return get_accelerator_view_from_cpu_tensor(t)


def child(a) -> int:
    import torch
    from vllm import LLM, SamplingParams

    kw = dict(model=a.model, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256, gpu_memory_utilization=0.3)
    if a.config is not None:
        kw["additional_config"] = {"pleio": json.loads(a.config)}
    llm = LLM(**kw)
    res = llm.apply_model(gpu_probe)[0]
    g = torch.Generator().manual_seed(9)
    prompts = [{"prompt_token_ids": torch.randint(6, 1024, (24,), generator=g).tolist()} for _ in range(2)]
    prompts[0]["prompt_token_ids"][9] = cpu.tf_helpers().EOS
    sp = SamplingParams(temperature=0, max_tokens=16, min_tokens=16, logprobs=1, detokenize=False)
    gen = llm.generate(prompts, sp)
    res["_generate"] = [
        (list(o.outputs[0].token_ids), [[(k, v.logprob) for k, v in d.items()] for d in o.outputs[0].logprobs])
        for o in gen
    ]
    torch.save(res, a.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("child")
    c.add_argument("--model", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--config")
    ap.add_argument("--work")
    a = ap.parse_args()
    if a.cmd == "child":
        return child(a)
    import torch

    if not torch.cuda.is_available():
        print("vLLM GPU check: SKIPPED (no CUDA device)")
        return 0
    work = a.work or tempfile.mkdtemp(prefix="pleio-vllm-gpu-")
    tf = cpu.tf_helpers()
    bf16 = os.path.join(work, "bf16")
    # One indexed-attention layer: generation needs one on GPU.
    cfg = tf.tiny_config(ple_layer_ids=(1,), parts=4, layers=4)
    tf.write_model(bf16, cfg, seed=1)
    models = {"BF16": bf16}
    for sdt, name in ((torch.bfloat16, "FP8, bf16 scale"), (torch.float32, "FP8, f32 scale")):
        path = os.path.join(work, name.replace(", ", "-").replace(" ", "-"))
        tf.to_fp8(bf16, path, sdt)
        models[name] = path
    for name, path in models.items():
        outs = {}
        for mode, conf in (("stock", None), ("pleio", {"path": path})):
            out = os.path.join(work, f"{mode}.pt")
            cmd = [sys.executable, os.path.abspath(__file__), "child", "--model", path, "--out", out]
            if conf is not None:
                cmd += ["--config", json.dumps(conf)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                cpu.record(f"{name}: vLLM engine on GPU, {mode}", False, done.stderr.strip()[-800:])
                break
            outs[mode] = torch.load(out, weights_only=False)
        if len(outs) != 2:
            continue
        s, p = outs["stock"], outs["pleio"]
        cpu.record(f"{name}: greedy generation, tokens and logprobs", s["_generate"] == p["_generate"])
        for layer in [k for k in s if not k.startswith("_")]:
            sl, pl = s[layer], p[layer]
            cpu.record(f"{name}: {layer} served by pleio", pl["served"] and not sl["served"])
            cpu.record(f"{name}: compute_ngram_ids (CUDA)", cpu.same(sl["ids"], pl["ids"]))
            for key in [k for k in sl if k.startswith("range ")]:
                cpu.record(f"{name}: _lookup on CUDA, {key}", cpu.same(sl[key], pl[key]))
            ok = all(cpu.same(a[0], b[0]) and cpu.same(a[1], b[1]) for a, b in zip(sl["graph"], pl["graph"]))
            cpu.record(f"{name}: _lookup captured in a CUDA graph, 2 replays", ok)
    passed = sum(ok for _, ok, _ in cpu.RESULTS)
    failed = len(cpu.RESULTS) - passed
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
