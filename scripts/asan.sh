#!/usr/bin/env bash
# Runs the planner and mapping tests (and the advise validation suite) under
# AddressSanitizer with the installed nightly toolchain. Without a nightly,
# says so and exits 0: the sanitizer run is extra assurance, not a gate on
# machines that cannot run it.
#
# Uses its own target dir (target/asan) so the stable build is not rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "asan.sh: no nightly toolchain installed: AddressSanitizer run SKIPPED"
    exit 0
fi

host=$(rustc +nightly -vV | sed -n 's/^host: //p')
case "$host" in
    x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu) ;;
    *)
        echo "asan.sh: AddressSanitizer not supported on $host: SKIPPED"
        exit 0
        ;;
esac

echo "asan.sh: $(cargo +nightly --version), target $host"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_ASAN:-target/asan}"
export RUSTFLAGS="-Zsanitizer=address"
export RUSTDOCFLAGS="-Zsanitizer=address"
# Leak checking stays on; report every error, not only the first.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}"
# --target keeps the sanitizer flags off build scripts and proc macros.
# The `asan` profile (Cargo.toml): optimized, with debug assertions and
# overflow checks on.
cargo +nightly test --profile asan --target "$host" -p pleio --lib -- page_plan:: map:: sys::
cargo +nightly test --profile asan --target "$host" -p pleio --test advise --test tester
echo "asan.sh: AddressSanitizer run PASSED"
