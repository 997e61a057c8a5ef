"""Row ids: Table.sequence() and pleio.row_ids against `pleio rows`."""

import json

import numpy as np
import pytest

import pleio
from conftest import cli

EOS = 248044  # the released qwen4exp <|endoftext|>, which resets the n-gram history


def cli_rows(fx, tokens, tmp_path):
    f = tmp_path / "tokens.txt"
    f.write_text(" ".join(map(str, tokens)))
    return np.array(json.loads(cli("rows", fx.path, "--tokens", f, "--json"))["rows"], dtype=np.int64)


def test_qwen_sequence_across_calls(q, tmp_path):
    rng = np.random.default_rng(11)
    tokens = [int(x) for x in rng.integers(0, 200000, 50)] + [EOS] + [int(x) for x in rng.integers(0, 200000, 30)]
    want = cli_rows(q, tokens, tmp_path)
    t = pleio.open(q.path)
    assert want.shape == (len(tokens), 16)
    one = pleio.row_ids(t, tokens)
    assert one.dtype == np.int64 and np.array_equal(one, want)
    seq = t.sequence()
    assert seq.rows_per_token == 16
    parts = [seq.map(tokens[a:b]) for a, b in [(0, 1), (1, 17), (17, 17), (17, 60), (60, len(tokens))]]
    assert np.array_equal(np.concatenate(parts), want)
    # a fresh sequence differs from a continued one (history), reset restores it
    assert not np.array_equal(seq.map(tokens[:5]), want[:5])
    seq.reset()
    assert np.array_equal(seq.map(np.array(tokens[:5], dtype=np.int32)), want[:5])
    # the ids gather
    rows = t.gather(one.ravel())
    assert rows.shape == (len(tokens) * 16, t.row_elems)


def test_gemma_identity(tables, tmp_path):
    g = tables["g"]
    t = pleio.open(g.path)
    tokens = [0, 5, g.rows - 1, 5]
    want = cli_rows(g, tokens, tmp_path)
    got = pleio.row_ids(t, tokens)
    assert np.array_equal(got, want) and got.shape == (4, 1)
    assert got.ravel().tolist() == tokens
    with pytest.raises(pleio.InvalidFileError, match=str(g.rows)):
        pleio.row_ids(t, [g.rows])


def test_failed_map_does_not_advance(tables):
    g = tables["g"]
    seq = pleio.open(g.path).sequence()
    with pytest.raises(pleio.Error):
        seq.map([1, g.rows + 5])
    assert seq.map([3]).ravel().tolist() == [3]
