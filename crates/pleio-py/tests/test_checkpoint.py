"""Checkpoints through the Python door: pleio.open on a safetensors
checkpoint (directory, index, one file) gathers what `pleio gather` gives,
in every dtype and strategy, and maps row ids as `pleio rows` does."""

import json

import numpy as np
import pytest

import pleio
from conftest import cli

STRATEGIES = ["fault", "advise", "pread", "uring", "uring-direct", "pool", "auto", "cached"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    out = {}
    for enc, files in [("fp8", "2"), ("mlx4", "3"), ("nvfp4", "1"), ("bf16", "2")]:
        path = d / enc
        cli("synth", "--format", "safetensors", "--encoding", enc, "--rows", "6000",
            "--files", files, "--seed", "5", "-o", path)
        out[enc] = path
    return out


def cli_gather(path, ids, dtype, tmp_path):
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(" ".join(str(int(i)) for i in ids))
    out = tmp_path / f"rows-{dtype}.npy"
    cli("gather", path, "--rows-file", ids_file, "--dtype", dtype, "--format", "npy",
        "-o", out, "--force")
    return np.load(out)


@pytest.mark.parametrize("enc", ["fp8", "mlx4", "nvfp4", "bf16"])
def test_checkpoint_gathers_equal_cli(checkpoints, enc, tmp_path):
    path = checkpoints[enc]
    info = json.loads(cli("inspect", "--json", path))["table"]
    t = pleio.open(path)
    assert (t.rows, t.row_elems, t.row_bytes) == (info["rows"], 160, info["row_bytes"])
    assert t.encoding == enc
    assert enc in repr(t)
    rng = np.random.default_rng(12)
    ids = np.concatenate([rng.integers(0, t.rows, 300), [t.rows - 1, 0, 0]])
    f32 = cli_gather(path, ids, "f32", tmp_path)
    bf16 = cli_gather(path, ids, "bf16", tmp_path)
    raw = cli_gather(path, ids, "raw", tmp_path)
    for s in STRATEGIES:
        ts = pleio.open(path, strategy=s)
        got = ts.gather(ids)
        assert np.array_equal(got.view(np.uint32), f32.view(np.uint32)), s
        b = ts.gather(ids, dtype="bfloat16")
        assert np.array_equal(b.view(np.uint16), bf16.view(np.uint16)), s
        r = ts.gather(ids, dtype="raw")
        assert r.shape == (len(ids), t.row_bytes) and np.array_equal(r, raw), s
    # out= in place, and the lookahead worker
    buf = np.empty((len(ids), 160), dtype=np.float32)
    t.gather(ids, out=buf)
    assert np.array_equal(buf.view(np.uint32), f32.view(np.uint32))
    assert np.array_equal(t.prefetch(ids).wait().view(np.uint32), f32.view(np.uint32))


def test_checkpoint_opens_from_index_and_file(checkpoints):
    d = checkpoints["nvfp4"]  # one file
    t = pleio.open(d)
    ids = [0, 17, t.rows - 1]
    want = t.gather(ids)
    for p in [d / "model.safetensors.index.json", next(d.glob("*.safetensors"))]:
        assert np.array_equal(pleio.open(p).gather(ids).view(np.uint32), want.view(np.uint32)), p


def test_checkpoint_row_ids_equal_cli(checkpoints, tmp_path):
    path = checkpoints["fp8"]
    rng = np.random.default_rng(13)
    tokens = [int(x) for x in rng.integers(0, 200000, 40)]
    f = tmp_path / "tokens.txt"
    f.write_text(" ".join(map(str, tokens)))
    want = np.array(json.loads(cli("rows", path, "--tokens", f, "--json"))["rows"], dtype=np.int64)
    t = pleio.open(path)
    assert np.array_equal(pleio.row_ids(t, tokens), want)
    assert np.array_equal(t.sequence().map(tokens), want)


def test_checkpoint_out_of_range_names_the_row(checkpoints):
    t = pleio.open(checkpoints["mlx4"])
    buf = np.full((2, 160), 7.0, dtype=np.float32)
    with pytest.raises(IndexError, match=str(t.rows)):
        t.gather([0, t.rows], out=buf)
    assert (buf == 7.0).all()
