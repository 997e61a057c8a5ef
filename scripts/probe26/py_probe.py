"""The Python reproductions of issue 26 for scripts/probe26.sh, one line per
item: "ITEM<TAB>what happened<TAB>PASS|FAIL". Each risky reproduction runs in
a child interpreter, so a crash is reported, not suffered.

    python py_probe.py WORK_DIR   (WORK_DIR holds q.gguf, big.gguf, ck/)
"""
import json
import os
import subprocess
import sys
from pathlib import Path

work = Path(sys.argv[1])
failures = 0


def line(item, ok, what):
    global failures
    print(f"{item}\t{what}\t{'PASS' if ok else 'FAIL'}", flush=True)
    failures += not ok


def child(code, *args, timeout=60):
    """Runs `code` in a child interpreter: (returncode or 'timeout', stdout+stderr)."""
    try:
        r = subprocess.run([sys.executable, "-c", code, *map(str, args)],
                           capture_output=True, text=True, timeout=timeout)
        return r.returncode, (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired:
        return "timeout", ""


def last(out):
    return out.splitlines()[-1] if out else "(no output)"


# High 1: another thread changes ids during gather (was SIGSEGV, rc 139).
RACE = """
import sys, threading, time
import numpy as np, pleio
path = sys.argv[1]
n = 200_000
for strategy in ["fault", "advise", "auto"]:
    t = pleio.open(path, strategy=strategy)
    good = (np.arange(n, dtype=np.uint64) * 7) % t.rows
    ids = good.copy()
    stop = False
    def flip():
        while not stop:
            ids[:] = 1 << 40
            ids[:] = good
    th = threading.Thread(target=flip); th.start()
    ok = refused = 0
    end = time.time() + 1.0
    while time.time() < end:
        try:
            t.gather(ids); ok += 1
        except pleio.RowOutOfRangeError:
            refused += 1
    stop = True; th.join()
    print(strategy, ok, refused)
print("ok")
"""
rc, out = child(RACE, work / "q.gguf")
line("1: Python ids changed during gather", rc == 0 and out.endswith("ok"),
     f"rc {rc}; gathers ok/refused per strategy: {' | '.join(out.splitlines()[:3])}")

# High 2: config.json with a huge split_ngram_parts (SIGABRT at 1e9, panic at 2^60).
OPEN = """
import sys, pleio
try:
    pleio.open(sys.argv[1])
    print("opened")
except pleio.Error as e:
    print(type(e).__name__ + ": " + str(e))
"""
results = []
for parts in [10**9, 2**60]:
    ck = work / f"ck_parts_{parts}"
    subprocess.run(["cp", "-r", str(work / "ck"), str(ck)], check=True)
    cfg = json.loads((ck / "config.json").read_text())
    (cfg.get("text_config", cfg))["split_ngram_parts"] = parts
    (ck / "config.json").write_text(json.dumps(cfg))
    rc, out = child(OPEN, ck)
    results.append((rc, last(out)))
ok = all(rc == 0 and "Error:" in o and "panick" not in o.lower() for rc, o in results)
line("2 (Python): huge split_ngram_parts", ok, "; ".join(f"rc {rc}: {o[:90]}" for rc, o in results))

# High 5: fork() after open with uring-direct (hang), pool and prefetch().wait() in the child.
FORK = """
import os, sys
import numpy as np, pleio
path = sys.argv[1]
for strategy in ["uring-direct", "pool", "auto"]:
    t = pleio.open(path, strategy=strategy)
    ids = (np.arange(3000, dtype=np.int64) * 67) % t.rows
    want = t.gather(ids)
    assert np.array_equal(t.prefetch(ids).wait(), want)
    pid = os.fork()
    if pid == 0:
        ok = np.array_equal(t.gather(ids), want) and np.array_equal(t.prefetch(ids).wait(), want)
        os._exit(0 if ok else 3)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0, (strategy, st)
    assert np.array_equal(t.gather(ids), want)
print("ok")
"""
rc, out = child(FORK, work / "big.gguf", timeout=60)
line("5: fork() after open (uring-direct, pool, auto)", rc == 0 and out.endswith("ok"),
     f"parent and child gathered and prefetched: rc {rc}, {last(out)[:100]}")

# Medium 6: the guard lost to a later handler (faulthandler.enable() after
# import) or to a thread blocking SIGBUS; the file shrinks under the mapping.
GUARD = """
import faulthandler, os, shutil, signal, sys
import numpy as np, pleio
src, tmp, how = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.copy(src, tmp)
t = pleio.open(tmp, strategy="fault")
t.gather(np.array([0], dtype=np.int64))
if how == "faulthandler":
    faulthandler.enable()
else:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGBUS})
os.truncate(tmp, 4096 * 4)
try:
    t.gather(np.arange(t.rows - 64, t.rows, dtype=np.int64))
    print("no error")
except pleio.Error as e:
    print("error:", type(e).__name__, str(e)[:60])
print("guard", t.sigbus_guard, "stats", {k: v for k, v in t.stats().items() if k.startswith("guard")})
"""
for how in ["faulthandler", "blocked"]:
    rc, out = child(GUARD, work / "q.gguf", work / f"shrink_{how}.gguf", how)
    ok = rc == 0 and "error:" in out
    line(f"6: SIGBUS guard, {how}", ok, f"rc {rc}: {' / '.join(out.splitlines()[-2:])[:160]}")

# Medium 14 (Python): each `cached` table cost 26-43 MB at the default budget.
CACHED = """
import sys, numpy as np, pleio
def rss():
    for l in open("/proc/self/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1])
path = sys.argv[1]
pleio.open(path, strategy="cached").gather(np.array([1], dtype=np.int64))
before = rss()
tables = [pleio.open(path, strategy="cached") for _ in range(8)]
for t in tables:
    t.gather(np.arange(100, dtype=np.int64))
print((rss() - before) // 1024)
"""
rc, out = child(CACHED, work / "q.gguf")
grew = int(last(out)) if rc == 0 and last(out).isdigit() else None
line("14 (Python): memory of cached tables", grew is not None and grew < 64,
     f"8 cached tables (256 MiB budget each), 100 rows each: RSS grew {grew} MiB (was 26-43 MB a table)")

# Low: panics reached Python as BaseException (PanicException).
PANIC = """
import pleio
try:
    pleio._pleio._panic_for_test("boom")
except pleio.Error as e:
    print("pleio.Error", e.kind, isinstance(e, Exception))
"""
rc, out = child(PANIC)
line("Low: panic at the Python boundary", rc == 0 and out.startswith("pleio.Error internal True"),
     f"rc {rc}: {last(out)[:100]}")

sys.exit(1 if failures else 0)
