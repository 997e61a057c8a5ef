# Paths shared by build.sh, check.sh and speed.sh (sourced, not run).
#
# Everything big lives outside the clone, in the cache directory:
#   $LLAMA_CACHE/sdist   the llama-cpp-python 0.3.36 sdist, as pip downloaded it
#   $LLAMA_CACHE/src     its vendored llama.cpp tree, with pleio-provider.patch applied
#   $LLAMA_CACHE/build   the cmake build directory (kept: rebuilds are incremental)
#   $LLAMA_CACHE/work    models and check outputs

LLAMA_CPP_PYTHON_VERSION=0.3.36
# sha256 of llama_cpp_python-0.3.36.tar.gz on PyPI
LLAMA_SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

INTEGRATION_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$INTEGRATION_DIR/../.." && pwd)"
LLAMA_CACHE="${PLEIO_CACHE_DIR:-$HOME/.cache/pleio}/llama.cpp-$LLAMA_CPP_PYTHON_VERSION"
LLAMA_SRC="$LLAMA_CACHE/src"
LLAMA_BUILD="$LLAMA_CACHE/build"
LLAMA_WORK="$LLAMA_CACHE/work"
DRIVER="$LLAMA_BUILD/pleio-llama-driver"
DRIVER_PLEIO="$LLAMA_BUILD/pleio-llama-driver-pleio"
# pleio's decoders against ggml's, on the same blocks (decode_vs_ggml.c)
DECODE_VS_GGML="$LLAMA_BUILD/pleio-decode-vs-ggml"
PLEIO="$REPO_ROOT/target/release/pleio"
# the pleio C ABI (pleio-capi crate): a static library the provider driver links
PLEIO_CAPI_LIB="${PLEIO_CAPI_LIB:-$REPO_ROOT/target/release/libpleio_capi.a}"

say() { printf '[llama.cpp] %s\n' "$*" >&2; }
fail() { printf '[llama.cpp] FAIL: %s\n' "$*" >&2; exit 1; }

# true when the workspace has the pleio-capi crate (the C ABI)
have_capi_crate() { [ -f "$REPO_ROOT/crates/pleio-capi/Cargo.toml" ]; }
