"""Concurrency and fork(): ids changed by another thread during a gather,
tables used across os.fork() and multiprocessing's fork start method, and
panics at the boundary. Each scenario that could crash or hang runs in a
child interpreter with a timeout, so a regression fails the test (a signal
or the timeout) instead of killing or hanging pytest. Time budgets are
fixed and short (PLEIO_STRESS_SECONDS, default 1 s per scenario): these are
stress runs, not timings."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pleio
from conftest import synth

SECONDS = float(os.environ.get("PLEIO_STRESS_SECONDS", "1"))
# Far above a normal run: only a hang reaches it.
TIMEOUT = 120


def run_child(code: str, *args) -> str:
    """Runs `code` in a fresh interpreter (this one's pleio) and returns its
    stdout; a crash (signal), a hang (timeout) or a non-zero exit fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        r = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=env,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {TIMEOUT} s:\n{e.stdout}\n{e.stderr}")
    assert r.returncode == 0, f"exit status {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="session")
def big(tmp_path_factory):
    # Big enough that sparse ids make many separate reads (the pool's
    # threads and the ring are used, not an inline read), on the
    # temporary directory's file system.
    return synth(tmp_path_factory.mktemp("big") / "big.gguf", "--rows", "200000", "--seed", "31")


MUTATE = """
import sys, threading, time
import numpy as np
import pleio

path, strategy, dtype, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
t = pleio.open(path, strategy=strategy)
n = 1 << 20
valid = ((np.arange(n, dtype=np.uint64) * 7919) % t.rows).astype(dtype)
bad = np.full(n, 1 << 40, dtype=dtype)
ids = valid.copy()
want = t.gather(valid, dtype="raw")
stop = threading.Event()

def flip():
    while not stop.is_set():
        ids[:] = bad
        ids[:] = valid

th = threading.Thread(target=flip)
th.start()
out = np.empty_like(want)
ok = refused = 0
end = time.monotonic() + seconds
try:
    while time.monotonic() < end or ok + refused < 3:
        try:
            t.gather(ids, out=out, dtype="raw")
        except pleio.RowOutOfRangeError:
            refused += 1
            continue
        # a success gathered only valid ids: exactly the valid snapshot
        assert np.array_equal(out, want), "rows of no consistent snapshot"
        ok += 1
finally:
    stop.set()
    th.join()
print(ok, refused)
"""


@pytest.mark.parametrize("strategy", ["fault", "advise", "auto", "cached"])
@pytest.mark.parametrize("dtype", ["uint64", "int64"])
def test_ids_changed_by_another_thread_never_crash(q, strategy, dtype):
    # Another thread flips a 1M-id array between valid ids and 2^40 while
    # this one gathers it. Before the ids were copied once, checked ids
    # were read again by the gather: SIGSEGV within seconds (fault, advise,
    # auto). Now each gather succeeds with the valid rows or raises
    # RowOutOfRangeError.
    ok, refused = map(int, run_child(MUTATE, q.path, strategy, dtype, SECONDS).split())
    assert ok + refused >= 3


def test_ids_changed_during_torch_gather_never_crash(q):
    torch = pytest.importorskip("torch")
    del torch
    code = MUTATE.replace("import pleio\n", "import pleio, torch, pleio.torch\n").replace(
        "t.gather(ids, out=out, dtype=\"raw\")",
        "pleio.torch.gather(t, tids, dtype=torch.uint8, out=tout)",
    ).replace(
        "out = np.empty_like(want)",
        "out = np.empty_like(want); tout = torch.from_numpy(out); tids = torch.from_numpy(ids.view(np.int64))",
    )
    ok, refused = map(int, run_child(code, q.path, "fault", "int64", SECONDS).split())
    assert ok + refused >= 3


FORK = """
import os, sys
import numpy as np
import pleio

path, strategy = sys.argv[1], sys.argv[2]
t = pleio.open(path, strategy=strategy)
ids = (np.arange(3000, dtype=np.int64) * 67) % t.rows
want = pleio.open(path, strategy="pread").gather(ids)
# the backend's threads or ring, and the prefetch worker, exist before the fork
assert np.array_equal(t.gather(ids), want)
assert np.array_equal(t.prefetch(ids).wait(), want)
pending = t.prefetch(ids)
kids = []
for k in range(2):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for _ in range(4):
                assert np.array_equal(t.gather(ids), want)
                assert np.array_equal(t.prefetch(ids).wait(), want)
            # the parent's batch: an error at once, not a wait forever
            try:
                pending.wait()
                code = 4
            except pleio.SetupError as e:
                assert "fork" in str(e), e
        except BaseException as e:
            print("child:", repr(e), flush=True)
            code = 3
        os._exit(code)
    kids.append(pid)
for _ in range(4):
    assert np.array_equal(t.gather(ids), want)
    assert np.array_equal(t.prefetch(ids).wait(), want)
assert np.array_equal(pending.wait(), want)
for pid in kids:
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
print("ok")
"""


@pytest.mark.parametrize("strategy", ["uring-direct", "uring", "pool", "auto", "cached"])
def test_tables_work_across_os_fork(big, strategy):
    # Before: uring-direct and uring hung parent and children on the shared
    # ring; pool and prefetch().wait() hung in the child.
    assert run_child(FORK, big.path, strategy).strip().endswith("ok")


FORK_MID_READ = """
import os, sys, time
import numpy as np
import pleio

path, strategy = sys.argv[1], sys.argv[2]
t = pleio.open(path, strategy=strategy)
ref = pleio.open(path, strategy="pread")
assert np.array_equal(t.gather(np.arange(64)), ref.gather(np.arange(64)))
for r in range(6):
    # rows this handle has not read yet: the worker claims them and holds
    # staging while it reads, and the fork lands at some point of that
    ids = (np.arange(40000, dtype=np.int64) * (2 * r + 7919) + r) % t.rows
    want = ref.gather(ids)
    pending = t.prefetch(ids)
    time.sleep(0.002 * r)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            assert np.array_equal(t.gather(ids), want)
        except BaseException as e:
            print("child:", repr(e), flush=True)
            code = 3
        os._exit(code)
    assert np.array_equal(pending.wait(), want)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, (r, status)
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise SystemExit(f"round {r}: the child hung")
        time.sleep(0.01)
print("ok")
"""


@pytest.mark.parametrize("strategy", ["cached", "shared", "auto"])
def test_a_child_forked_in_the_middle_of_a_read_gathers(big, strategy):
    # Before: a child forked while the parent's prefetch worker had rows of
    # the `cached` strategy's row cache claimed (or its staging on loan)
    # waited forever for that worker, which the child does not have
    # (8 of 10 such forks hung).
    assert run_child(FORK_MID_READ, big.path, strategy).strip().endswith("ok")


POOL = """
import multiprocessing as mp, sys
import numpy as np
import pleio

path, strategy = sys.argv[1], sys.argv[2]
t = pleio.open(path, strategy=strategy)
ids = (np.arange(3000, dtype=np.int64) * 67) % t.rows
want = t.gather(ids)
assert np.array_equal(t.prefetch(ids).wait(), want)

def work(k):
    got = t.gather(ids[k:]) if k % 2 else t.prefetch(ids[k:]).wait()
    return bool(np.array_equal(got, want[k:]))

if __name__ == "__main__":
    with mp.get_context("fork").Pool(3) as pool:
        assert all(pool.map(work, range(12)))
    print("ok")
"""


@pytest.mark.parametrize("strategy", ["uring-direct", "pool", "auto"])
def test_tables_work_in_multiprocessing_fork_workers(big, strategy):
    assert run_child(POOL, big.path, strategy).strip().endswith("ok")


def test_a_panic_is_a_pleio_error_not_a_base_exception():
    with pytest.raises(pleio.Error) as e:
        pleio._pleio._panic_for_test("boom")
    assert isinstance(e.value, Exception)
    assert e.value.kind == "internal"
    assert "boom" in str(e.value)


def test_threads_gathering_while_others_change_their_ids(q):
    # The in-process variant (no crash is possible any more): threads share
    # one table; half keep changing the arrays the other half gather from,
    # between two valid id sets. Every result is one of the two snapshots'
    # rows or, when an id is caught mid-change, a mix of their rows, never
    # anything else; nothing raises.
    import threading
    import time

    t = pleio.open(q.path, strategy="auto")
    a = (np.arange(4096, dtype=np.int64) * 13) % q.rows
    b = (np.arange(4096, dtype=np.int64) * 29 + 7) % q.rows
    ra, rb = t.gather(a), t.gather(b)
    arrays = [a.copy() for _ in range(2)]
    stop = threading.Event()
    errors = []

    def mutate(arr):
        while not stop.is_set():
            arr[:] = b
            arr[:] = a

    def gather(arr):
        try:
            while not stop.is_set():
                got = t.gather(arr)
                row_ok = np.all((got == ra) | (got == rb), axis=1)
                if not row_ok.all():
                    errors.append("a row of neither snapshot")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=mutate, args=(x,)) for x in arrays]
    threads += [threading.Thread(target=gather, args=(x,)) for x in arrays]
    for th in threads:
        th.start()
    time.sleep(SECONDS)
    stop.set()
    for th in threads:
        th.join()
    assert errors == []
