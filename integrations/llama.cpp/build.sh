#!/usr/bin/env bash
# Builds libllama (the llama.cpp vendored in the PyPI sdist of llama-cpp-python 0.3.36, with
# pleio-provider.patch applied) and pleio's driver, CPU only, into the cache directory.
#
#   bash integrations/llama.cpp/build.sh          # JOBS=2 by default
#
# Idempotent: the sdist is downloaded and extracted once, the patch is (re)applied only when it
# changed, and the cmake build directory is kept, so a rerun rebuilds only what changed. Also
# builds pleio's CLI and, when the workspace has the pleio-capi crate, its static library and
# the driver linked with it (pleio-llama-driver-pleio).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
JOBS="${JOBS:-2}"

# --- tools ------------------------------------------------------------------------------
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
command -v git >/dev/null || missing+=(git)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
        apt-get update >/dev/null
        apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

# write_model.py's only third-party need (through the vendored gguf-py)
python3 -c 'import numpy' 2>/dev/null || {
    say "installing numpy"
    python3 -m pip install --quiet --disable-pip-version-check numpy
}

# --- the llama.cpp tree from the sdist --------------------------------------------------
mkdir -p "$LLAMA_CACHE"
if [ ! -f "$LLAMA_SRC/.pleio-extracted" ]; then
    tarball="$LLAMA_CACHE/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    if [ ! -f "$tarball" ]; then
        say "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist"
        # --no-binary for this one package only: ':all:' would also build cmake from source
        python3 -m pip download --quiet --disable-pip-version-check --no-deps \
            --no-binary=llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
            -d "$LLAMA_CACHE/sdist"
    fi
    echo "$LLAMA_SDIST_SHA256  $tarball" | sha256sum --check --quiet \
        || fail "$tarball is not the sdist this script was written for"
    say "extracting llama.cpp from the sdist"
    tmp="$(mktemp -d "$LLAMA_CACHE/extract.XXXXXX")"
    tar -xzf "$tarball" -C "$tmp" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
    # the submodule's .git file points into the sdist's own .git, which is not extracted
    rm -f "$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp/.git"
    rm -rf "$LLAMA_SRC"
    mv "$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp" "$LLAMA_SRC"
    rm -rf "$tmp"
    touch "$LLAMA_SRC/.pleio-extracted"
fi

# --- the provider patch ---------------------------------------------------------------
patch_file="$INTEGRATION_DIR/pleio-provider.patch"
applied="$LLAMA_SRC/.pleio-applied.patch"
# git must not mistake an enclosing repository for this tree
git_apply() { (cd "$LLAMA_SRC" && GIT_CEILING_DIRECTORIES="$LLAMA_CACHE" git apply "$@"); }
if ! cmp -s "$patch_file" "$applied" 2>/dev/null; then
    if [ -f "$applied" ]; then
        say "reverting the previously applied patch"
        git_apply -R "$applied"
        rm "$applied"
    fi
    say "applying pleio-provider.patch"
    git_apply "$patch_file"
    cp "$patch_file" "$applied"
fi

# --- pleio: the CLI (checks) and the C ABI (provider) ------------------------------------
crates=(-p pleio-cli)
if have_capi_crate; then
    crates+=(-p pleio-capi)
fi
say "cargo build --release ${crates[*]}"
(cd "$REPO_ROOT" && cargo build --quiet --release "${crates[@]}")

capi_opt=()
if [ -f "$PLEIO_CAPI_LIB" ]; then
    capi_opt=(-DPLEIO_CAPI_LIB="$PLEIO_CAPI_LIB")
else
    say "no $PLEIO_CAPI_LIB: building the stock driver only"
    capi_opt=(-DPLEIO_CAPI_LIB=)
    # a provider driver from an earlier build must not stand in for one of this tree
    rm -f "$DRIVER_PLEIO"
fi

# --- libllama and the drivers -------------------------------------------------------------
say "cmake build in $LLAMA_BUILD (-j$JOBS)"
# A build directory configured from another clone of pleio (another checkout path) cannot be
# reused by cmake: start it afresh rather than fail.
if [ -f "$LLAMA_BUILD/CMakeCache.txt" ]; then
    home="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$LLAMA_BUILD/CMakeCache.txt")"
    if [ "$home" != "$INTEGRATION_DIR" ]; then
        say "the build directory was configured from $home, not $INTEGRATION_DIR: rebuilding from scratch"
        rm -rf "$LLAMA_BUILD"
    fi
fi
# Not -march=native: a virtual CPU can advertise what it cannot run (AMX
# tiles, whose state the hypervisor does not enable: ggml's AMX path then
# dies of SIGILL). AVX2/FMA/F16C where /proc/cpuinfo has all three (every
# build machine so far), else ggml's portable baseline; both drivers come
# from the same build, so the bit-identity checks hold either way.
isa=(-DGGML_NATIVE=OFF)
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo; then
    isa+=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
fi
cmake -S "$INTEGRATION_DIR" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_SRC="$LLAMA_SRC" -DLLAMA_CURL=OFF "${isa[@]}" "${capi_opt[@]}" >"$LLAMA_CACHE/configure.log" 2>&1 \
    || { cat "$LLAMA_CACHE/configure.log" >&2; fail "cmake configure"; }
targets=(--target pleio-llama-driver)
if [ -f "$PLEIO_CAPI_LIB" ]; then
    targets+=(--target pleio-llama-driver-pleio --target pleio-decode-vs-ggml)
fi
cmake --build "$LLAMA_BUILD" -j"$JOBS" "${targets[@]}"
say "built $DRIVER"
if [ -f "$PLEIO_CAPI_LIB" ]; then
    say "built $DRIVER_PLEIO"
fi
