"""Checkpoints through the Python door: pleio.open on a safetensors
checkpoint (directory, index, one file) gathers what `pleio gather` gives,
in every dtype and strategy, and maps row ids as `pleio rows` does."""

import json

import numpy as np
import pytest

import pleio
from conftest import cli

STRATEGIES = ["fault", "advise", "pread", "uring", "uring-direct", "pool", "auto", "cached", "shared"]


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


@pytest.fixture(scope="module")
def layered(tmp_path_factory):
    d = tmp_path_factory.mktemp("layers")
    two = d / "two"
    cli("synth", "--format", "safetensors", "--encoding", "bf16", "--rows", "3000", "--ple-layers", "1,3",
        "--shards", "5", "--shard-rows", "ceil", "--seed", "8", "-o", two)
    fp8 = d / "fp8-f32-scale"
    cli("synth", "--format", "safetensors", "--encoding", "fp8", "--rows", "3000", "--fp8-scale", "2e-4",
        "--seed", "8", "-o", fp8)
    return {"two": two, "fp8": fp8}


def test_every_ple_layer(layered, tmp_path):
    path = layered["two"]
    first = pleio.open(path)
    assert first.ple_layers == [0, 2] and first.layer == 0
    assert "layer=0 (of PLE layers [0, 2])" in repr(first)
    for layer in (0, 2):
        t = pleio.open(path, layer=layer)
        assert t.layer == layer
        ids = np.array([0, t.rows - 1, 17, 17])
        ref = np.load(_cli_gather_layer(path, ids, layer, tmp_path))
        assert np.array_equal(t.gather(ids), ref)
        got = pleio.row_ids(t, [9, 8, 7, 6])
        toks = tmp_path / "tokens.txt"
        toks.write_text("9 8 7 6")
        want = json.loads(cli("rows", "--layer", layer, "--tokens", toks, "--json", path))["rows"]
        assert got.tolist() == want
    assert pleio.open(path, layer=0).rows != pleio.open(path, layer=2).rows  # primes continue per layer
    with pytest.raises(pleio.InvalidFileError, match=r"layer 1.*\[0, 2\]") as ei:
        pleio.open(path, layer=1)
    assert ei.value.kind == "no_table"


def _cli_gather_layer(path, ids, layer, tmp_path):
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(" ".join(str(int(i)) for i in ids))
    out = tmp_path / f"rows-{layer}.npy"
    cli("gather", path, "--layer", layer, "--rows-file", ids_file, "--format", "npy", "-o", out, "--force")
    return out


def test_rounding_rules(layered, tmp_path):
    path = layered["fp8"]
    ids = np.arange(0, 2944, 7)
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(" ".join(map(str, ids)))
    ref = {}
    for rule in ("exact", "vllm"):
        out = tmp_path / f"{rule}.npy"
        cli("gather", path, "--rows-file", ids_file, "--dtype", "bf16", "--rounding", rule,
            "--format", "npy", "-o", out, "--force")
        ref[rule] = np.load(out).view(np.uint16)
    assert not np.array_equal(ref["exact"], ref["vllm"])  # the f32 scale is not a bf16
    t = pleio.open(path)
    assert t.rounding == "exact"
    assert np.array_equal(t.gather(ids, dtype="bfloat16").view(np.uint16), ref["exact"])
    assert np.array_equal(t.gather(ids, dtype="bfloat16", rounding="vllm").view(np.uint16), ref["vllm"])
    assert np.array_equal(t.gather(ids, dtype="bfloat16", rounding="sglang").view(np.uint16), ref["vllm"])
    v = pleio.open(path, rounding="vllm")
    assert v.rounding == "vllm" and "rounding=vllm" in repr(v)
    assert np.array_equal(v.gather(ids, dtype="bfloat16").view(np.uint16), ref["vllm"])
    assert np.array_equal(v.gather(ids, dtype="bfloat16", rounding="exact").view(np.uint16), ref["exact"])
    # f32 output is exact under vLLM's rule
    assert np.array_equal(v.gather(ids), t.gather(ids))
    with pytest.raises(ValueError, match="rounding"):
        pleio.open(path, rounding="nearest")


def test_rounding_rule_that_does_not_apply(layered, tables):
    with pytest.raises(pleio.InvalidFileError) as ei:
        pleio.open(layered["fp8"], rounding="mlx")
    assert ei.value.kind == "unsupported"
    with pytest.raises(pleio.InvalidFileError):
        pleio.open(tables["q"].path, rounding="vllm")
    t = pleio.open(tables["q"].path)
    out = np.full((2, t.row_elems), 7, np.uint16)
    with pytest.raises(pleio.InvalidFileError):
        t.gather([0, 1], out=out, dtype="bfloat16", rounding="vllm")
    assert (out == 7).all()
