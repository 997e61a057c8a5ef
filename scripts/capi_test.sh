#!/usr/bin/env bash
# Builds the C ABI (crates/pleio-capi) and runs its C and C++ test programs
# (crates/pleio-capi/tests/c) under AddressSanitizer and UndefinedBehavior-
# Sanitizer, against fixtures written by the pleio CLI:
#   capi_test.c      every function, every dtype bit for bit against
#                    `pleio gather` (bf16/f16 rounded from its f32 by numpy,
#                    raw = the file's bytes), row ids against `pleio rows`,
#                    NULLs, bad enums, short buffers, closed handles; the
#                    same table published to a throwaway redis-server
#                    (when installed): every dtype and the row ids equal,
#                    an unpublished name, no server, an unreadable TLS file;
#                    linked to libpleio_capi.a with the system C compiler;
#   capi_threads.cpp one handle from 8 threads, and a close racing 4 others;
#                    linked to libpleio_capi.so with the system C++ compiler;
#   capi_guard.c     the SIGBUS guard in a host that installs its own handler
#                    first or later, or blocks SIGBUS (linked as capi_test).
#   capi_stress.cpp  $PLEIO_STRESS_SECONDS (default 3) of threads opening,
#                    gathering, prefetching and closing tables of every
#                    strategy, then fork() of tables in use (uring-direct,
#                    uring, pool, auto), a hang failing by alarm().
#
#   scripts/capi_test.sh [PATH/TO/pleio]
#
# PATH/TO/pleio defaults to target/release/pleio (built if missing). Needs
# python3 with numpy. Exits non-zero when a test fails or cannot be built.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release -p pleio-capi
if [ $# -ge 1 ]; then
    PLEIO=$(realpath "$1")
else
    PLEIO=$TARGET/release/pleio
    [ -x "$PLEIO" ] || cargo build --release -p pleio-cli
fi
CC=${CC:-cc}
CXX=${CXX:-c++}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# --- fixtures ---
"$PLEIO" synth --rows 5000 --seed 11 -o "$WORK/q.gguf" >/dev/null
"$PLEIO" synth --arch gemma4 --layers 2 --rows 300 --seed 12 -o "$WORK/g.gguf" >/dev/null
"$PLEIO" synth --rows 200000 --seed 16 -o "$WORK/big.gguf" >/dev/null
echo "this is not a GGUF file" >"$WORK/bad.gguf"
"$PLEIO" inspect --json "$WORK/q.gguf" >"$WORK/inspect.json"
python3 - "$WORK" <<'EOF'
import json, random, sys
from pathlib import Path
import numpy as np

d = Path(sys.argv[1])
t = json.loads((d / "inspect.json").read_text())["table"]
rows, elems, rb, off = t["rows"], t["row_elems"], t["row_bytes"], t["offset"]
(d / "meta.txt").write_text(f"{rows} {elems} {rb} {t['type']} {off}\n")
rnd = random.Random(5)
ids = [rnd.randrange(rows) for _ in range(300)] + [rows - 1, 0, 0, rows - 1, 17, 17]
(d / "ids.txt").write_text(" ".join(map(str, ids)) + "\n")
(d / "all_ids.txt").write_text(" ".join(map(str, range(rows))) + "\n")
# tokens: ordinary ids, a repeat, and the released EOS (248044) resetting history
toks = [rnd.randrange(200000) for _ in range(40)] + [248044] + [rnd.randrange(200000) for _ in range(20)]
(d / "tokens.txt").write_text(" ".join(map(str, toks)) + "\n")
EOF
"$PLEIO" gather "$WORK/q.gguf" --rows-file "$WORK/ids.txt" -o "$WORK/expect.f32" >/dev/null
"$PLEIO" gather "$WORK/q.gguf" --rows-file "$WORK/all_ids.txt" -o "$WORK/all.f32" >/dev/null
"$PLEIO" rows "$WORK/q.gguf" --tokens "$WORK/tokens.txt" --json >"$WORK/rows.json"
# a checkpoint: MLX 4-bit over three files, its rows as the CLI gathers them
"$PLEIO" synth --format safetensors --encoding mlx4 --rows 5000 --files 3 --seed 13 -o "$WORK/ck" >/dev/null
python3 -c 'import random; r = random.Random(6); print(" ".join(str(r.randrange(4992)) for _ in range(200)), 0, 4991)' >"$WORK/ck_ids.txt"
for dt in f32 bf16 raw; do
    "$PLEIO" gather "$WORK/ck" --rows-file "$WORK/ck_ids.txt" --dtype $dt -o "$WORK/ck_expect.$dt" >/dev/null
done
# an FP8 checkpoint with an F32 table scale: bf16 rows by vLLM's rule
"$PLEIO" synth --format safetensors --encoding fp8 --fp8-scale 2e-4 --rows 5000 --files 2 \
    --seed 14 -o "$WORK/fp8" >/dev/null
"$PLEIO" gather "$WORK/fp8" --rows-file "$WORK/ck_ids.txt" --dtype bf16 --rounding vllm \
    -o "$WORK/fp8_vllm.bf16" >/dev/null
"$PLEIO" gather "$WORK/fp8" --rows-file "$WORK/ck_ids.txt" --dtype bf16 \
    -o "$WORK/fp8_exact.bf16" >/dev/null
# a checkpoint with two PLE layers (decoder layers 0 and 2): layer 2's rows
"$PLEIO" synth --format safetensors --encoding bf16 --rows 5000 --ple-layers 1,3 --shards 4 \
    --seed 15 -o "$WORK/two" >/dev/null
"$PLEIO" gather "$WORK/two" --layer 2 --rows-file "$WORK/ck_ids.txt" -o "$WORK/two_l2.f32" >/dev/null
"$PLEIO" gather "$WORK/two" --rows-file "$WORK/ck_ids.txt" -o "$WORK/two_l0.f32" >/dev/null
python3 - "$WORK" <<'EOF'
import json, sys
from pathlib import Path
import numpy as np

d = Path(sys.argv[1])
rows, elems, rb, ty, off = (d / "meta.txt").read_text().split()
rb, off = int(rb), int(off)
ids = [int(x) for x in (d / "ids.txt").read_text().split()]
f32 = np.fromfile(d / "expect.f32", dtype="<f4")
assert f32.size == len(ids) * int(elems), (f32.size, len(ids), elems)
# bf16 and f16: round to nearest even from the exact f32 (no NaN in these tables)
assert not np.isnan(f32).any()
u = f32.view("<u4").astype(np.uint64)
bf16 = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
bf16.tofile(d / "expect.bf16")
f32.astype("<f2").tofile(d / "expect.f16")
# raw: the stored bytes, read straight from the file
blob = (d / "q.gguf").read_bytes()
(d / "expect.raw").write_bytes(b"".join(blob[off + i * rb: off + (i + 1) * rb] for i in ids))
r = json.loads((d / "rows.json").read_text())
(d / "rows.txt").write_text(" ".join(str(x) for per_token in r["rows"] for x in per_token) + "\n")
EOF

# --- build ---
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)
# what Rust's std needs from the system when linked statically on Linux
# (`rustc --print native-static-libs`)
NATIVE=(-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc)
"$CC" -std=c11 -Wall -Wextra -Werror "${SAN[@]}" -I include \
    crates/pleio-capi/tests/c/capi_test.c "$TARGET/release/libpleio_capi.a" "${NATIVE[@]}" \
    -o "$WORK/capi_test"
"$CC" -std=c11 -Wall -Wextra -Werror "${SAN[@]}" -I include \
    crates/pleio-capi/tests/c/capi_guard.c "$TARGET/release/libpleio_capi.a" "${NATIVE[@]}" \
    -o "$WORK/capi_guard"
"$CXX" -std=c++17 -Wall -Wextra -Werror "${SAN[@]}" -I include \
    crates/pleio-capi/tests/c/capi_threads.cpp -L "$TARGET/release" -lpleio_capi \
    -Wl,-rpath,"$TARGET/release" -pthread -o "$WORK/capi_threads"
"$CXX" -std=c++17 -Wall -Wextra -Werror "${SAN[@]}" -I include \
    crates/pleio-capi/tests/c/capi_stress.cpp -L "$TARGET/release" -lpleio_capi \
    -Wl,-rpath,"$TARGET/release" -pthread -o "$WORK/capi_stress"

# a table in Redis, for capi_test's Redis checks: q.gguf published to a
# throwaway redis-server on loopback, stopped by pid on exit
REDIS_PID=
trap 'if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null; fi; rm -rf "$WORK"' EXIT
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    RPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
        >"$WORK/redis.log" 2>&1 &
    REDIS_PID=$!
    for _ in $(seq 100); do
        [ "$(redis-cli -p "$RPORT" ping 2>/dev/null)" = PONG ] && break
        sleep 0.05
    done
    "$PLEIO" publish "$WORK/q.gguf" "redis://127.0.0.1:$RPORT/q" >/dev/null 2>&1
    export PLEIO_TEST_REDIS="redis://127.0.0.1:$RPORT"
fi

# --- run ---
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
"$WORK/capi_test" "$WORK" || status=1
"$WORK/capi_threads" "$WORK" || status=1
"$WORK/capi_guard" "$WORK" || status=1
"$WORK/capi_stress" "$WORK" "${PLEIO_STRESS_SECONDS:-3}" || status=1
if [ "$status" -ne 0 ]; then
    echo "capi_test: FAILED" >&2
    exit 1
fi
echo "capi_test: OK"
