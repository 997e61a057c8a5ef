#!/usr/bin/env bash
# Runs `cargo test` (by default the README's `cargo test --workspace
# --release`; other arguments are passed instead) and then lists every test
# that skipped, with its reason.
#
#   scripts/test.sh [CARGO_TEST_ARGS...]
#
# A test that cannot run on this machine (no io_uring, no eviction on this
# file system, not root, ...) says so through pleio-testkit's `skip!`: it
# prints `SKIPPED: <package> <binary>::<test>: <reason>` on standard error
# and appends the line to $PLEIO_SKIP_LOG, which this script points at a
# fresh file. The exit status is cargo's.
set -uo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp "${TMPDIR:-/tmp}/pleio-skips.XXXXXX")
trap 'rm -f "$log"' EXIT
[ $# -gt 0 ] || set -- --workspace --release
PLEIO_SKIP_LOG=$log cargo test "$@"
status=$?

n=$(sort -u "$log" | wc -l)
printf '\n=== skipped: %d (cargo test %s) ===\n' "$n" "$*"
sort -u "$log"
exit $status
