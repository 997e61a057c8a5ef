#!/usr/bin/env python3
"""Where Redis spends a 1792-row batch, without pleio in the way: a fresh
redis-server on loopback (started here, stopped by pid) holding `--keys`
random strings of 256 KiB (pleio's default bucket), read with a minimal
raw-socket client in three ways, each a median over `--batches` batches:

- `pipelined, same rows`: one pipelined write of 1792 GETRANGEs of 164
  bytes (an FP8 row and its check), the same rows every batch (hot in the
  CPU caches);
- `pipelined, fresh rows`: new random rows every batch (as pleio's reads);
- `lua, G groups`: the fresh rows as G EVALSHA calls of a script that
  loops over its rows with redis.call('GETRANGE') and returns them joined
  (the "fewer, larger commands" idea);

each also with transparent huge pages for Redis's heap (`--thp`:
jemalloc's `thp:always` and Redis's `disable-thp no`), and Redis's own
time per command from INFO commandstats. Prints one JSON object:

    python3 scripts/reportmeta.py --out docs/reports/redis-probe.json -- \\
        python3 scripts/redis_probe.py
"""

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import tempfile
import time

ROW = 164
BUCKET = 256 * 1024
BATCH = 1792
SCRIPT = (b"local r={} local n=0 for i=1,#ARGV,3 do n=n+1 "
          b"r[n]=redis.call('GETRANGE',KEYS[tonumber(ARGV[i])],ARGV[i+1],ARGV[i+2]) end "
          b"return table.concat(r)")


def cmd(*a):
    out = [b"*%d\r\n" % len(a)]
    for x in a:
        x = x if isinstance(x, bytes) else str(x).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(x), x))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def recvn(self, n):
        parts, have = [self.buf], len(self.buf)
        while have < n:
            chunk = self.s.recv(max(1 << 16, n - have))
            if not chunk:
                raise ConnectionError("redis-server closed the connection")
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self.buf = data[n:]
        return data[:n]

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(1 << 16)
            if not chunk:
                raise ConnectionError("redis-server closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def call(self, *a):
        self.s.sendall(cmd(*a))
        head = self.line()
        if head[:1] == b"$":
            n = int(head[1:])
            return self.recvn(n + 2)[:-2] if n >= 0 else None
        if head[:1] == b"-":
            raise RuntimeError(head.decode())
        return head


def rows(keys, rng):
    return [(rng.randrange(keys), rng.randrange(BUCKET // ROW) * ROW) for _ in range(BATCH)]


def pipelined(batch):
    req = b"".join(cmd("GETRANGE", f"k{b}", o, o + ROW - 1) for b, o in batch)
    return req, len(batch) * (len(b"$%d\r\n" % ROW) + ROW + 2)


def lua(batch, groups, sha):
    req, want = [], 0
    for g in range(groups):
        part = batch[g::groups]
        keys = sorted({b for b, _ in part})
        index = {k: i + 1 for i, k in enumerate(keys)}
        args = [x for b, o in part for x in (index[b], o, o + ROW - 1)]
        req.append(cmd("EVALSHA", sha, len(keys), *[f"k{k}" for k in keys], *args))
        n = len(part) * ROW
        want += len(b"$%d\r\n" % n) + n + 2
    return b"".join(req), want


def timed(c, make, batches):
    times = []
    for _ in range(batches):
        req, want = make()
        t = time.perf_counter()
        c.s.sendall(req)
        c.recvn(want)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def commandstats(c):
    text = c.call("INFO", "commandstats").decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line.partition(":")
            fields = dict(kv.split("=") for kv in rest.split(","))
            out[name[len("cmdstat_"):]] = float(fields["usec_per_call"])
    return out


def run(keys, batches, thp, groups):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    p_no = port.getsockname()[1]
    port.close()
    env = dict(os.environ)
    args = ["redis-server", "--port", str(p_no), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    if thp:
        env["MALLOC_CONF"] = "thp:always,metadata_thp:always"
        args += ["--disable-thp", "no"]
    with tempfile.TemporaryDirectory(prefix="pleio-probe-") as d:
        srv = subprocess.Popen(args + ["--dir", d], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    c = Conn(p_no)
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                raise RuntimeError("redis-server did not start")
            blob = os.urandom(BUCKET)
            for k in range(keys):
                c.call("SET", f"k{k}", blob)
            sha = c.call("SCRIPT", "LOAD", SCRIPT)
            rng = random.Random(7)
            same = rows(keys, rng)
            out = {"thp": thp, "keys": keys, "heap_bytes": keys * BUCKET}
            c.call("CONFIG", "RESETSTAT")
            out["pipelined_same_us"] = timed(c, lambda: pipelined(same), batches)
            out["pipelined_fresh_us"] = timed(c, lambda: pipelined(rows(keys, rng)), batches)
            out["getrange_exec_us"] = commandstats(c).get("getrange")
            for g in groups:
                c.call("CONFIG", "RESETSTAT")
                out[f"lua_{g}_us"] = timed(c, lambda: lua(rows(keys, rng), g, sha), batches)
            smaps = open(f"/proc/{srv.pid}/smaps_rollup").read()
            out["anon_huge_kib"] = int(next(l.split()[1] for l in smaps.splitlines() if l.startswith("AnonHugePages")))
            return out
        finally:
            srv.kill()
            srv.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="1500,5250", help="heap sizes in 256 KiB keys (5250: the 1.34 GB table of remote-rivals)")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--groups", default="1,21")
    a = ap.parse_args()
    groups = [int(g) for g in a.groups.split(",")]
    runs = [run(int(k), a.batches, thp, groups) for k in a.keys.split(",") for thp in (False, True)]
    print(json.dumps({"row_bytes": ROW, "bucket_bytes": BUCKET, "batch": BATCH, "runs": runs}))


if __name__ == "__main__":
    main()
