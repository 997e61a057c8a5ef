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

c=corpus/text_parsers
mkdir -p "$c"
i=0
for s in 4096 64k 512M 1.5G 2TiB 1_000 full auto fault uring-direct bf16 float16 raw evict mincore none; do
    printf '%s' "$s" > "$c/seed-$i"
    i=$((i + 1))
done
