#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a fixed time each (default 45 s:
# nine targets, under seven minutes), from the committed seed corpus in
# fuzz/corpus/TARGET (read only: new inputs go to a scratch directory).
#
# Needs a nightly toolchain and cargo-fuzz (installed from crates.io if
# missing); without nightly it prints SKIPPED and succeeds. A crash fails
# the script; libFuzzer leaves the input in fuzz/artifacts/TARGET/, to be
# turned into a regression test of the normal suite.
#
#   scripts/fuzz.sh                  # every target, 45 s each
#   scripts/fuzz.sh gguf_parse 600   # one target, ten minutes
#
# The build goes outside the clone, where CI keeps it between runs:
# ${PLEIO_CACHE_DIR:-$HOME/.cache/pleio}/fuzz-target.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${2:-${PLEIO_FUZZ_SECONDS:-45}}
export CARGO_TARGET_DIR="${PLEIO_CACHE_DIR:-$HOME/.cache/pleio}/fuzz-target"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: SKIPPED (no nightly toolchain: rustup toolchain install nightly)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz from crates.io"
    if ! cargo install cargo-fuzz; then
        echo "fuzz: SKIPPED (cargo-fuzz could not be installed)"
        exit 0
    fi
fi

if [ $# -ge 1 ]; then
    targets=$1
else
    targets=$(cargo +nightly fuzz list)
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for t in $targets; do
    echo "=== fuzz $t for ${seconds}s ==="
    mkdir -p "$scratch/$t"
    seeds=()
    if [ -d "fuzz/corpus/$t" ]; then
        seeds=("fuzz/corpus/$t")
    fi
    # The largest seed (a 34 KiB GGUF) sets the input size limit.
    cargo +nightly fuzz run "$t" "$scratch/$t" "${seeds[@]}" -- \
        -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
        -print_final_stats=1
done
echo "fuzz: every target ran ${seconds}s without a crash"
