#!/usr/bin/env bash
# Live cross-check of pleio's row decoders against gguf-py (gguf==0.19.0).
#
# Writes fresh random valid blocks of all 26 decodable types, with gguf-py's
# dequantization of them, to a temporary directory, then has the Rust test
# `crosscheck_live` (crates/pleio/tests/golden.rs) compare every f32 bit for
# bit, with the fast and the scalar decoders. Needs python3 with numpy and
# gguf==0.19.0 installed (the caller installs them).
#
# Usage: scripts/crosscheck.sh [BLOCKS_PER_TYPE] [SEED]
#   BLOCKS_PER_TYPE  default 10000 (the test insists on at least 10000)
#   SEED             base seed (default random; printed, to replay a failure)
set -euo pipefail

blocks="${1:-10000}"
seed_args=()
if [[ $# -ge 2 ]]; then
    seed_args=(--seed "$2")
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$(mktemp -d "${TMPDIR:-/tmp}/pleio-xcheck.XXXXXX")"
log="$dir/test.log"
trap 'rm -rf "$dir"' EXIT

cd "$root"
python3 scripts/golden.py --live "$dir/data" --blocks "$blocks" "${seed_args[@]}"

status=0
PLEIO_XCHECK_DIR="$dir/data" PLEIO_XCHECK_MIN_BLOCKS="$(( blocks < 10000 ? blocks : 10000 ))" \
    cargo test --release -p pleio --test golden crosscheck_live -- --nocapture --exact \
    2>&1 | tee "$log" || status=$?

# cargo exits 0 when a filter matches no test: insist on the test's own verdict.
if [[ $status -ne 0 ]] || ! grep -q '^crosscheck_live: all 26 types OK' "$log"; then
    echo "crosscheck: FAILED (decoder output differs from gguf-py, or the check did not run)" >&2
    exit 1
fi
echo "crosscheck: OK"
