"""Redis servers for the benchmark scripts (remote_speed.py, remote_memory.py,
rivals_bench.py): redis-server processes on 127.0.0.1, a Redis Cluster of
them when there are several, stopped by pid; and the synthetic table those
scripts publish when given none. Not a test fixture: the tests start their
servers through pleio_testkit (Rust) and crates/pleio-py/tests."""

import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port():
    """A free loopback port whose cluster bus port (+10000) is free too."""
    for port in range(random.randrange(20000, 50000), 55000):
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise SystemExit("redis_servers: no free port pair on 127.0.0.1")


def cli(port, *args):
    """`redis-cli -p port args...`'s output (raises on a failed command)."""
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True,
                          check=True).stdout


def info(port, section="memory"):
    """`INFO section` as a dict."""
    out = cli(port, "info", section)
    return {k: v for k, _, v in (l.strip().partition(":") for l in out.splitlines()) if v}


def wait_up(port, seconds=20):
    """Waits until something accepts connections on 127.0.0.1:port."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"redis_servers: redis-server on port {port} did not start within {seconds} s")


def redis_server():
    """The redis-server executable, or exit naming the package."""
    exe = shutil.which("redis-server")
    if not exe:
        raise SystemExit("no redis-server in PATH (apt-get install redis-server)")
    return exe


class Servers:
    """`n` redis-servers on loopback, no persistence, a cluster of `n`
    masters (no replicas) when n > 1; each node's files and log in
    `d/node<i>`. `ports` fixes the ports (else free ones are picked);
    `thp` puts the servers' heap on transparent huge pages (jemalloc's
    `thp:always` and Redis's `disable-thp no`)."""

    def __init__(self, n, d, thp=False, ports=None, exe=None):
        exe = exe or redis_server()
        self.ports = list(ports) if ports else [free_port() for _ in range(n)]
        self.procs = []
        env = dict(os.environ, MALLOC_CONF="thp:always,metadata_thp:always") if thp else None
        try:
            for i, port in enumerate(self.ports):
                node_dir = Path(d) / f"node{i}"
                node_dir.mkdir(parents=True, exist_ok=True)
                (node_dir / "nodes.conf").unlink(missing_ok=True)  # a previous run's cluster
                args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                        "--dir", str(node_dir)]
                if n > 1:
                    args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
                if thp:
                    args += ["--disable-thp", "no"]
                log = open(node_dir / "server.log", "ab")
                self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env))
                log.close()
            for p in self.ports:
                wait_up(p)
            if n > 1:
                subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                                "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, check=True)
                end = time.monotonic() + 20
                while not all("cluster_state:ok" in cli(p, "cluster", "info") for p in self.ports):
                    if time.monotonic() > end:
                        raise SystemExit("redis_servers: the cluster did not reach cluster_state:ok in 20 s")
                    time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def url(self, name):
        """The redis:// URL of table `name` on these servers."""
        return f"redis://127.0.0.1:{self.ports[0]}/{name}"

    def flush(self):
        for p in self.ports:
            cli(p, "flushall")

    def used_memory(self):
        """The servers' `used_memory`, summed."""
        return sum(int(info(p).get("used_memory", 0)) for p in self.ports)

    def stop(self):
        for s in self.procs:
            if s.poll() is None:
                s.kill()
            s.wait()


def synth_table(pleio, rows, dest):
    """A synthetic IQ4_NL qwen4exp table of `rows` rows at `dest` (seed 3)."""
    subprocess.run([pleio, "synth", "--rows", str(rows), "--seed", "3", "-o", str(dest)],
                   check=True, capture_output=True)
    return Path(dest)
