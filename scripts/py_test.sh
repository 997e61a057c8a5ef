#!/usr/bin/env bash
# Builds and installs the Python package the way a user does (`pip install
# crates/pleio-py`: maturin and the Rust toolchain) into a virtual
# environment outside the clone, installs the test dependencies, and runs
# the pytest suite (crates/pleio-py/tests) against the `pleio` CLI. The venv
# is the torch one (integrations/transformers/venv.sh), so the torch door's
# tests run; where torch cannot be installed, a plain venv, and those tests
# say SKIPPED with the reason.
#
#   scripts/py_test.sh [PATH/TO/pleio] [PYTEST ARGS...]
#
# PATH/TO/pleio defaults to target/release/pleio (built if missing). The
# venv is ${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/pleio}/torch-venv
# (else .../venv), the
# extension's cargo target directory .../target-py (kept between runs, so a
# rebuild compiles only what changed). PLEIO_PY_VENV=DIR installs into a
# venv of its own instead (made if missing, torch reached through a .pth
# file naming the torch venv's site-packages), so several checkouts can test
# at once without replacing each other's package. Exits with pytest's status, except
# that a run which collected no test (pytest's 5) is a failure (1).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
VENV=$CACHE/venv
export CARGO_TARGET_DIR=${PLEIO_PY_TARGET_DIR:-$CACHE/target-py}

PLEIO_BIN=${1:-}
if [ -n "$PLEIO_BIN" ]; then
    shift
else
    PLEIO_BIN=$ROOT/target/release/pleio
    if [ ! -x "$PLEIO_BIN" ]; then
        (cd "$ROOT" && CARGO_TARGET_DIR=$ROOT/target cargo build --release -p pleio-cli)
    fi
fi
PLEIO_BIN=$(realpath "$PLEIO_BIN")
export PLEIO_BIN

mkdir -p "$CACHE"
if TORCH_PY=$(bash "$ROOT/integrations/transformers/venv.sh"); then
    VENV=$(dirname "$(dirname "$TORCH_PY")")
else
    echo "py_test: no torch venv (see above): the torch door's tests will be SKIPPED" >&2
fi
if [ -n "${PLEIO_PY_VENV:-}" ]; then
    if [ ! -x "$PLEIO_PY_VENV/bin/python" ]; then
        python3 -m venv "$PLEIO_PY_VENV"
    fi
    if [ -x "${TORCH_PY:-}" ] && [ "$PLEIO_PY_VENV" != "$VENV" ]; then
        torch_site=$("$TORCH_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        own_site=$("$PLEIO_PY_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "$torch_site" >"$own_site/pleio-torch-venv.pth"
    fi
    VENV=$PLEIO_PY_VENV
fi
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)
export PIP_ROOT_USER_ACTION=ignore
"${PIP[@]}" install numpy ml_dtypes gguf==0.19.0 pytest

echo "py_test: pip install $ROOT/crates/pleio-py (cargo target $CARGO_TARGET_DIR)"
# --force-reinstall: the version does not change between commits, the code does.
"${PIP[@]}" install --force-reinstall --no-deps "$ROOT/crates/pleio-py"

cd "$ROOT/crates/pleio-py"
status=0
"$VENV/bin/python" -m pytest tests -q -rs "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "py_test: pytest collected no test" >&2
    exit 1
fi
exit "$status"
