#!/usr/bin/env bash
# Checks that the committed C header include/pleio.h is what cbindgen makes
# of crates/pleio-capi now; with --write, rewrites it.
#
#   scripts/capi_check.sh [--write]
#
# Uses cbindgen $CBINDGEN_VERSION (installed with `cargo install --locked`
# into ${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/pleio}/tools the first
# time, as other versions format the header differently). Exits 1 when the
# header is stale (printing the difference), 2 on a set-up error.
set -euo pipefail

CBINDGEN_VERSION=0.29.4
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${PLEIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pleio}
TOOLS=$CACHE/tools
CBINDGEN=$TOOLS/bin/cbindgen

if ! "$CBINDGEN" --version 2>/dev/null | grep -qx "cbindgen $CBINDGEN_VERSION"; then
    echo "capi_check: installing cbindgen $CBINDGEN_VERSION into $TOOLS"
    cargo install --quiet --locked --version "$CBINDGEN_VERSION" --root "$TOOLS" cbindgen \
        || { echo "capi_check: cannot install cbindgen" >&2; exit 2; }
fi

HEADER=$ROOT/include/pleio.h
FRESH=$(mktemp)
trap 'rm -f "$FRESH"' EXIT
"$CBINDGEN" --quiet --config "$ROOT/crates/pleio-capi/cbindgen.toml" \
    --output "$FRESH" "$ROOT/crates/pleio-capi"

if [ "${1:-}" = "--write" ]; then
    cp "$FRESH" "$HEADER"
    echo "capi_check: wrote $HEADER"
    exit 0
fi
if ! diff -u "$HEADER" "$FRESH"; then
    echo "capi_check: include/pleio.h is stale: run scripts/capi_check.sh --write and commit it" >&2
    exit 1
fi
echo "capi_check: include/pleio.h is current"
