#!/usr/bin/env bash
# The published alternatives to pleio, in a venv of their own, for
# scripts/rivals_bench.py: engramdb-python 0.3.0, service-ple 0.2.2 and
# vllm-service-ple 0.2.2 (pinned), and pleio's own Python package from
# this checkout (crates/pleio-py, reinstalled on every run: the version does
# not change between commits, the code does). Idempotent for the rivals: a
# venv whose marker names the same pins is reused.
#
#   bash scripts/rivals_venv.sh          # prints the venv's python on its last line
#
# PLEIO_RIVALS_VENV picks another place (default ~/.cache/pleio/rivals-venv).
# vllm-service-ple is installed --no-deps: its vLLM hook needs vLLM 0.31 and
# CUDA, the bench calls its client library (libserviceple.so, the C ABI the
# hook calls) directly. PLEIO_PY_TARGET_DIR is the extension's cargo target
# directory (default: the checkout's target/).
set -euo pipefail
VENV=${PLEIO_RIVALS_VENV:-$HOME/.cache/pleio/rivals-venv}
PINS="engramdb-python==0.3.0 service-ple==0.2.2"
PLUGIN="vllm-service-ple==0.2.2"
MARK="$VENV/.pleio-rivals"
WANT="$PINS $PLUGIN"
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NICE="nice -n 19"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ ! -f $MARK || $(cat "$MARK") != "$WANT" ]]; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    # shellcheck disable=SC2086
    $NICE "$VENV/bin/python" -m pip install -q $PINS numpy >&2
    $NICE "$VENV/bin/python" -m pip install -q --no-deps $PLUGIN >&2
    echo "$WANT" >"$MARK"
fi
CARGO_TARGET_DIR=${PLEIO_PY_TARGET_DIR:-$ROOT/target} \
    $NICE "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$ROOT/crates/pleio-py" >&2
echo "$VENV/bin/python"
