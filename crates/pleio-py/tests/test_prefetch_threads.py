"""prefetch / wait, and one Table from many threads at once."""

import threading

import numpy as np
import pytest

import pleio


def test_prefetch_wait(q, ids):
    t = pleio.open(q.path)
    ref = t.gather(ids)
    p = t.prefetch(ids)
    got = p.wait()
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.array_equal(got, ref)
    with pytest.raises(ValueError, match="already"):
        p.wait()
    # into out, several in flight, waited out of order
    ps = [t.prefetch(ids[k:k + 20]) for k in range(0, 100, 20)]
    outs = [np.zeros((20, q.row_elems), np.float32) for _ in ps]
    for k in reversed(range(len(ps))):
        assert ps[k].wait(out=outs[k]) is outs[k]
    assert np.array_equal(np.concatenate(outs), ref[:100])
    # a bad out: an error, nothing written
    p = t.prefetch(ids)
    bad = np.full((len(ids) - 1, q.row_elems), 2.0, np.float32)
    with pytest.raises(pleio.OutputError):
        p.wait(out=bad)
    assert (bad == 2.0).all()
    assert np.array_equal(p.wait(), ref)  # still waitable after a bad out
    # dropped unawaited: fine
    t.prefetch(ids)
    assert np.array_equal(t.prefetch(ids[:3]).wait(), ref[:3])


def test_prefetch_ready(q):
    t = pleio.open(q.path)
    p = t.prefetch([1, 2, 3])
    p.wait()
    assert p.ready() is False  # waited for: nothing pending any more


def test_eight_threads_stay_exact(q):
    t = pleio.open(q.path)
    everything = t.gather(np.arange(q.rows))
    errors = []
    barrier = threading.Barrier(8)

    def work(k):
        try:
            rng = np.random.default_rng(100 + k)
            barrier.wait()
            for r in range(60):
                ids = rng.integers(0, q.rows, int(rng.integers(1, 300)))
                if r % 3 == 0:
                    got = t.gather(ids.astype(np.int32))
                elif r % 3 == 1:
                    got = np.empty((len(ids), q.row_elems), np.float32)
                    t.gather(ids, out=got)
                else:
                    got = t.prefetch(ids).wait()
                if not np.array_equal(got, everything[ids]):
                    errors.append(f"thread {k} round {r}: rows differ")
                raw = t.gather(ids[:8], dtype="raw")
                if raw.shape != (min(8, len(ids)), q.row_bytes):
                    errors.append(f"thread {k}: raw shape {raw.shape}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {k}: {e!r}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
