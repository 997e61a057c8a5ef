#!/usr/bin/env bash
# The engine's public API (crates/pleio without the `internals` feature)
# against the committed snapshot crates/pleio/public-api.txt, and the
# bindings built against that API alone. A change to the surface fails
# here until the snapshot is updated on purpose:
#   bash scripts/api_check.sh --bless
# cargo-public-api (pinned) is installed once under
# ${PLEIO_CACHE_DIR:-~/.cache/pleio}/tools; it reads nightly rustdoc JSON.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.52.0
CACHE=${PLEIO_CACHE_DIR:-$HOME/.cache/pleio}
ROOT="$CACHE/tools/cargo-public-api-$VERSION"
SNAPSHOT=crates/pleio/public-api.txt

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "SKIPPED: the public-API check needs a nightly toolchain (rustup toolchain install nightly)"
    exit 0
fi
if [ ! -x "$ROOT/bin/cargo-public-api" ]; then
    cargo install cargo-public-api --version "$VERSION" --locked --root "$ROOT"
fi

echo "bindings against the public API alone (no internals feature):"
cargo check -q -p pleio-capi --lib
cargo check -q -p pleio-py --lib

now=$(mktemp)
log=$(mktemp)
trap 'rm -f "$now" "$log"' EXIT
# Default features: what an engine sees.
if ! PATH="$ROOT/bin:$PATH" cargo public-api --package pleio -ss >"$now" 2>"$log"; then
    cat "$log" >&2
    exit 1
fi
lines=$(grep -c . "$now" || true)
# Declared items: modules, types, variants, fields, inherent methods,
# traits and their methods, consts; not impl lines nor the members of
# trait impls (Clone::clone, Debug::fmt, ...).
# A trait impl's members are the lines right after it that name its type
# (`impl Clone for pleio::Dtype` then `pub fn pleio::Dtype::clone`), so an
# item declared after them (`pub type pleio::Result`) still counts.
items=$(awk '
    /^impl/ { p = index($0, " for "); in_trait = p > 0; ty = substr($0, p + 5); next }
    in_trait && /^pub (fn|type|const) / && index($0, " " ty "::") { next }
    { in_trait = 0; n++ }
    END { print n + 0 }' "$now")
echo "pleio public API: $items declared items, $lines lines (cargo public-api -ss, default features)"

if [ "${1:-}" = "--bless" ]; then
    cp "$now" "$SNAPSHOT"
    echo "wrote $SNAPSHOT"
    exit 0
fi
if ! diff -u "$SNAPSHOT" "$now"; then
    echo "the public API of pleio changed (above: - snapshot, + now)." >&2
    echo "If that is intended, run: bash scripts/api_check.sh --bless" >&2
    exit 1
fi
echo "public API matches $SNAPSHOT"
