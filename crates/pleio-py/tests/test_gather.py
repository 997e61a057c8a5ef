"""gather: every dtype bit for bit against the CLI (and gguf-py), every way
of passing ids and out."""

import array

import numpy as np
import pytest

import pleio


def bf16_bits(f32: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (no NaN here)."""
    assert not np.isnan(f32).any()
    u = f32.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class DLPackOnly:
    """A tensor-like object reachable only through __dlpack__ (as a CPU
    torch tensor is): no buffer protocol, not an ndarray."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.mark.parametrize("name", ["q", "q8", "bf16", "g"])
def test_float32_equals_cli_and_gguf_py(tables, name, tmp_path):
    import gguf
    from gguf.quants import dequantize

    fx = tables[name]
    rng = np.random.default_rng(7)
    ids = np.concatenate([rng.integers(0, fx.rows, 150), [fx.rows - 1, 0, 0]])
    t = pleio.open(fx.path)
    got = t.gather(ids)
    assert got.dtype == np.float32 and got.shape == (len(ids), fx.row_elems)
    assert got.flags.c_contiguous
    want = fx.cli_rows(ids, tmp_path)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    reader = gguf.GGUFReader(fx.path)
    tensor = next(x for x in reader.tensors if x.name == "per_layer_token_embd.weight")
    ref = dequantize(np.asarray(tensor.data)[ids], tensor.tensor_type).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), ref.reshape(got.shape).view(np.uint32))


@pytest.mark.parametrize("name", ["q", "q8", "bf16"])
def test_16_bit_and_raw_equal_cli(tables, name, tmp_path):
    fx = tables[name]
    rng = np.random.default_rng(8)
    ids = rng.integers(0, fx.rows, 100)
    t = pleio.open(fx.path)
    f32 = fx.cli_rows(ids, tmp_path)

    bf = t.gather(ids, dtype="bfloat16")
    assert bf.shape == f32.shape and bf.dtype.itemsize == 2
    assert np.array_equal(bf.view(np.uint16), bf16_bits(f32))

    f16 = t.gather(ids, dtype="float16")
    assert f16.dtype == np.float16
    with np.errstate(over="ignore"):  # bf16 values past float16's range become inf
        want16 = f32.astype(np.float16)
    assert np.array_equal(f16.view(np.uint16), want16.view(np.uint16))

    raw = t.gather(ids, dtype="raw")
    assert raw.dtype == np.uint8 and raw.shape == (len(ids), fx.row_bytes)
    assert np.array_equal(raw, fx.raw_rows(ids))
    if name == "bf16":
        # a bf16 table's bfloat16 output is its stored bits
        assert np.array_equal(bf.view(np.uint8).reshape(raw.shape), raw)


def test_bfloat16_is_ml_dtypes_when_importable(q):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    got = pleio.open(q.path).gather([1, 2], dtype="bfloat16")
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    # values, not only bits: bfloat16 -> float32 is exact
    f32 = pleio.open(q.path).gather([1, 2])
    assert np.array_equal(got.astype(np.float32).view(np.uint32), (bf16_bits(f32).astype(np.uint32) << 16))


def test_dtype_spellings(q):
    t = pleio.open(q.path)
    ref = t.gather([5, 6])
    for d in ("f32", "float32", np.float32, np.dtype("float32")):
        assert np.array_equal(t.gather([5, 6], dtype=d), ref)
    assert np.array_equal(t.gather([5, 6], dtype=np.float16), t.gather([5, 6], dtype="f16"))
    assert np.array_equal(t.gather([5, 6], dtype="uint8"), t.gather([5, 6], dtype="raw"))
    with pytest.raises(ValueError, match="dtype"):
        t.gather([5], dtype="int7")


def test_every_strategy_equal(q, ids):
    ref = pleio.open(q.path).gather(ids)
    for s in ("fault", "advise", "pread", "uring", "uring-direct", "pool", "auto"):
        t = pleio.open(q.path, strategy=s)
        assert t.strategy == s
        assert np.array_equal(t.gather(ids).view(np.uint32), ref.view(np.uint32)), s


def test_cached_budget(q, ids):
    ref = pleio.open(q.path).gather(ids)
    t = pleio.open(q.path, strategy="cached", budget=1 << 20)
    assert np.array_equal(t.gather(ids).view(np.uint32), ref.view(np.uint32))
    assert np.array_equal(t.gather(ids).view(np.uint32), ref.view(np.uint32))
    st = t.stats()  # the second gather is served from the budgeted cache
    assert st["rows"] == 2 * len(ids) and st["cold_rows"] <= len(ids)
    with pytest.raises(pleio.SetupError, match="budget|smallest"):
        pleio.open(q.path, strategy="cached", budget=1)


def test_shared_cache(q, ids):
    ref = pleio.open(q.path).gather(ids)
    a = pleio.open(q.path, cache="shared", budget=1 << 20)
    b = pleio.open(q.path, strategy="shared")
    assert a.strategy == "shared"
    assert pleio.open(q.path, cache="private").strategy == "cached"
    for t in (a, b, a):  # b attaches to the segment a made
        assert np.array_equal(t.gather(ids).view(np.uint32), ref.view(np.uint32))
    with pytest.raises(ValueError, match="cache"):
        pleio.open(q.path, cache="bogus")
    with pytest.raises(ValueError, match="cache"):
        pleio.open(q.path, cache="shared", strategy="pread")


def test_ids_in_every_form(q, ids):
    t = pleio.open(q.path)
    ref = t.gather(ids)
    lst = [int(i) for i in ids]
    forms = [
        lst,
        tuple(lst),
        ids.astype(np.int64),
        ids.astype(np.int32),
        ids.astype(np.uint32),
        ids.astype(np.uint64),
        ids.astype(np.uint16),
        ids.astype(np.int64)[::-1][::-1].copy(),
        np.repeat(ids.astype(np.int64), 2)[::2],  # not contiguous
        array.array("q", lst),
        memoryview(array.array("i", lst)),
        DLPackOnly(ids.astype(np.int64)),
        DLPackOnly(ids.astype(np.int32)),
    ]
    for f in forms:
        assert np.array_equal(t.gather(f), ref), type(f)
    assert t.gather(range(3, 6)).shape == (3, q.row_elems)
    assert t.gather([]).shape == (0, q.row_elems)


def test_bad_ids_types(q):
    t = pleio.open(q.path)
    with pytest.raises(TypeError):
        t.gather([1, 2.5])
    with pytest.raises(TypeError):
        t.gather(np.array([1.0, 2.0]))
    with pytest.raises(TypeError):
        t.gather("12")
    # any shape: the result is ids.shape + (row_elems,), rows in C order
    two = np.array([[1, 2], [3, 1]], dtype=np.int64)
    got = t.gather(two)
    assert got.shape == (2, 2, q.row_elems)
    assert np.array_equal(got.reshape(4, -1), t.gather(two.ravel()))
    assert t.gather(np.asfortranarray(two)).shape == (2, 2, q.row_elems)
    assert np.array_equal(t.gather(np.asfortranarray(two)), got)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "raw"])
def test_out_numpy_in_place(q, ids, dtype):
    t = pleio.open(q.path)
    ref = t.gather(ids, dtype=dtype)
    out = np.empty_like(ref)
    got = t.gather(ids, out=out, dtype=dtype)
    assert got is out
    assert np.array_equal(out.view(np.uint8), ref.view(np.uint8))
    # any shape with the exact element count, e.g. flat
    flat = np.empty(ref.size, dtype=ref.dtype)
    t.gather(ids, out=flat, dtype=dtype)
    assert np.array_equal(flat.view(np.uint8), ref.reshape(-1).view(np.uint8))


def test_out_16_bit_as_uint16_bits(q, ids):
    t = pleio.open(q.path)
    for dtype in ("bfloat16", "float16"):
        ref = t.gather(ids, dtype=dtype)
        bits = np.zeros(ref.shape, dtype=np.uint16)
        assert t.gather(ids, out=bits, dtype=dtype) is bits
        assert np.array_equal(bits, ref.view(np.uint16))


def test_out_buffers_and_dlpack(q, ids):
    t = pleio.open(q.path)
    ref = t.gather(ids)
    # a memoryview of float32, a bytearray for raw, a torch-like __dlpack__ tensor
    backing = bytearray(ref.nbytes)
    mv = memoryview(backing).cast("f")
    assert t.gather(ids, out=mv) is mv
    assert np.frombuffer(backing, dtype=np.float32).tobytes() == ref.tobytes()
    raw = bytearray(len(ids) * q.row_bytes)
    t.gather(ids, out=raw, dtype="raw")
    assert bytes(raw) == t.gather(ids, dtype="raw").tobytes()
    pinned = np.zeros(ref.shape, dtype=np.float32)
    tensor = DLPackOnly(pinned)
    assert t.gather(ids, out=tensor) is tensor
    assert np.array_equal(pinned, ref)


def test_bad_out_raises_before_anything_is_written(q, ids):
    t = pleio.open(q.path)
    n, e = len(ids), q.row_elems
    cases = [
        (np.full((n, e + 1), 7, np.float32), "float32", "elements"),  # wrong size
        (np.full((n - 1, e), 7, np.float32), "float32", "elements"),
        (np.full((n, e), 7, np.float64), "float32", "dtype"),  # wrong dtype
        (np.full((n, e), 7, np.int32), "float32", "dtype"),
        (np.full((n, e), 7, np.float32), "float16", "dtype"),
        (np.full((n, e), 7, np.int16), "bfloat16", "dtype"),
        (np.full((n, q.row_bytes), 7, np.int8), "raw", "dtype"),
        (np.full((n, 2 * e), 7, np.float32)[:, ::2], "float32", "contiguous"),  # strided
        (np.full((e, n), 7, np.float32).T, "float32", "contiguous"),  # Fortran order
        (np.full((n, e), 7, np.float32).astype(">f4"), "float32", "dtype"),  # byte order
    ]
    for out, dtype, what in cases:
        before = out.copy()
        with pytest.raises(pleio.OutputError, match=what) as ei:
            t.gather(ids, out=out, dtype=dtype)
        assert isinstance(ei.value, ValueError) and isinstance(ei.value, pleio.Error)
        assert np.array_equal(out, before), (dtype, what)
    ro = np.full((n, e), 7, np.float32)
    ro.flags.writeable = False
    with pytest.raises(pleio.OutputError, match="written"):
        t.gather(ids, out=ro)
    assert (ro == 7).all()
    with pytest.raises(pleio.OutputError):
        t.gather(ids, out=DLPackOnly(ro))
    with pytest.raises(pleio.OutputError):
        t.gather(ids, out=bytes(n * e * 4))  # read-only buffer
    with pytest.raises(TypeError):
        t.gather(ids, out=[0.0] * (n * e))


def test_table_attributes(q):
    t = pleio.open(q.path)
    assert (t.rows, t.row_elems, t.row_bytes) == (q.rows, q.row_elems, q.row_bytes)
    assert t.encoding == q.info["type"] == "IQ4_NL"
    assert t.tensor == "per_layer_token_embd.weight"
    assert str(t.path) == str(q.path)
    r = repr(t)
    for part in ("IQ4_NL", f"rows={q.rows}", f"row_elems={q.row_elems}", "strategy=auto"):
        assert part in r
    assert pleio.open(str(q.path)).rows == q.rows


def test_version_matches_the_crate():
    import re
    from pathlib import Path

    cargo = (Path(__file__).resolve().parents[3] / "Cargo.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', cargo, re.M).group(1) == pleio.__version__


def test_stats_count_gathers(q):
    t = pleio.open(q.path)
    s0 = t.stats()
    assert s0["gathers"] == 0 and s0["rows"] == 0
    t.gather([1, 2, 3])
    t.gather([4], dtype="raw")
    s = t.stats()
    assert s["gathers"] == 2 and s["rows"] == 4 and s["bytes"] == 4 * q.row_bytes
    assert set(s) >= {"cold_rows", "read_requests", "read_bytes", "found_resident"}


def test_open_tensor(q):
    t = pleio.open(q.path, tensor="per_layer_token_embd.weight")
    assert t.rows == q.rows
