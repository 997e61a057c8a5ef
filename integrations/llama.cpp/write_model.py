#!/usr/bin/env python3
"""Write a tiny but real qwen4exp GGUF that llama.cpp loads, around a `pleio synth` PLE table.

    python3 write_model.py --llama-src SRC --table t.gguf -o model.gguf [--seed 1]

SRC is the llama.cpp tree of the llama-cpp-python 0.3.36 sdist (build.sh extracts it): its
vendored gguf-py knows the qwen4exp keys and tensors, the PyPI gguf 0.19 does not.

The PLE table `per_layer_token_embd.weight` (IQ4_NL rows of 160 elements) and the n-gram hash
metadata (`qwen4exp.ple.*`) are copied from the synth file; the table's bytes are streamed,
never held in memory, so a table of several GiB costs only disk. Everything else is seeded
random and small, shaped as llama.cpp's src/models/qwen4exp.cpp asks:

- the embedding width is ple_n_heads * 160 (the flat PLE gather feeds ple_key/ple_value,
  [n_embd, ...]), 16 heads of the synth layout giving 2560;
- two layers: layer 0 linear attention (gated delta net) carrying the PLE module (llama.cpp
  keeps the PLE conv history in the recurrent cache, so the PLE layer must be linear), layer 1
  full attention with the QSA indexer (the hybrid memory needs an attention layer: the PLE
  n-gram history is read from the attention cache's cells);
- hyper-connections (count 2, low rank 8), a 2-expert MoE with a shared expert;
- the vocabulary is 248320 dummy tokens (tokenizer "none"): the Qwen token ids themselves go
  in, so the n-gram hash sees real ids; the output head is the tied token embedding.

The output is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

N_VOCAB = 248320          # Qwen3.5/3.6 vocabulary (ids up to 248319)
N_LAYER = 2
PLE_LAYER = 0
HC = 2                    # hyper-connection streams (llama.cpp needs > 1)
HC_LOW_RANK = 8
SSM_D_CONV = 4
SSM_D_STATE = 128         # linear-attention head size
SSM_N_GROUP = 2           # key heads
SSM_DT_RANK = 2           # value heads
N_EXPERT = 2
N_EXPERT_USED = 1
N_FF_EXP = 64
N_FF_SHEXP = 64
PLE_CONV_KERNEL = 4
FULL_ATTENTION_INTERVAL = 2   # layer 1 is full attention
N_HEAD = 2
HEAD_DIM = 64
IDX_HEADS = 1             # QSA indexer
COMPRESS_RATIO = 4
CHUNK = 16 << 20          # bytes per copy step of the table


def import_gguf(llama_src: Path):
    gguf_py = llama_src / "gguf-py"
    if not (gguf_py / "gguf" / "constants.py").is_file():
        sys.exit(f"write_model.py: no gguf-py in {llama_src}")
    sys.path.insert(0, str(gguf_py))
    import gguf  # noqa: E402  (the vendored one, first on the path)
    if not hasattr(gguf.MODEL_ARCH, "QWEN4EXP"):
        sys.exit(f"write_model.py: {gguf.__file__} does not know qwen4exp")
    return gguf


class Weights:
    """Seeded random tensors: f32/f16 arrays or raw Q8_0/Q4_0 blocks."""

    def __init__(self, gguf, np, seed: int):
        self.gguf = gguf
        self.np = np
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, std, dtype="float32"):
        # numpy shape is ggml's ne reversed
        return (self.rng.standard_normal(shape, dtype=self.np.float32) * std).astype(dtype)

    def q8_0(self, shape, std):
        """Q8_0 blocks for a tensor of numpy shape `shape` (last dim a multiple of 32)."""
        np = self.np
        *outer, ne0 = shape
        n_blocks = int(np.prod(outer, dtype=np.int64)) * (ne0 // 32)
        # q uniform in [-127, 127] has std 73.3
        d = np.full((n_blocks, 1), std / 73.3, dtype=np.float16).view(np.uint8)
        q = self.rng.integers(-127, 128, size=(n_blocks, 32), dtype=np.int8).view(np.uint8)
        return np.concatenate([d, q], axis=1).reshape(*outer, (ne0 // 32) * 34)

    def q4_0(self, shape, std):
        """Q4_0 blocks for a tensor of numpy shape `shape` (last dim a multiple of 32)."""
        np = self.np
        *outer, ne0 = shape
        n_blocks = int(np.prod(outer, dtype=np.int64)) * (ne0 // 32)
        # nibble - 8 uniform in [-8, 7] has std 4.6
        d = np.full((n_blocks, 1), std / 4.6, dtype=np.float16).view(np.uint8)
        q = self.rng.integers(0, 256, size=(n_blocks, 16), dtype=np.uint8)
        return np.concatenate([d, q], axis=1).reshape(*outer, (ne0 // 32) * 18)


def read_table(gguf, path: Path):
    """The PLE tensor of a pleio synth file and its qwen4exp.ple.* metadata fields."""
    r = gguf.GGUFReader(path)
    arch = r.fields.get("general.architecture")
    if arch is None or arch.contents() != "qwen4exp":
        sys.exit(f"write_model.py: {path} is not a qwen4exp file")
    table = next((t for t in r.tensors if t.name == "per_layer_token_embd.weight"), None)
    if table is None:
        sys.exit(f"write_model.py: {path} has no per_layer_token_embd.weight")
    fields = {k: f for k, f in r.fields.items() if k.startswith("qwen4exp.ple.")}
    width = r.fields["qwen4exp.embedding_length_per_layer_input"].contents()
    return r, table, fields, width


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", type=Path, required=True, help="llama.cpp tree with gguf-py")
    ap.add_argument("--table", type=Path, required=True, help="a `pleio synth` qwen4exp file")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--force", action="store_true", help="replace an existing output")
    args = ap.parse_args()

    if args.output.exists() and not args.force:
        sys.exit(f"write_model.py: {args.output} exists (--force replaces it)")

    gguf = import_gguf(args.llama_src)
    import numpy as np

    reader, table, ple_fields, width = read_table(gguf, args.table)
    if table.tensor_type != gguf.GGMLQuantizationType.IQ4_NL or int(table.shape[0]) != width:
        sys.exit(f"write_model.py: expected IQ4_NL rows of {width}, got {table.tensor_type.name} {list(table.shape)}")
    ngram = int(ple_fields["qwen4exp.ple.ngram_size"].contents())
    per_gram = int(ple_fields["qwen4exp.ple.heads_per_ngram"].contents())
    ple_heads = (ngram - 1) * per_gram
    n_embd = ple_heads * width  # llama.cpp: the flat gather of all heads is n_embd wide
    hc_dim = HC * n_embd
    rows = int(table.shape[1])
    table_bytes = int(table.n_bytes)

    W = Weights(gguf, np, args.seed)
    K = gguf.Keys
    T = gguf.GGMLQuantizationType
    arch = "qwen4exp"
    tmp = args.output.with_name(args.output.name + ".tmp")
    w = gguf.GGUFWriter(tmp, arch)

    # --- metadata --------------------------------------------------------------------
    fmt = lambda key: key.format(arch=arch)  # noqa: E731
    w.add_name("pleio tiny qwen4exp")
    w.add_string("tokenizer.ggml.model", "none")
    w.add_uint32(fmt(K.LLM.VOCAB_SIZE), N_VOCAB)
    w.add_uint32(fmt(K.LLM.CONTEXT_LENGTH), 65536)
    w.add_uint32(fmt(K.LLM.EMBEDDING_LENGTH), n_embd)
    w.add_uint32(fmt(K.LLM.BLOCK_COUNT), N_LAYER)
    w.add_uint32(fmt(K.LLM.FEED_FORWARD_LENGTH), N_FF_EXP)
    w.add_uint32(fmt(K.LLM.EXPERT_FEED_FORWARD_LENGTH), N_FF_EXP)
    w.add_uint32(fmt(K.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH), N_FF_SHEXP)
    w.add_uint32(fmt(K.LLM.EXPERT_COUNT), N_EXPERT)
    w.add_uint32(fmt(K.LLM.EXPERT_USED_COUNT), N_EXPERT_USED)
    w.add_uint32(fmt(K.LLM.FULL_ATTENTION_INTERVAL), FULL_ATTENTION_INTERVAL)
    w.add_uint32(fmt(K.Attention.HEAD_COUNT), N_HEAD)
    w.add_uint32(fmt(K.Attention.HEAD_COUNT_KV), N_HEAD)
    w.add_uint32(fmt(K.Attention.KEY_LENGTH), HEAD_DIM)
    w.add_uint32(fmt(K.Attention.VALUE_LENGTH), HEAD_DIM)
    w.add_float32(fmt(K.Attention.LAYERNORM_RMS_EPS), 1e-6)
    w.add_uint32(fmt(K.Attention.Indexer.HEAD_COUNT), IDX_HEADS)
    w.add_uint32(fmt(K.Attention.Indexer.KEY_LENGTH), HEAD_DIM)
    # a budget beyond any context selects every block, as llama.cpp's test-llama-archs does
    w.add_uint32(fmt(K.Attention.Indexer.TOP_K), 131072)
    w.add_key_value(fmt(K.Attention.COMPRESS_RATIOS), [COMPRESS_RATIO] * N_LAYER,
                    gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT32)
    w.add_array(fmt(K.Rope.DIMENSION_SECTIONS), [HEAD_DIM // 4] * 4)
    w.add_uint32(fmt(K.SSM.CONV_KERNEL), SSM_D_CONV)
    w.add_uint32(fmt(K.SSM.INNER_SIZE), SSM_D_STATE * SSM_DT_RANK)
    w.add_uint32(fmt(K.SSM.STATE_SIZE), SSM_D_STATE)
    w.add_uint32(fmt(K.SSM.TIME_STEP_RANK), SSM_DT_RANK)
    w.add_uint32(fmt(K.SSM.GROUP_COUNT), SSM_N_GROUP)
    w.add_uint32(fmt(K.HyperConnection.COUNT), HC)
    w.add_uint32(fmt(K.HyperConnection.LOW_RANK), HC_LOW_RANK)
    w.add_uint32(fmt(K.LLM.EMBD_LENGTH_PER_LAYER_INP), width)
    # the n-gram hash exactly as the synth table has it (same keys, same value types)
    for key, field in ple_fields.items():
        if key == fmt(K.PerLayerEmbedding.LAYERS):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, [int(v) for v in field.contents()], vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, int(field.contents()), vtype)
    w.add_key_value(fmt(K.PerLayerEmbedding.LAYERS), [PLE_LAYER], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT32)
    w.add_uint32(fmt(K.PerLayerEmbedding.CONV_KERNEL), PLE_CONV_KERNEL)
    w.add_uint64("pleio.table.rows", rows)

    # --- tensors ---------------------------------------------------------------------
    names = gguf.TENSOR_NAMES
    MT = gguf.MODEL_TENSOR

    def name(t, bid=None, suffix="weight"):
        base = names[t].format(bid=bid) if bid is not None else names[t]
        return f"{base}.{suffix}" if suffix else base

    def add_f32(n, arr):
        w.add_tensor(n, arr.astype(np.float32))

    def add_f16(n, arr):
        w.add_tensor(n, arr.astype(np.float16))

    def add_q8(n, shape, std):
        w.add_tensor(n, W.q8_0(shape, std), raw_dtype=T.Q8_0)

    def near_one(shape):
        return 1.0 + W.normal(shape, 0.05)

    inv = lambda fan_in: 1.0 / np.sqrt(fan_in)  # noqa: E731

    # token embedding, also the output head (tied): Q4_0 keeps it at 0.36 GB
    w.add_tensor(name(MT.TOKEN_EMBD), W.q4_0((N_VOCAB, n_embd), 1.0), raw_dtype=T.Q4_0)
    add_f32(name(MT.HC_HEAD_NORM), near_one((HC, n_embd)))
    add_f16(name(MT.HC_HEAD_DOWN), W.normal((HC_LOW_RANK, hc_dim), inv(hc_dim)))
    add_f16(name(MT.HC_HEAD_UP), W.normal((hc_dim, HC_LOW_RANK), inv(HC_LOW_RANK)))

    key_dim = SSM_D_STATE * SSM_N_GROUP
    value_dim = SSM_D_STATE * SSM_DT_RANK
    conv_dim = 2 * key_dim + value_dim
    for il in range(N_LAYER):
        for norm, down, up, inject in (
            (MT.HC_ATTN_NORM, MT.HC_ATTN_DOWN, MT.HC_ATTN_UP, MT.HC_ATTN_INJECT),
            (MT.HC_FFN_NORM, MT.HC_FFN_DOWN, MT.HC_FFN_UP, MT.HC_FFN_INJECT),
        ):
            add_f32(name(norm, il), near_one((HC, n_embd)))
            add_f16(name(down, il), W.normal((HC_LOW_RANK, hc_dim), inv(hc_dim)))
            add_f16(name(up, il), W.normal((hc_dim, HC_LOW_RANK), inv(HC_LOW_RANK)))
            add_f16(name(inject, il), W.normal((HC, hc_dim), inv(hc_dim)))

        if (il + 1) % FULL_ATTENTION_INTERVAL == 0:
            # full attention: attn_q holds [q|gate] per head; the QSA indexer
            q_dim = N_HEAD * HEAD_DIM
            add_q8(name(MT.ATTN_Q, il), (2 * q_dim, n_embd), inv(n_embd))
            add_q8(name(MT.ATTN_K, il), (q_dim, n_embd), inv(n_embd))
            add_q8(name(MT.ATTN_V, il), (q_dim, n_embd), inv(n_embd))
            add_q8(name(MT.ATTN_OUT, il), (n_embd, q_dim), inv(q_dim))
            add_f32(name(MT.ATTN_Q_NORM, il), near_one((HEAD_DIM,)))
            add_f32(name(MT.ATTN_K_NORM, il), near_one((HEAD_DIM,)))
            add_q8(name(MT.INDEXER_Q_PROJ, il), (IDX_HEADS * HEAD_DIM, n_embd), inv(n_embd))
            add_q8(name(MT.INDEXER_K_PROJ, il), (HEAD_DIM, n_embd), inv(n_embd))
            add_f32(name(MT.INDEXER_Q_NORM, il), near_one((HEAD_DIM,)))
            add_f32(name(MT.INDEXER_K_NORM, il), near_one((HEAD_DIM,)))
        else:
            # linear attention (gated delta net)
            add_q8(name(MT.ATTN_QKV, il), (conv_dim, n_embd), inv(n_embd))
            add_q8(name(MT.ATTN_GATE, il), (value_dim, n_embd), inv(n_embd))
            add_f32(name(MT.SSM_CONV1D, il), W.normal((conv_dim, SSM_D_CONV), 0.3))
            add_f32(name(MT.SSM_DT, il, "bias"), W.rng.uniform(0.0, 1.0, SSM_DT_RANK))
            add_f32(name(MT.SSM_A, il, None), -W.rng.uniform(0.5, 2.0, SSM_DT_RANK))
            add_f32(name(MT.SSM_BETA, il), W.normal((SSM_DT_RANK, n_embd), inv(n_embd)))
            add_f32(name(MT.SSM_ALPHA, il), W.normal((SSM_DT_RANK, n_embd), inv(n_embd)))
            add_f32(name(MT.SSM_NORM, il), near_one((SSM_D_STATE,)))
            add_q8(name(MT.SSM_OUT, il), (n_embd, value_dim), inv(value_dim))

        if il == PLE_LAYER:
            add_q8(name(MT.PLE_KEY, il), (hc_dim, n_embd), inv(n_embd))
            add_q8(name(MT.PLE_VALUE, il), (n_embd, n_embd), inv(n_embd))
            for t in (MT.PLE_NORM_KEY, MT.PLE_NORM_QUERY, MT.PLE_NORM_CONV):
                add_f32(name(t, il), near_one((HC, n_embd)))
            add_f32(name(MT.PLE_CONV1D, il), W.normal((hc_dim, PLE_CONV_KERNEL), 0.3))

        # MoE with a shared expert
        add_f32(name(MT.FFN_GATE_INP, il), W.normal((N_EXPERT, n_embd), inv(n_embd)))
        add_q8(name(MT.FFN_GATE_EXP, il), (N_EXPERT, N_FF_EXP, n_embd), inv(n_embd))
        add_q8(name(MT.FFN_UP_EXP, il), (N_EXPERT, N_FF_EXP, n_embd), inv(n_embd))
        add_q8(name(MT.FFN_DOWN_EXP, il), (N_EXPERT, n_embd, N_FF_EXP), inv(N_FF_EXP))
        add_f32(name(MT.FFN_GATE_INP_SHEXP, il), W.normal((n_embd,), inv(n_embd)))
        add_q8(name(MT.FFN_GATE_SHEXP, il), (N_FF_SHEXP, n_embd), inv(n_embd))
        add_q8(name(MT.FFN_UP_SHEXP, il), (N_FF_SHEXP, n_embd), inv(n_embd))
        add_q8(name(MT.FFN_DOWN_SHEXP, il), (n_embd, N_FF_SHEXP), inv(N_FF_SHEXP))

    # the PLE table last, streamed from the synth file after the small tensors
    ple_name = name(MT.PER_LAYER_TOKEN_EMBD)
    w.add_tensor_info(ple_name, (rows, table_bytes // rows), np.dtype(np.uint8), table_bytes, raw_dtype=T.IQ4_NL)
    pending = dict(w.tensors[0])
    big = pending.pop(ple_name)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for ti in pending.values():
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
    w.write_padding(fout, big.nbytes)
    w.tensors[0].pop(ple_name)
    fout.flush()
    os.fsync(fout.fileno())
    w.close()
    del reader
    os.replace(tmp, args.output)
    print(f"{args.output}: qwen4exp, n_embd {n_embd}, {N_LAYER} layers, PLE table {rows} rows "
          f"({table_bytes / 2**30:.2f} GiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
