#!/usr/bin/env bash
# The transformers proof (run by .ci/run): makes the torch + transformers
# venv outside the clone (venv.sh), installs the Python package into it the
# way a user does (pip install crates/pleio-py), and runs check.py against
# transformers 5.19 (the version vLLM pins) and the newest 5.x checked.
#
#   integrations/transformers/check.sh [PATH/TO/pleio] [--rss]
#
# --rss (the pinned version only) also measures peak RSS of from_pretrained
# against stock on a model with a 1.3 GB table.
# Says SKIPPED (exit 0) with the reason when torch or transformers cannot be
# installed, never "passed"; exits 1 when any check fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
PLEIO_BIN=${1:-$ROOT/target/release/pleio}
[ $# -gt 0 ] && shift
if [ ! -x "$PLEIO_BIN" ]; then
    (cd "$ROOT" && cargo build --release -p pleio-cli)
fi
PLEIO_BIN=$(realpath "$PLEIO_BIN")

status=0
PY=$(bash "$ROOT/integrations/transformers/venv.sh") || status=$?
if [ "$status" -ne 0 ]; then
    echo "transformers check: SKIPPED (the torch + transformers venv could not be made, exit $status)"
    exit 0
fi
export CARGO_TARGET_DIR=${PLEIO_PY_TARGET_DIR:-$CACHE/target-py}
export PIP_ROOT_USER_ACTION=ignore HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false
echo "transformers check: pip install crates/pleio-py into $(dirname "$(dirname "$PY")")"
"$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$ROOT/crates/pleio-py"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail=0
NEWEST=$(ls -d "$CACHE"/transformers-5.* 2>/dev/null | sort -V | tail -1)
for tf in pinned newest; do
    if [ "$tf" = newest ]; then
        [ -n "$NEWEST" ] || { echo "transformers check (newest): SKIPPED (no newer transformers in $CACHE)"; continue; }
        export PYTHONPATH=$NEWEST
    fi
    echo "=== transformers check: $("$PY" -c 'import transformers; print(transformers.__version__)') ==="
    mkdir -p "$WORK/$tf"
    extra=()
    [ "$tf" = pinned ] && extra=("$@")
    "$PY" "$ROOT/integrations/transformers/check.py" --pleio "$PLEIO_BIN" --work "$WORK/$tf" \
        --json "${PLEIO_TF_JSON_DIR:-$WORK}/transformers-$tf.json" ${extra[@]+"${extra[@]}"} || fail=1
    rm -rf "${WORK:?}/$tf"
    unset PYTHONPATH
done
exit $fail
