"""Fixtures: small synthetic tables written by `pleio synth`, and helpers that
run the `pleio` CLI ($PLEIO_BIN, set by scripts/py_test.sh) for the expected
values."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest


def pleio_bin() -> str:
    path = os.environ.get("PLEIO_BIN")
    if not path:
        pytest.fail("PLEIO_BIN is not set: run the suite with scripts/py_test.sh")
    return path


def cli(*args) -> str:
    r = subprocess.run([pleio_bin(), *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"pleio {' '.join(map(str, args))} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


class Fixture:
    """One synthetic file and what the CLI says about it."""

    def __init__(self, path: Path):
        self.path = path
        self.info = json.loads(cli("inspect", "--json", path))["table"]
        self.rows = self.info["rows"]
        self.row_elems = self.info["row_elems"]
        self.row_bytes = self.info["row_bytes"]
        self.offset = self.info["offset"]

    def cli_rows(self, ids, tmp: Path) -> np.ndarray:
        """`pleio gather` of ids as float32, shape (len(ids), row_elems)."""
        ids_file = tmp / "ids.txt"
        ids_file.write_text(" ".join(str(int(i)) for i in ids))
        out = tmp / "rows.npy"
        cli("gather", self.path, "--rows-file", ids_file, "--format", "npy", "-o", out, "--force")
        return np.load(out)

    def raw_rows(self, ids) -> np.ndarray:
        """The stored bytes of ids, read from the file."""
        blob = self.path.read_bytes()
        rb, off = self.row_bytes, self.offset
        return np.frombuffer(
            b"".join(blob[off + i * rb: off + (i + 1) * rb] for i in ids), dtype=np.uint8
        ).reshape(len(ids), rb)


def synth(dest: Path, *args) -> Fixture:
    cli("synth", *args, "-o", dest)
    return Fixture(dest)


@pytest.fixture(scope="session")
def tables(tmp_path_factory):
    d = tmp_path_factory.mktemp("tables")
    return {
        "q": synth(d / "q.gguf", "--rows", "5000", "--seed", "21"),
        "q8": synth(d / "q8.gguf", "--rows", "3000", "--type", "Q8_0", "--seed", "22"),
        "bf16": synth(d / "bf16.gguf", "--rows", "2000", "--type", "BF16", "--seed", "23"),
        "g": synth(d / "g.gguf", "--arch", "gemma4", "--layers", "2", "--rows", "300", "--seed", "24"),
    }


@pytest.fixture(scope="session")
def q(tables):
    return tables["q"]


@pytest.fixture
def ids(q):
    rng = np.random.default_rng(3)
    return np.concatenate([rng.integers(0, q.rows, 200), [q.rows - 1, 0, 0, q.rows - 1, 9, 9]])
