"""The SIGBUS guard inside a Python process: a table file cut under a mapped
gather is a ReadError whatever CPython's faulthandler did to the SIGBUS
handler (enabled before pleio, disabled after, enabled after import), and a
SIGBUS sent with kill while a thread gathers goes to the host's handler, not
into a fake read error.

Each case runs in a fresh interpreter (signal handlers are process-wide, and
pytest enables faulthandler in its own process); a case that dies by a signal
fails with the signal number."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

# What every case starts with: a copy of the table it may cut, opened with a
# mapped strategy, and helpers.
PRELUDE = """
import os, shutil, signal, sys, threading, time
import numpy as np

src, work, rows, offset = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
path = os.path.join(work, "cut.gguf")
shutil.copy(src, path)

def guard_stats(t):
    s = t.stats()
    return s["guard_displaced"], s["guard_reinstalled"], s["guard_fallbacks"]

def open_all():
    # The table with each mapped strategy (opened before the cut: the
    # header check refuses a table past the file's end).
    import pleio
    return [pleio.open(path, strategy=s) for s in ("fault", "advise", "auto")]

def cut_and_gather(tables):
    # Cuts the file at the table's start: every gather is a ReadError.
    import pleio
    os.truncate(path, offset)
    for t in tables:
        try:
            t.gather([rows - 1])
        except pleio.ReadError as e:
            assert "cut.gguf" in str(e) and e.offset is not None, e
        else:
            raise AssertionError("a gather past the cut succeeded")
"""


def run(q, tmp_path, body: str):
    code = PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n"
    r = subprocess.run(
        [sys.executable, "-c", code, str(q.path), str(tmp_path), str(q.rows), str(q.offset)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    died = f" (killed by {signal.Signals(-r.returncode).name})" if r.returncode < 0 else ""
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
        f"exit {r.returncode}{died}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    )


def test_faulthandler_enabled_before_import(q, tmp_path):
    run(q, tmp_path, """
        import faulthandler
        faulthandler.enable()
        import pleio
        t, *others = open_all()
        assert t.gather([0, rows - 1]).shape == (2, t.row_elems)
        assert guard_stats(t) == (0, 0, 0)
        cut_and_gather([t, *others])
    """)


def test_faulthandler_disabled_after_pleio_installed_its_handler(q, tmp_path):
    # faulthandler.disable() puts back what it found: the default
    # disposition, over pleio's handler. The next gather installs it again.
    run(q, tmp_path, """
        import faulthandler
        faulthandler.enable()
        import pleio
        t, *others = open_all()
        t.gather([0, rows - 1])
        faulthandler.disable()
        t.gather([0, rows - 1])
        assert guard_stats(t) == (1, 1, 0), guard_stats(t)
        cut_and_gather([t, *others])
    """)


def test_faulthandler_enabled_after_import(q, tmp_path):
    # faulthandler's handler, installed after pleio's, is left in place: the
    # mapped strategies read with pread until pleio's is back.
    run(q, tmp_path, """
        import faulthandler
        import pleio
        t, *others = open_all()
        want = t.gather([0, rows - 1])
        faulthandler.enable()
        got = t.gather([0, rows - 1])
        assert (got == want).all()
        assert guard_stats(t) == (1, 0, 1), guard_stats(t)
        cut_and_gather([t, *others])
        # faulthandler.disable() puts pleio's handler back: mapped again.
        faulthandler.disable()
        shutil.copy(src, path)
        before = guard_stats(t)
        assert (t.gather([0, rows - 1]) == want).all()
        assert guard_stats(t) == before, guard_stats(t)
    """)


def test_faulthandler_toggled_many_times(q, tmp_path):
    run(q, tmp_path, """
        import faulthandler
        import pleio
        tables = open_all()
        ids = list(range(0, rows, 7))
        want = tables[0].gather(ids)
        for i in range(20):
            (faulthandler.enable if i % 2 == 0 else faulthandler.disable)()
            for t in tables:
                assert (t.gather(ids) == want).all()
        faulthandler.enable()
        cut_and_gather(tables)
    """)


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="no signal.pthread_kill")
def test_sigbus_sent_with_kill_reaches_the_host_handler(q, tmp_path):
    # The host's handler (Python's, set before pleio's first gather) gets
    # every SIGBUS sent to a gathering thread; no gather fails for it.
    run(q, tmp_path, """
        got = []
        signal.signal(signal.SIGBUS, lambda sig, frame: got.append(sig))
        import pleio
        t, *others = open_all()
        ids = np.arange(rows, dtype=np.uint64)
        want = t.gather(ids)
        stop, errors, started = threading.Event(), [], threading.Event()
        def worker():
            out = np.empty_like(want)
            started.set()
            while not stop.is_set():
                try:
                    t.gather(ids, out=out)
                    if not (out == want).all():
                        errors.append("wrong rows")
                except Exception as e:
                    errors.append(repr(e))
        th = threading.Thread(target=worker)
        th.start()
        started.wait()
        sent = 0
        deadline = time.monotonic() + 60
        while sent < 200 and not errors:
            signal.pthread_kill(th.ident, signal.SIGBUS)
            sent += 1
            # One at a time: a signal sent while one is pending merges.
            while len(got) < sent:
                assert time.monotonic() < deadline, f"signal {sent} never reached the handler"
                time.sleep(0.0002)
        stop.set()
        th.join()
        assert not errors, errors[:3]
        assert len(got) == sent, (len(got), sent)
        # The host's handler, there first, never sees pleio's own faults.
        cut_and_gather([t, *others])
        assert len(got) == sent, (len(got), sent)
    """)


def test_sigbus_guard_answers_what_the_host_did(q, tmp_path):
    # Table.sigbus_guard: active once pleio's handler is in, displaced while
    # faulthandler's (installed after it) is, active again when faulthandler
    # puts pleio's back.
    run(q, tmp_path, """
        import faulthandler
        faulthandler.disable()
        import pleio
        t = pleio.open(path, strategy="fault")
        t.gather([0])
        assert t.sigbus_guard == "active", t.sigbus_guard
        faulthandler.enable()
        assert t.sigbus_guard == "displaced", t.sigbus_guard
        faulthandler.disable()
        assert t.sigbus_guard == "active", t.sigbus_guard
    """)
