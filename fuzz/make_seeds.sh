#!/usr/bin/env bash
# Regenerates the committed seed corpus of the fuzz targets that take files
# or text. The structured targets' seeds (page_plan, read_plan) are inputs a
# four-minute run found, merged down to those of at most 128 bytes that add
# coverage: `fuzz-target/.../page_plan -merge=1 -max_len=128 corpus/page_plan RUN_DIR`.
#
#   fuzz/make_seeds.sh [PATH/TO/pleio]    # default target/release/pleio
set -euo pipefail
cd "$(dirname "$0")"
pleio=${1:-../target/release/pleio}

c=corpus/gguf_parse
mkdir -p "$c"
# A complete gemma4 file (4 rows, one layer) and a complete qwen4exp file
# at the smallest table its n-gram heads fit (381 rows), n-gram keys and all.
"$pleio" synth --arch gemma4 --rows 4 --layers 1 --type Q8_0 --seed 1 --force -o "$c/gemma4-4rows.gguf"
"$pleio" synth --rows 381 --seed 1 --force -o "$c/qwen4exp-381rows.gguf"

c=corpus/safetensors_parse
mkdir -p "$c"
# Small safetensors files (every dtype the checkpoint reader uses, a
# scalar, an empty tensor, metadata) and a model.safetensors.index.json.
python3 - "$c" <<'PY'
import json, struct, sys
out = sys.argv[1]
def st(name, tensors, meta=None, pad=0):
    header, data = {}, b""
    for tname, dtype, shape, raw in tensors:
        header[tname] = {"dtype": dtype, "shape": shape,
                         "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode() + b" " * pad
    with open(f"{out}/{name}", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
P = "model.language_model.layers.1.ple.ple_embedding."
st("ple-bf16-fp8.safetensors", [
    (P + "ngram_embedding.shard_0.weight", "F8_E4M3", [2, 16], bytes(range(32))),
    ("other.bias", "F32", [3], struct.pack("<3f", 1.0, -0.0, 2.5)),
    (P + "ngram_embedding.shard_1.weight", "F8_E4M3", [2, 16], bytes(range(32, 64))),
    (P + "ngram_embedding.weight_scale", "BF16", [], b"\x52\x39"),
    (P + "layer_multipliers", "I64", [3], struct.pack("<3q", 7, 11, 13)),
], meta={"format": "pt"})
st("mlx4.safetensors", [
    ("language_model.model.layers.1.ple.ple_embedding.ngram_embedding.shards.0.weight", "U32", [1, 4], bytes(16)),
    ("language_model.model.layers.1.ple.ple_embedding.ngram_embedding.shards.0.scales", "BF16", [1, 1], b"\x80\x3f"),
    ("language_model.model.layers.1.ple.ple_embedding.ngram_embedding.shards.0.biases", "BF16", [1, 1], b"\x00\xbf"),
    ("empty", "U8", [0, 5], b""),
    ("half", "F16", [2], struct.pack("<2e", 1.0, -2.0)),
    ("bytes", "U8", [3], b"abc"),
], pad=5)
with open(f"{out}/model.safetensors.index.json", "w") as f:
    json.dump({"metadata": {"total_size": 96},
               "weight_map": {P + "ngram_embedding.shard_0.weight": "model-00001-of-00002.safetensors",
                              P + "ngram_embedding.shard_1.weight": "model-00002-of-00002.safetensors",
                              "other.bias": "model-00001-of-00002.safetensors"}}, f)
PY

c=corpus/text_parsers
mkdir -p "$c"
i=0
for s in 4096 64k 512M 1.5G 2TiB 1_000 full auto fault uring-direct bf16 float16 raw evict mincore none; do
    printf '%s' "$s" > "$c/seed-$i"
    i=$((i + 1))
done

c=corpus/lists
mkdir -p "$c"
i=0
for s in '1 2,3
4' '[5, 6]
' '{"tokens": [7, 4294967295], "rows": []}' '18446744073709551615,0 ,, 9' '1 x' '{"tokens": [1, -1]}'; do
    printf '%s' "$s" > "$c/seed-$i"
    i=$((i + 1))
done

c=corpus/config_parse
mkdir -p "$c"
# The released qwen4exp config (keys under text_config) and a top-level
# one with several eos ids and more PLE layers.
printf '%s' '{"model_type":"qwen4exp","image_token_id":248056,"text_config":{"ple_layer_ids":[2],"ngram_size":3,"heads_per_ngram":8,"ngram_vocab_size_base":20000000,"make_ngram_vocab_size_divisible_by":128,"split_ngram_parts":128,"vocab_size":248320,"eos_token_id":248044,"seed":null}}' > "$c/released.json"
printf '%s' '{"ngram_size":3,"heads_per_ngram":2,"ngram_vocab_size_base":4283,"make_ngram_vocab_size_divisible_by":64,"vocab_size":1000,"eos_token_id":[7,8],"seed":5,"ple_layer_ids":[3,1],"ple_embedding_dtype":"nvfp4"}' > "$c/top-level.json"

c=corpus/ple_store_parse
mkdir -p "$c"
# Manifests over the target's 64 KiB `model.safetensors`: two BF16 shards,
# and one MLX 4-bit shard (weight, scales, biases).
printf '%s' '{"version":2,"layout":"safetensors_ranges","row_width":16,"row_count":6,"quantization":null,"shards":[{"row_start":0,"row_count":4,"weight":{"file":"model.safetensors","offset":0,"dtype":"bfloat16","shape":[4,16]}},{"row_start":4,"row_count":2,"weight":{"file":"model.safetensors","offset":128,"dtype":"BF16","shape":[2,16]}}]}' > "$c/bf16.json"
printf '%s' '{"version":2,"layout":"safetensors_ranges","source_root":".","row_width":32,"row_count":2,"quantization":{"bits":4,"group_size":32,"mode":"affine"},"shards":[{"row_start":0,"row_count":2,"weight":{"file":"model.safetensors","offset":0,"dtype":"uint32","shape":[2,4]},"scales":{"file":"model.safetensors","offset":32,"dtype":"bfloat16","shape":[2,1]},"biases":{"file":"model.safetensors","offset":36,"dtype":"bfloat16","shape":[2,1]}}]}' > "$c/mlx4.json"

c=corpus/remote_parse
mkdir -p "$c"
# RESP replies a cluster sends (CLUSTER SLOTS, GETRANGE bulks, MOVED/ASK
# errors), a manifest of each row format, and redis:// addresses.
python3 - "$c" <<'PY'
import json, sys
out = sys.argv[1]
def put(name, data):
    open(f"{out}/{name}", "wb").write(data if isinstance(data, bytes) else data.encode())
put("slots.resp", "*2\r\n*4\r\n:0\r\n:8191\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$3\r\nabc\r\n"
    "*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$3\r\ndef\r\n*3\r\n:8192\r\n:16383\r\n*2\r\n$0\r\n\r\n:7001\r\n")
put("bulks.resp", "$16\r\n0123456789abcdef\r\n$-1\r\n$3\r\nabc\r\n-MOVED 12182 127.0.0.1:7002\r\n-ASK 1 h:2\r\n+OK\r\n:5\r\n")
base = {"format": "pleio-redis-table", "version": 1, "id": "00000000000000ff", "name": "t",
        "source": "s", "row_elems": 160, "rows": 1000, "row_ids": None, "ple_layers": [1],
        "layer": 1, "fingerprint": "0"}
qwen = {"kind": "qwen", "ngram_size": 3, "heads_per_ngram": 2, "eos_token_id": 1,
        "image_token_id": None, "multipliers": [3, 5, 7], "head_vocab_sizes": [200, 200, 200, 200],
        "head_offsets": [0, 200, 400, 600]}
for i, (fmt, rb) in enumerate([({"kind": "ggml", "type_id": 20}, 90), ({"kind": "fp8_tensor", "scale_bits": 1065353216}, 160),
                               ({"kind": "fp8_row", "scale": "bf16"}, 162), ({"kind": "nvfp4", "global_scale_bits": 1065353216}, 90),
                               ({"kind": "mlx4"}, 100), ({"kind": "bf16"}, 320)]):
    m = dict(base, row_format=fmt, row_bytes=rb, rows_per_bucket=100, buckets=10,
             row_ids=qwen if i % 2 == 0 else {"kind": "gemma4"})
    put(f"manifest-{fmt['kind']}.json", json.dumps(m))
put("url-full.txt", "redis://u:p%40w@127.0.0.1:7000,127.0.0.1:7001/name?timeout_ms=10&retries=2&replicas=prefer")
put("url-short.txt", "redis://h:1/t")
put("url-tls.txt", "rediss://u@h:6380/t?tls_ca=/c/ca.pem&tls_cert=/c/me.pem&tls_key=/c/me.key&tls_name=redis.lan")
PY
