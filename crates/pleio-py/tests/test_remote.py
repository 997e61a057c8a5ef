"""The Python door to a table published to Redis: `pleio publish` (the CLI)
uploads a synthetic table to a redis-server on loopback (started here,
stopped by pid), and `pleio.open("redis://...")` gives the file's bytes
for every dtype; a corrupt row and a wrong password raise pleio.ReadError
with kind "remote". Over TLS (`rediss://`, certificates made here with
the openssl command), the same bytes; an untrusted server is refused."""

import contextlib
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

import pleio
from conftest import cli


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis(str):
    """The server's address, and its process (to kill it)."""

    def __new__(cls, addr, proc):
        r = super().__new__(cls, addr)
        r.proc = proc
        return r


@contextlib.contextmanager
def redis_server(port, tmp_path, *args):
    """A redis-server on 127.0.0.1 (`args` say how it listens), waited
    for until it accepts, killed by pid after."""
    exe = shutil.which("redis-server")
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
         *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def redis(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server in PATH (.ci/run installs Debian's redis-server)")
    port = free_port()
    with redis_server(port, tmp_path, "--port", str(port), "--requirepass", "pw") as proc:
        yield Redis(f"127.0.0.1:{port}", proc)


def test_a_published_table_reads_as_the_file(redis, q, ids):
    url = f"redis://:pw@{redis}/q"
    cli("publish", q.path, url, "--bucket-bytes", "8192")
    local, remote = pleio.open(q.path), pleio.open(url)
    assert (remote.rows, remote.row_bytes) == (local.rows, local.row_bytes)
    for dtype in ["f32", "bf16", "f16", "raw"]:
        a, b = local.gather(ids, dtype=dtype), remote.gather(ids, dtype=dtype)
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), dtype
    assert np.array_equal(remote.gather(ids, dtype="raw"), q.raw_rows(ids))


def test_remote_failures_raise_read_errors_naming_what_failed(redis, q):
    with pytest.raises(pleio.ReadError) as e:
        pleio.open(f"redis://:wrong@{redis}/q")
    assert e.value.kind == "remote" and redis in str(e.value) and "wrong" not in str(e.value)
    with pytest.raises(pleio.NotFoundError):
        pleio.open(f"redis://:pw@{redis}/absent")
    url = f"redis://:pw@{redis}/q"
    cli("publish", q.path, url, "--bucket-bytes", "8192")
    t = pleio.open(url)
    # Flip a byte of bucket 0 behind pleio's back.
    key = subprocess.run(
        ["redis-cli", "-p", redis.split(":")[1], "-a", "pw", "--no-auth-warning", "--raw",
         "KEYS", "pleio:t:*:b0"], capture_output=True, text=True, check=True,
    ).stdout.split()[0]
    subprocess.run(
        ["redis-cli", "-p", redis.split(":")[1], "-a", "pw", "--no-auth-warning",
         "SETRANGE", key, "3", "~"], check=True, capture_output=True,
    )
    with pytest.raises(pleio.ReadError) as e:
        t.gather([0])
    assert e.value.kind == "remote" and e.value.row == 0 and key in str(e.value)


def test_a_local_copy_serves_when_the_server_dies(redis, q, ids):
    url = f"redis://:pw@{redis}/q?timeout_ms=200&retries=1&local={q.path}"
    cli("publish", q.path, url.split("?")[0], "--bucket-bytes", "8192")
    t = pleio.open(url, strategy="shared")
    want = pleio.open(q.path).gather(ids)
    assert np.array_equal(t.gather(ids), want) and t.stats()["tier_fallbacks"] == 0
    redis.proc.kill()
    redis.proc.wait()
    seen = set(ids.tolist())
    fresh = np.concatenate([ids, [r for r in range(q.rows) if r not in seen][:3]])  # 3 rows not cached
    assert np.array_equal(t.gather(fresh), pleio.open(q.path).gather(fresh))
    assert t.stats()["tier_fallbacks"] == 1


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def tls_redis(tmp_path):
    if shutil.which("redis-server") is None or shutil.which("openssl") is None:
        pytest.skip("no redis-server or openssl in PATH (.ci/run installs redis-server)")
    d = tmp_path
    for name, subj in [("ca", "/CN=pleio test CA"), ("other", "/CN=pleio other CA")]:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.pem", "-days", "2", "-subj", subj, cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
            "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext", cwd=d)
    port = free_port()
    with redis_server(port, d, "--port", "0", "--tls-port", str(port),
                      "--tls-cert-file", str(d / "srv.pem"), "--tls-key-file", str(d / "srv.key"),
                      "--tls-ca-cert-file", str(d / "ca.pem"), "--tls-auth-clients", "no"):
        yield f"127.0.0.1:{port}", d


def test_tls_reads_as_the_file_and_refuses_an_untrusted_server(tls_redis, q, ids):
    addr, d = tls_redis
    url = f"rediss://{addr}/q?tls_ca={d / 'ca.pem'}"
    cli("publish", q.path, url, "--bucket-bytes", "8192")
    local, remote = pleio.open(q.path), pleio.open(url)
    for dtype in ["f32", "raw"]:
        a, b = local.gather(ids, dtype=dtype), remote.gather(ids, dtype=dtype)
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), dtype
    with pytest.raises(pleio.ReadError) as e:
        pleio.open(f"rediss://{addr}/q?tls_ca={d / 'other.pem'}")
    assert e.value.kind == "remote" and addr in str(e.value) and "certificate" in str(e.value)
