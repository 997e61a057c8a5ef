"""The documented exceptions, with nothing written to out."""

import os
import shutil

import numpy as np
import pytest

import pleio


def test_hierarchy():
    assert issubclass(pleio.Error, Exception)
    pairs = [
        (pleio.RowOutOfRangeError, (IndexError, ValueError)),
        (pleio.NotFoundError, (FileNotFoundError, OSError)),
        (pleio.ReadError, (OSError,)),
        (pleio.InvalidFileError, (ValueError,)),
        (pleio.OutputError, (ValueError,)),
        (pleio.SetupError, (RuntimeError,)),
    ]
    for cls, builtins in pairs:
        assert issubclass(cls, pleio.Error)
        for b in builtins:
            assert issubclass(cls, b), (cls, b)
        assert cls.__module__ == "pleio"


@pytest.mark.parametrize("bad", [5000, 5001, 2**40, -1, -5000])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "raw"])
def test_out_of_range_ids(q, bad, dtype):
    t = pleio.open(q.path)
    ids = [0, 1, bad, 2]  # the bad id after good ones: still nothing written
    ref = t.gather([0, 1, 0, 2], dtype=dtype)
    out = np.full_like(ref, 0x5A) if ref.dtype.itemsize != 2 else np.full(ref.shape, 0x5A5A, np.uint16)
    before = out.copy()
    for form in (ids, np.array(ids, dtype=np.int64)):
        with pytest.raises(pleio.RowOutOfRangeError) as ei:
            t.gather(form, out=out, dtype=dtype)
        e = ei.value
        assert isinstance(e, IndexError) and isinstance(e, ValueError) and isinstance(e, pleio.Error)
        assert str(bad) in str(e) and str(q.rows) in str(e), str(e)
        assert e.kind == "row_out_of_range"
        assert np.array_equal(out, before)
    with pytest.raises(IndexError):
        t.gather(ids, dtype=dtype)


def test_negative_int32_ids(q):
    t = pleio.open(q.path)
    with pytest.raises(pleio.RowOutOfRangeError, match="-3"):
        t.gather(np.array([1, -3], dtype=np.int32))
    # prefetch checks ids when called, in every integer form
    for bad in ([q.rows], np.array([q.rows], dtype=np.uint64), np.array([-1], dtype=np.int64)):
        with pytest.raises(pleio.RowOutOfRangeError):
            t.prefetch(bad)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(pleio.NotFoundError) as ei:
        pleio.open(missing)
    assert isinstance(ei.value, FileNotFoundError)
    assert "nope.gguf" in str(ei.value)
    with pytest.raises(FileNotFoundError):
        pleio.open(str(missing))


def test_bad_files(q, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a gguf file" * 10)
    with pytest.raises(pleio.InvalidFileError) as ei:
        pleio.open(junk)
    assert isinstance(ei.value, ValueError) and "junk.gguf" in str(ei.value)
    # a header cut short
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(q.path.read_bytes()[:100])
    with pytest.raises(pleio.InvalidFileError):
        pleio.open(cut)
    with pytest.raises(pleio.InvalidFileError, match="no_such.weight"):
        pleio.open(q.path, tensor="no_such.weight")
    with pytest.raises(ValueError, match="strategy"):
        pleio.open(q.path, strategy="warp")


def test_read_error_names_path_and_offset(q, tmp_path):
    # A file that shrinks after opening: the direct strategies report the
    # read that came up short (an OSError), never SIGBUS.
    f = tmp_path / "shrinks.gguf"
    shutil.copy(q.path, f)
    t = pleio.open(f, strategy="pread")
    last = q.rows - 1
    os.truncate(f, q.offset + (q.rows // 2) * q.row_bytes)
    out = np.full((1, q.row_elems), 3.0, np.float32)
    with pytest.raises(pleio.ReadError) as ei:
        t.gather([last], out=out)
    e = ei.value
    assert isinstance(e, OSError) and isinstance(e, pleio.Error)
    assert "shrinks.gguf" in str(e) and e.kind == "io"
    assert e.offset is not None and str(e.offset) in str(e)
    assert (out == 3.0).all()


def test_tokens_must_be_token_ids(q):
    seq = pleio.open(q.path).sequence()
    with pytest.raises(ValueError, match="-1"):
        seq.map([5, -1])
    with pytest.raises(TypeError):
        seq.map([1.5])
