#!/usr/bin/env python3
"""Write a tiny but real qwen4exp or gemma4 GGUF that llama.cpp loads, around a `pleio synth` table.

    python3 write_model.py --llama-src SRC --table t.gguf -o model.gguf [--seed 1]

SRC is the llama.cpp tree of the llama-cpp-python 0.3.36 sdist (build.sh extracts it): its
vendored gguf-py knows the qwen4exp keys and tensors, the PyPI gguf 0.19 does not. The
architecture is the synth file's.

The PLE table `per_layer_token_embd.weight` is copied from the synth file by streaming its
bytes (never held in memory, so a table of several GiB costs only disk), with its metadata.
Everything else is seeded random and small, shaped as llama.cpp's src/models/<arch>.cpp asks.

qwen4exp (table: IQ4_NL rows of 160, the n-gram hash keys `qwen4exp.ple.*` copied as is):
- the embedding width is ple_n_heads * 160 (the flat PLE gather of all heads feeds
  ple_key/ple_value, [n_embd, ...]): 16 heads give 2560;
- two layers: layer 0 linear attention (gated delta net) carrying the PLE module (llama.cpp
  keeps the PLE conv history in the recurrent cache, so the PLE layer must be linear), layer 1
  full attention with the QSA indexer (the hybrid memory needs an attention layer: the PLE
  n-gram history is read from the attention cache's cells);
- hyper-connections (count 2, low rank 8), a 2-expert MoE with a shared expert;
- 248320 dummy tokens (tokenizer "none"): Qwen token ids go in as they are, so the n-gram
  hash sees real ids; the output head is the tied token embedding.

gemma4 (table: [256 * n_layer, vocab] rows, one per token): as many layers as the table's width
holds (synth --layers), n_embd 256, layer 0 sliding-window attention and every other layer full
attention, a dense FFN, the per-layer input gate and projection; vocab = the table's rows.

The output is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

CHUNK = 16 << 20          # bytes per copy step of the table

# qwen4exp
Q_VOCAB = 248320          # Qwen3.5/3.6 vocabulary (ids up to 248319)
Q_LAYERS = 2
Q_PLE_LAYER = 0
Q_FULL_ATTENTION_INTERVAL = 2   # layer 1 is full attention
Q_HC = 2                  # hyper-connection streams (llama.cpp needs > 1)
Q_HC_LOW_RANK = 8
Q_SSM_D_CONV = 4
Q_SSM_D_STATE = 128       # linear-attention head size
Q_SSM_N_GROUP = 2         # key heads
Q_SSM_DT_RANK = 2         # value heads
Q_N_EXPERT = 2
Q_N_EXPERT_USED = 1
Q_N_FF_EXP = 64
Q_N_FF_SHEXP = 64
Q_PLE_CONV_KERNEL = 4
Q_N_HEAD = 2
Q_HEAD_DIM = 64
Q_IDX_HEADS = 1           # QSA indexer
Q_COMPRESS_RATIO = 4

# gemma4
G_EMBD = 256
G_PER_LAYER = 256
G_N_HEAD = 2
G_N_HEAD_KV = 1
G_HEAD_DIM = 128
G_N_FF = 512
G_SWA = 512


def import_gguf(llama_src: Path):
    gguf_py = llama_src / "gguf-py"
    if not (gguf_py / "gguf" / "constants.py").is_file():
        sys.exit(f"write_model.py: no gguf-py in {llama_src}")
    sys.path.insert(0, str(gguf_py))
    import gguf  # noqa: E402  (the vendored one, first on the path)
    if not hasattr(gguf.MODEL_ARCH, "QWEN4EXP"):
        sys.exit(f"write_model.py: {gguf.__file__} does not know qwen4exp")
    return gguf


class Builder:
    """A GGUFWriter plus seeded random tensors: f32/f16 arrays and raw Q4_0 blocks."""

    def __init__(self, gguf, np, path: Path, arch: str, seed: int):
        self.gguf, self.np, self.arch = gguf, np, arch
        self.rng = np.random.default_rng(seed)
        self.w = gguf.GGUFWriter(path, arch)
        self.K = gguf.Keys
        self.MT = gguf.MODEL_TENSOR

    def key(self, k: str) -> str:
        return k.format(arch=self.arch)

    def u32(self, k: str, v: int):
        self.w.add_uint32(self.key(k), v)

    def f32(self, k: str, v: float):
        self.w.add_float32(self.key(k), v)

    def arr(self, k: str, values, sub_type):
        self.w.add_key_value(self.key(k), list(values), self.gguf.GGUFValueType.ARRAY, sub_type=sub_type)

    def basics(self, vocab: int, n_embd: int, n_layer: int, n_ff: int, n_head: int, n_head_kv: int, head_dim: int):
        """The keys every tiny model has: dummy vocabulary (tokenizer "none"), sizes, heads."""
        K = self.K
        self.w.add_name(f"pleio tiny {self.arch}")
        self.w.add_string("tokenizer.ggml.model", "none")
        self.u32(K.LLM.VOCAB_SIZE, vocab)
        self.u32(K.LLM.CONTEXT_LENGTH, 65536)
        self.u32(K.LLM.EMBEDDING_LENGTH, n_embd)
        self.u32(K.LLM.BLOCK_COUNT, n_layer)
        self.u32(K.LLM.FEED_FORWARD_LENGTH, n_ff)
        self.u32(K.Attention.HEAD_COUNT, n_head)
        self.u32(K.Attention.HEAD_COUNT_KV, n_head_kv)
        self.u32(K.Attention.KEY_LENGTH, head_dim)
        self.u32(K.Attention.VALUE_LENGTH, head_dim)

    def name(self, t, bid=None, suffix="weight"):
        base = self.gguf.TENSOR_NAMES[t]
        base = base.format(bid=bid) if bid is not None else base
        return f"{base}.{suffix}" if suffix else base

    # numpy shapes are ggml's ne reversed
    def normal(self, shape, std):
        return self.rng.standard_normal(shape, dtype=self.np.float32) * std

    def add_f32(self, name, arr):
        self.w.add_tensor(name, self.np.asarray(arr, dtype=self.np.float32))

    def add_f16(self, name, arr):
        self.w.add_tensor(name, self.np.asarray(arr, dtype=self.np.float16))

    def add_near_one(self, name, shape):
        self.add_f32(name, 1.0 + self.normal(shape, 0.05))

    def add_q4(self, name, shape, std):
        """Q4_0 blocks (llama.cpp's CPU backend repacks them for its fastest matmuls) whose
        values have about the standard deviation `std`."""
        np = self.np
        *outer, ne0 = shape
        n_blocks = int(np.prod(outer, dtype=np.int64)) * (ne0 // 32)
        # nibble - 8, uniform in [-8, 7], has std 4.6
        d = np.full((n_blocks, 1), std / 4.6, dtype=np.float16).view(np.uint8)
        q = self.rng.integers(0, 256, size=(n_blocks, 16), dtype=np.uint8)
        blocks = np.concatenate([d, q], axis=1).reshape(*outer, (ne0 // 32) * 18)
        self.w.add_tensor(name, blocks, raw_dtype=self.gguf.GGMLQuantizationType.Q4_0)


def inv(fan_in: int) -> float:
    return fan_in ** -0.5


def qwen4exp(b: Builder, fields, width: int) -> str:
    """Metadata and tensors of the tiny qwen4exp around a table of rows of `width`."""
    K, MT, V = b.K, b.MT, b.gguf.GGUFValueType
    ngram = int(fields["qwen4exp.ple.ngram_size"].contents())
    per_gram = int(fields["qwen4exp.ple.heads_per_ngram"].contents())
    n_embd = (ngram - 1) * per_gram * width  # llama.cpp: the flat gather of all heads is n_embd wide
    hc_dim = Q_HC * n_embd

    b.basics(Q_VOCAB, n_embd, Q_LAYERS, Q_N_FF_EXP, Q_N_HEAD, Q_N_HEAD, Q_HEAD_DIM)
    b.u32(K.LLM.EXPERT_FEED_FORWARD_LENGTH, Q_N_FF_EXP)
    b.u32(K.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, Q_N_FF_SHEXP)
    b.u32(K.LLM.EXPERT_COUNT, Q_N_EXPERT)
    b.u32(K.LLM.EXPERT_USED_COUNT, Q_N_EXPERT_USED)
    b.u32(K.LLM.FULL_ATTENTION_INTERVAL, Q_FULL_ATTENTION_INTERVAL)
    b.f32(K.Attention.LAYERNORM_RMS_EPS, 1e-6)
    b.u32(K.Attention.Indexer.HEAD_COUNT, Q_IDX_HEADS)
    b.u32(K.Attention.Indexer.KEY_LENGTH, Q_HEAD_DIM)
    # a budget beyond any context selects every block, as llama.cpp's test-llama-archs does
    b.u32(K.Attention.Indexer.TOP_K, 131072)
    b.arr(K.Attention.COMPRESS_RATIOS, [Q_COMPRESS_RATIO] * Q_LAYERS, V.UINT32)
    b.arr(K.Rope.DIMENSION_SECTIONS, [Q_HEAD_DIM // 4] * 4, V.INT32)
    b.u32(K.SSM.CONV_KERNEL, Q_SSM_D_CONV)
    b.u32(K.SSM.INNER_SIZE, Q_SSM_D_STATE * Q_SSM_DT_RANK)
    b.u32(K.SSM.STATE_SIZE, Q_SSM_D_STATE)
    b.u32(K.SSM.TIME_STEP_RANK, Q_SSM_DT_RANK)
    b.u32(K.SSM.GROUP_COUNT, Q_SSM_N_GROUP)
    b.u32(K.HyperConnection.COUNT, Q_HC)
    b.u32(K.HyperConnection.LOW_RANK, Q_HC_LOW_RANK)
    b.u32(K.LLM.EMBD_LENGTH_PER_LAYER_INP, width)
    # the n-gram hash exactly as the synth table has it (same keys, same value types)
    layers_key = b.key(K.PerLayerEmbedding.LAYERS)
    for key, field in fields.items():
        if key.startswith("qwen4exp.ple.") and key != layers_key:
            vtype = field.types[0]
            if vtype == V.ARRAY:
                b.w.add_key_value(key, [int(v) for v in field.contents()], vtype, sub_type=field.types[-1])
            else:
                b.w.add_key_value(key, int(field.contents()), vtype)
    b.arr(K.PerLayerEmbedding.LAYERS, [Q_PLE_LAYER], V.UINT32)
    b.u32(K.PerLayerEmbedding.CONV_KERNEL, Q_PLE_CONV_KERNEL)

    # token embedding, also the output head (tied): Q4_0 keeps it at 341 MiB
    b.add_q4(b.name(MT.TOKEN_EMBD), (Q_VOCAB, n_embd), 1.0)
    b.add_near_one(b.name(MT.HC_HEAD_NORM), (Q_HC, n_embd))
    b.add_q4(b.name(MT.HC_HEAD_DOWN), (Q_HC_LOW_RANK, hc_dim), inv(hc_dim))
    b.add_f16(b.name(MT.HC_HEAD_UP), b.normal((hc_dim, Q_HC_LOW_RANK), inv(Q_HC_LOW_RANK)))

    key_dim = Q_SSM_D_STATE * Q_SSM_N_GROUP
    value_dim = Q_SSM_D_STATE * Q_SSM_DT_RANK
    conv_dim = 2 * key_dim + value_dim
    for il in range(Q_LAYERS):
        for norm, down, up, inject in (
            (MT.HC_ATTN_NORM, MT.HC_ATTN_DOWN, MT.HC_ATTN_UP, MT.HC_ATTN_INJECT),
            (MT.HC_FFN_NORM, MT.HC_FFN_DOWN, MT.HC_FFN_UP, MT.HC_FFN_INJECT),
        ):
            b.add_near_one(b.name(norm, il), (Q_HC, n_embd))
            b.add_q4(b.name(down, il), (Q_HC_LOW_RANK, hc_dim), inv(hc_dim))
            b.add_f16(b.name(up, il), b.normal((hc_dim, Q_HC_LOW_RANK), inv(Q_HC_LOW_RANK)))
            b.add_q4(b.name(inject, il), (Q_HC, hc_dim), inv(hc_dim))

        if (il + 1) % Q_FULL_ATTENTION_INTERVAL == 0:
            # full attention: attn_q holds [q|gate] per head; the QSA indexer
            q_dim = Q_N_HEAD * Q_HEAD_DIM
            b.add_q4(b.name(MT.ATTN_Q, il), (2 * q_dim, n_embd), inv(n_embd))
            b.add_q4(b.name(MT.ATTN_K, il), (q_dim, n_embd), inv(n_embd))
            b.add_q4(b.name(MT.ATTN_V, il), (q_dim, n_embd), inv(n_embd))
            b.add_q4(b.name(MT.ATTN_OUT, il), (n_embd, q_dim), inv(q_dim))
            b.add_near_one(b.name(MT.ATTN_Q_NORM, il), (Q_HEAD_DIM,))
            b.add_near_one(b.name(MT.ATTN_K_NORM, il), (Q_HEAD_DIM,))
            b.add_q4(b.name(MT.INDEXER_Q_PROJ, il), (Q_IDX_HEADS * Q_HEAD_DIM, n_embd), inv(n_embd))
            b.add_q4(b.name(MT.INDEXER_K_PROJ, il), (Q_HEAD_DIM, n_embd), inv(n_embd))
            b.add_near_one(b.name(MT.INDEXER_Q_NORM, il), (Q_HEAD_DIM,))
            b.add_near_one(b.name(MT.INDEXER_K_NORM, il), (Q_HEAD_DIM,))
        else:
            # linear attention (gated delta net)
            b.add_q4(b.name(MT.ATTN_QKV, il), (conv_dim, n_embd), inv(n_embd))
            b.add_q4(b.name(MT.ATTN_GATE, il), (value_dim, n_embd), inv(n_embd))
            b.add_f32(b.name(MT.SSM_CONV1D, il), b.normal((conv_dim, Q_SSM_D_CONV), 0.3))
            b.add_f32(b.name(MT.SSM_DT, il, "bias"), b.rng.uniform(0.0, 1.0, Q_SSM_DT_RANK))
            b.add_f32(b.name(MT.SSM_A, il, None), -b.rng.uniform(0.5, 2.0, Q_SSM_DT_RANK))
            b.add_f32(b.name(MT.SSM_BETA, il), b.normal((Q_SSM_DT_RANK, n_embd), inv(n_embd)))
            b.add_f32(b.name(MT.SSM_ALPHA, il), b.normal((Q_SSM_DT_RANK, n_embd), inv(n_embd)))
            b.add_near_one(b.name(MT.SSM_NORM, il), (Q_SSM_D_STATE,))
            b.add_q4(b.name(MT.SSM_OUT, il), (n_embd, value_dim), inv(value_dim))

        if il == Q_PLE_LAYER:
            b.add_q4(b.name(MT.PLE_KEY, il), (hc_dim, n_embd), inv(n_embd))
            b.add_q4(b.name(MT.PLE_VALUE, il), (n_embd, n_embd), inv(n_embd))
            for t in (MT.PLE_NORM_KEY, MT.PLE_NORM_QUERY, MT.PLE_NORM_CONV):
                b.add_near_one(b.name(t, il), (Q_HC, n_embd))
            b.add_f32(b.name(MT.PLE_CONV1D, il), b.normal((hc_dim, Q_PLE_CONV_KERNEL), 0.3))

        # MoE with a shared expert
        b.add_f32(b.name(MT.FFN_GATE_INP, il), b.normal((Q_N_EXPERT, n_embd), inv(n_embd)))
        b.add_q4(b.name(MT.FFN_GATE_EXP, il), (Q_N_EXPERT, Q_N_FF_EXP, n_embd), inv(n_embd))
        b.add_q4(b.name(MT.FFN_UP_EXP, il), (Q_N_EXPERT, Q_N_FF_EXP, n_embd), inv(n_embd))
        b.add_q4(b.name(MT.FFN_DOWN_EXP, il), (Q_N_EXPERT, n_embd, Q_N_FF_EXP), inv(Q_N_FF_EXP))
        b.add_f32(b.name(MT.FFN_GATE_INP_SHEXP, il), b.normal((n_embd,), inv(n_embd)))
        b.add_q4(b.name(MT.FFN_GATE_SHEXP, il), (Q_N_FF_SHEXP, n_embd), inv(n_embd))
        b.add_q4(b.name(MT.FFN_UP_SHEXP, il), (Q_N_FF_SHEXP, n_embd), inv(n_embd))
        b.add_q4(b.name(MT.FFN_DOWN_SHEXP, il), (n_embd, Q_N_FF_SHEXP), inv(Q_N_FF_SHEXP))
    return f"n_embd {n_embd}, {Q_LAYERS} layers"


def gemma4(b: Builder, rows: int, width: int) -> str:
    """Metadata and tensors of the tiny gemma4 around a table of `rows` rows of `width`."""
    K, MT, V = b.K, b.MT, b.gguf.GGUFValueType
    if width % G_PER_LAYER:
        sys.exit(f"write_model.py: a gemma4 table row of {width} is not whole layers of {G_PER_LAYER}")
    n_layer = width // G_PER_LAYER
    swa = [il % 2 == 0 for il in range(n_layer)]  # layer 0 sliding window, then alternating
    if all(swa):
        sys.exit("write_model.py: gemma4 needs at least two layers (synth --layers 2)")

    b.basics(rows, G_EMBD, n_layer, G_N_FF, G_N_HEAD, G_N_HEAD_KV, G_HEAD_DIM)
    b.u32(K.Attention.KEY_LENGTH_SWA, G_HEAD_DIM)
    b.u32(K.Attention.VALUE_LENGTH_SWA, G_HEAD_DIM)
    b.u32(K.Attention.SLIDING_WINDOW, G_SWA)
    b.arr(K.Attention.SLIDING_WINDOW_PATTERN, swa, V.BOOL)
    b.u32(K.Attention.SHARED_KV_LAYERS, 0)
    b.f32(K.Attention.LAYERNORM_RMS_EPS, 1e-6)
    b.f32(K.Rope.FREQ_BASE, 1e6)
    b.f32(K.Rope.FREQ_BASE_SWA, 1e4)
    b.u32(K.LLM.EMBD_LENGTH_PER_LAYER_INP, G_PER_LAYER)

    b.add_q4(b.name(MT.TOKEN_EMBD), (rows, G_EMBD), 1.0)
    b.add_near_one(b.name(MT.OUTPUT_NORM), (G_EMBD,))
    b.add_f32(b.name(MT.ROPE_FREQS), [1.0] * (G_HEAD_DIM // 2))
    b.add_q4(b.name(MT.PER_LAYER_MODEL_PROJ), (width, G_EMBD), inv(G_EMBD))
    b.add_near_one(b.name(MT.PER_LAYER_PROJ_NORM), (G_PER_LAYER,))
    for il in range(n_layer):
        b.add_near_one(b.name(MT.ATTN_NORM, il), (G_EMBD,))
        b.add_q4(b.name(MT.ATTN_Q, il), (G_N_HEAD * G_HEAD_DIM, G_EMBD), inv(G_EMBD))
        b.add_q4(b.name(MT.ATTN_K, il), (G_N_HEAD_KV * G_HEAD_DIM, G_EMBD), inv(G_EMBD))
        b.add_q4(b.name(MT.ATTN_V, il), (G_N_HEAD_KV * G_HEAD_DIM, G_EMBD), inv(G_EMBD))
        b.add_q4(b.name(MT.ATTN_OUT, il), (G_EMBD, G_N_HEAD * G_HEAD_DIM), inv(G_N_HEAD * G_HEAD_DIM))
        b.add_near_one(b.name(MT.ATTN_Q_NORM, il), (G_HEAD_DIM,))
        b.add_near_one(b.name(MT.ATTN_K_NORM, il), (G_HEAD_DIM,))
        b.add_near_one(b.name(MT.ATTN_POST_NORM, il), (G_EMBD,))
        b.add_near_one(b.name(MT.FFN_NORM, il), (G_EMBD,))
        b.add_q4(b.name(MT.FFN_GATE, il), (G_N_FF, G_EMBD), inv(G_EMBD))
        b.add_q4(b.name(MT.FFN_UP, il), (G_N_FF, G_EMBD), inv(G_EMBD))
        b.add_q4(b.name(MT.FFN_DOWN, il), (G_EMBD, G_N_FF), inv(G_N_FF))
        b.add_near_one(b.name(MT.FFN_POST_NORM, il), (G_EMBD,))
        b.add_q4(b.name(MT.PER_LAYER_INP_GATE, il), (G_PER_LAYER, G_EMBD), inv(G_EMBD))
        b.add_q4(b.name(MT.PER_LAYER_PROJ, il), (G_EMBD, G_PER_LAYER), inv(G_PER_LAYER))
        b.add_near_one(b.name(MT.PER_LAYER_POST_NORM, il), (G_EMBD,))
    return f"n_embd {G_EMBD}, {n_layer} layers"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", type=Path, required=True, help="llama.cpp tree with gguf-py")
    ap.add_argument("--table", type=Path, required=True, help="a `pleio synth` qwen4exp or gemma4 file")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--force", action="store_true", help="replace an existing output")
    args = ap.parse_args()

    if args.output.exists() and not args.force:
        sys.exit(f"write_model.py: {args.output} exists (--force replaces it)")

    gguf = import_gguf(args.llama_src)
    import numpy as np

    try:
        reader = gguf.GGUFReader(args.table)
    except (OSError, ValueError) as e:
        sys.exit(f"write_model.py: cannot read {args.table} as GGUF: {e}")
    arch_field = reader.fields.get("general.architecture")
    arch = arch_field.contents() if arch_field else None
    table = next((t for t in reader.tensors if t.name == "per_layer_token_embd.weight"), None)
    if arch not in ("qwen4exp", "gemma4") or table is None:
        sys.exit(f"write_model.py: {args.table} is not a qwen4exp or gemma4 file with per_layer_token_embd.weight")
    width, rows = int(table.shape[0]), int(table.shape[1])
    table_bytes = int(table.n_bytes)

    tmp = args.output.with_name(args.output.name + ".tmp")
    b = Builder(gguf, np, tmp, arch, args.seed)
    if arch == "qwen4exp":
        if table.tensor_type != gguf.GGMLQuantizationType.IQ4_NL:
            sys.exit(f"write_model.py: expected an IQ4_NL table, got {table.tensor_type.name}")
        what = qwen4exp(b, reader.fields, width)
    else:
        what = gemma4(b, rows, width)

    # the PLE table last, streamed from the synth file after the small tensors
    w = b.w
    ple_name = table.name
    w.add_tensor_info(ple_name, (rows, table_bytes // rows), np.dtype(np.uint8), table_bytes,
                      raw_dtype=table.tensor_type)
    small = [ti for name, ti in w.tensors[0].items() if name != ple_name]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for ti in small:
        w.write_tensor_data(ti.tensor)
        ti.tensor = None
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    with open(args.table, "rb") as src:
        src.seek(table.data_offset)
        left = table_bytes
        while left:
            chunk = src.read(min(CHUNK, left))
            if not chunk:
                sys.exit(f"write_model.py: {args.table} ends inside its table")
            fout.write(chunk)
            left -= len(chunk)
    w.write_padding(fout, table_bytes)
    w.tensors[0].pop(ple_name)
    fout.flush()
    os.fsync(fout.fileno())
    w.close()
    del reader
    os.replace(tmp, args.output)
    print(f"{args.output}: {arch}, {what}, PLE table {rows} rows of {width} "
          f"({table_bytes / 2**30:.2f} GiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
