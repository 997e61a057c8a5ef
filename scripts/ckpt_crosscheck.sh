#!/usr/bin/env bash
# Live cross-check of pleio's checkpoint tables and row encodings against
# NumPy + ml_dtypes, on checkpoints written by Hugging Face's safetensors.
#
# scripts/ckpt_golden.py writes fresh random cases (BF16, F16, FP8 with BF16
# and F32 per-tensor scales, FP8 with BF16 and F32 per-row scales, NVFP4,
# MLX 4-bit, Gemma 4 BF16; edge values in the first rows) with their
# expected f32/bf16/f16 outputs to a temporary directory; the Rust test
# `ckpt_crosscheck_live` (crates/pleio/tests/ckpt_golden.rs) finds each
# table with CheckpointTable::open and compares every row bit for bit, with
# the fast and the scalar decoders. Needs python3 with numpy, ml_dtypes and
# safetensors (the caller installs them).
#
# Usage: scripts/ckpt_crosscheck.sh [ROWS_PER_CASE] [SEED]
#   ROWS_PER_CASE  default 20000
#   SEED           default random (printed, to replay a failure)
set -euo pipefail

rows="${1:-20000}"
seed_args=()
if [[ $# -ge 2 ]]; then
    seed_args=(--seed "$2")
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$(mktemp -d "${TMPDIR:-/tmp}/pleio-ckpt-xcheck.XXXXXX")"
log="$dir/test.log"
trap 'rm -rf "$dir"' EXIT

cd "$root"
python3 scripts/ckpt_golden.py --live "$dir/data" --rows "$rows" "${seed_args[@]}"

status=0
PLEIO_CKPT_XCHECK_DIR="$dir/data" PLEIO_CKPT_XCHECK_MIN_ROWS="$rows" \
    cargo test --release -p pleio --test ckpt_golden ckpt_crosscheck_live -- --nocapture --exact \
    2>&1 | tee "$log" || status=$?

# cargo exits 0 when a filter matches no test: insist on the test's own verdict.
if [[ $status -ne 0 ]] || ! grep -q '^ckpt_crosscheck_live: all 9 cases OK' "$log"; then
    echo "ckpt crosscheck: FAILED (decoded rows differ from NumPy/ml_dtypes, or the check did not run)" >&2
    exit 1
fi
echo "ckpt crosscheck: OK"
