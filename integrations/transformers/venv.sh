#!/usr/bin/env bash
# Makes (once) the torch + transformers virtual environment the torch door's
# checks run in, outside the clone: ${PLEIO_CACHE_DIR:-~/.cache/pleio}/torch-venv
# with PyPI torch (the CUDA build, ~4.8 GB; it imports on a machine without a
# GPU), transformers (the version vLLM pins), mlx + mlx-cpu (the oracle of
# the "mlx" rounding rule; they run on Linux CPU) and the test dependencies, and
# a second transformers (the newest 5.x checked) in .../transformers-NEWEST,
# put in front by PYTHONPATH when a check runs against it.
#
#   integrations/transformers/venv.sh      # prints the venv's python on success
#
# Exits 3 (and says why) when the packages cannot be installed, so callers can
# report SKIPPED rather than passed.
set -euo pipefail
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
VENV=$CACHE/torch-venv
TORCH=${PLEIO_TORCH_VERSION:-2.13.0}
TF=${PLEIO_TRANSFORMERS_VERSION:-5.19.0}
TF_NEWEST=${PLEIO_TRANSFORMERS_NEWEST:-5.24.0}
MLX=${PLEIO_MLX_VERSION:-0.32.4}
export PIP_ROOT_USER_ACTION=ignore
mkdir -p "$CACHE"
stamp="$VENV/.pleio-torch-$TORCH-transformers-$TF-mlx-$MLX"
if [ ! -e "$stamp" ]; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
    if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "torch==$TORCH" "transformers==$TF" "mlx==$MLX" "mlx-cpu==$MLX" numpy ml_dtypes==0.6.0 \
        safetensors==0.8.0 gguf==0.19.0 pytest maturin >&2; then
        echo "venv.sh: could not install torch==$TORCH transformers==$TF mlx==$MLX" >&2
        exit 3
    fi
    touch "$stamp"
fi
newest=$CACHE/transformers-$TF_NEWEST
if [ ! -e "$newest/.pleio-done" ]; then
    rm -rf "$newest"
    if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-deps --target "$newest" "transformers==$TF_NEWEST" >&2; then
        echo "venv.sh: could not install transformers==$TF_NEWEST" >&2
        exit 3
    fi
    touch "$newest/.pleio-done"
fi
echo "$VENV/bin/python"
