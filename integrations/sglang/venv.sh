#!/usr/bin/env bash
# Makes (once) the SGLang venv the SGLang check runs in, outside the clone:
# ${PLEIO_CACHE_DIR:-~/.cache/pleio}/sglang-venv with sglang==0.5.23 and the
# torch and transformers it pins (torch 2.14.1, transformers 5.19.0), but
# not its GPU kernel packages (flashinfer, sgl-kernel, deep-ep, cutlass...):
# sglang is installed with --no-deps, then the few pure-Python packages its
# model modules import. That is what runs on a CPU-only machine: the model
# modules import, build and load weights; nothing generates.
#
#   integrations/sglang/venv.sh      # prints the venv's python on success
#
# Exits 3 (and says why) when the packages cannot be installed, so callers
# report SKIPPED rather than passed.
set -euo pipefail
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
VENV=$CACHE/sglang-venv
SGLANG=${PLEIO_SGLANG_VERSION:-0.5.23}
TORCH=${PLEIO_SGLANG_TORCH:-2.14.1}
TF=${PLEIO_SGLANG_TRANSFORMERS:-5.19.0}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$CACHE"
stamp="$VENV/.pleio-sglang-$SGLANG-torch-$TORCH"
if [ ! -e "$stamp" ]; then
    t0=$(date +%s)
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
    PIP=(nice -n 19 "$VENV/bin/python" -m pip install --quiet)
    # The modules sglang.srt.models.qwen4_exp imports, and what they import
    # in turn (read from the wheel; the GPU kernel packages are left out).
    # Versions as sglang 0.5.23 pins them where it pins one.
    if ! "${PIP[@]}" "torch==$TORCH" "transformers==$TF" numpy safetensors==0.8.0 ml_dtypes==0.6.0 \
        msgspec sympy pydantic orjson psutil pybase64 requests tqdm packaging einops pyzmq \
        setproctitle uvloop fastapi uvicorn prometheus-client partial_json_parser \
        interegular xxhash zstandard distro pillow IPython aiohttp torchvision dill gguf \
        tokenizers==0.23.2 sentencepiece==0.2.1 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 \
        openai==2.8.0 >&2 ||
        ! "${PIP[@]}" --no-deps "sglang==$SGLANG" >&2; then
        echo "venv.sh: could not install sglang==$SGLANG with torch==$TORCH" >&2
        exit 3
    fi
    touch "$stamp"
    echo "sglang venv: installed in $(( $(date +%s) - t0 )) s, $(du -sh "$VENV" | cut -f1)" >&2
fi
echo "$VENV/bin/python"
