#!/usr/bin/env python3
"""pleio against the published alternatives, side by side on one table.

    bash scripts/rivals_venv.sh                      # the venv: the rivals, and pleio from this checkout
    ~/.cache/pleio/rivals-venv/bin/python scripts/rivals_bench.py --json docs/reports/rivals.json

The rivals (PyPI): `engramdb-python` 0.3.0 (its Rust `Store` over a
repacked copy of the table, `shard_NNN.bin` files of fixed-width rows) and
`service-ple` 0.2.2 with `vllm-service-ple` 0.2.2 (a per-machine agent
whose row cache lives in shared memory, misses read from the table file,
or a central server holding the table in RAM over TCP; the client is
`libserviceple.so`, the C ABI the vLLM hook calls). pleio is `pleio.open(...,
strategy="auto")`; a plain NumPy memmap gather is the baseline (what an
engine's file-backed table does).

One table: an FP8 checkpoint with a BF16 table scale in one safetensors
file, its rows split as vLLM splits them (`pleio synth --format safetensors
--encoding fp8 --files 1 --shard-rows ceil`), the only format service-ple
reads. The same batches for every engine: 16 and 1792 row ids (one token,
112 tokens), random (distinct ids, no batch repeats another's) and
corpus-like (the bundled corpus's row ids, `pleio rows --corpus`, one token
or 112 consecutive tokens). Raw FP8 bytes out, as vLLM's `_lookup` wants.

- cold: before every batch the table file's range is evicted
  (posix_fadvise DONTNEED; engramdb: its copy's files; pleio also forgets
  its residency bits); service-ple's agent starts each pass with a new
  cache; the RAM server holds the table, its load time is a setup cost.
- warm: the same batches again, `--warm-repeat` times.

Each engine runs in its own process (peak RSS per process); the daemons
are started by that process, their peak RSS read before they are stopped
by pid. Every batch's bytes are compared with the file's bytes (pread),
outside the timing. Then the probes: a bad id, a dead agent, a missing or
truncated table file, on a small table. Everything runs inside `unshare -n`
with loopback up (service-ple-server listens on every address): the script
re-executes itself there (needs root).
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from redis_servers import Servers

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("PLEIO_CACHE_DIR", Path.home() / ".cache" / "pleio"))
VENV_BIN = Path(sys.executable).parent
SPLE_LIB = None  # found next to vllm_service_ple
PORT = 18460
SIZES = (16, 1792)
KINDS = ("random", "corpus")


# ---------------------------------------------------------------- helpers

def log(*a):
    print("rivals:", *a, file=sys.stderr, flush=True)


def proc_status(pid="self"):
    """VmHWM, VmRSS, RssAnon, RssFile, RssShmem of a process, KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[k] = int(v.split()[0])
    return out


class Residency:
    """Page-cache residency of a file through a mapping of our own that is never touched (mincore)."""

    libc = None

    def __init__(self, path):
        if Residency.libc is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            Residency.libc = libc
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        page = os.sysconf("SC_PAGE_SIZE")
        self.addr = self.libc.mmap(None, self.size, 1, 1, self.fd, 0)  # PROT_READ, MAP_SHARED
        self.vec = np.zeros((self.size + page - 1) // page, np.uint8)

    def resident(self):
        if self.libc.mincore(ctypes.c_void_p(self.addr), self.size, self.vec.ctypes.data) != 0:
            sys.exit(f"rivals: mincore {self.path}: errno {ctypes.get_errno()}")
        return int((self.vec & 1).sum())

    def evict(self, limit=2):
        """posix_fadvise(DONTNEED) until at most `limit` pages stay resident (200 tries); pages left."""
        for _ in range(200):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            left = self.resident()
            if left <= limit:
                break
            time.sleep(0.005)
        return left


def st_header(path):
    """The safetensors header: {name: (dtype, shape, absolute offset, bytes)}."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    return {k: (v["dtype"], v["shape"], 8 + n + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
            for k, v in hdr.items() if k != "__metadata__"}


class Layout:
    """Where row i of the table lies in the one safetensors file."""

    def __init__(self, ckpt):
        files = sorted(Path(ckpt).glob("*.safetensors"))
        if len(files) != 1:
            sys.exit(f"rivals: {ckpt}: expected one .safetensors file, found {len(files)}")
        self.file = str(files[0])
        hdr = st_header(self.file)
        shards = {}
        for k, (dtype, shape, off, nbytes) in hdr.items():
            if ".ngram_embedding.shard_" in k and k.endswith(".weight"):
                i = int(k.split(".shard_")[1].split(".")[0])
                shards[i] = (dtype, shape, off, nbytes)
            if k.endswith("ngram_embedding.weight_scale"):
                self.scale = (dtype, shape)
        self.shards = [shards[i] for i in range(len(shards))]
        assert all(s[0] == "F8_E4M3" for s in self.shards), "not an FP8 table"
        self.row_bytes = self.shards[0][1][1]
        self.rows_per_shard = self.shards[0][1][0]
        self.rows = sum(s[1][0] for s in self.shards)
        self.offsets = np.array([s[2] for s in self.shards], dtype=np.int64)
        self.starts = np.cumsum([0] + [s[1][0] for s in self.shards[:-1]]).astype(np.int64)

    def row_offsets(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        s = np.searchsorted(self.starts, ids, side="right") - 1
        return self.offsets[s] + (ids - self.starts[s]) * self.row_bytes

    def reference(self, ids):
        """The file's bytes of rows `ids`, by pread (no mapping: no RSS)."""
        out = np.empty((len(ids), self.row_bytes), np.uint8)
        fd = os.open(self.file, os.O_RDONLY)
        try:
            for j, off in enumerate(self.row_offsets(ids)):
                out[j] = np.frombuffer(os.pread(fd, self.row_bytes, int(off)), np.uint8)
        finally:
            os.close(fd)
        return out


def sple_lib():
    import vllm_service_ple
    lib = ctypes.CDLL(str(Path(vllm_service_ple.__file__).parent / "libserviceple.so"))
    lib.sple_abrir.restype = ctypes.c_void_p
    lib.sple_abrir.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.sple_info.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 4
    lib.sple_errores.restype = ctypes.c_uint64
    lib.sple_errores.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.sple_filas.restype = ctypes.c_int
    lib.sple_filas.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    return lib


class SpleClient:
    """libserviceple.so's synchronous call: what the vLLM hook's host node runs."""

    def __init__(self, lib, address, timeout=30.0):
        self.lib = lib
        self.err = ctypes.create_string_buffer(512)
        deadline = time.monotonic() + timeout
        while True:
            h = lib.sple_abrir(address.encode(), self.err, len(self.err))
            if h or time.monotonic() > deadline:
                break
            time.sleep(0.002)
        if not h:
            raise RuntimeError(f"service-ple: {self.err.value.decode(errors='replace')}")
        self.h = h
        rows, rb, scale, fp = ctypes.c_uint64(), ctypes.c_uint32(), ctypes.c_uint16(), ctypes.c_uint64()
        lib.sple_info(h, ctypes.byref(rows), ctypes.byref(rb), ctypes.byref(scale), ctypes.byref(fp))
        self.rows, self.row_bytes, self.scale_bf16, self.fingerprint = rows.value, rb.value, scale.value, fp.value

    def fetch(self, ids, out):
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        rc = self.lib.sple_filas(self.h, ids.ctypes.data, len(ids), 0, self.rows, out.ctypes.data,
                                 self.err, len(self.err))
        if rc != 0:
            raise RuntimeError(f"service-ple: rc {rc}: {self.err.value.decode(errors='replace')}")
        return out


def bin_(name):
    return str(VENV_BIN / name)


def start_agent(table, sock, rows_cache, log_path):
    """A service-ple agent with a new cache; returns (Popen, seconds until a client connects)."""
    for p in Path("/dev/shm").glob("service-ple-*"):
        p.unlink()
    if os.path.exists(sock):
        os.unlink(sock)
    t0 = time.perf_counter()
    proc = subprocess.Popen([bin_("service-ple-agent"), "--socket", sock, "--fichero", table,
                             "--filas", str(rows_cache)], stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)
    return proc, t0


def stop(proc):
    """Peak RSS of a daemon, then SIGTERM (SIGKILL after 5 s) by its pid."""
    st = proc_status(proc.pid) if proc.poll() is None else {}
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return st


def shm_cache_bytes():
    return sum(p.stat().st_blocks * 512 for p in Path("/dev/shm").glob("service-ple-*"))


# ---------------------------------------------------------------- engines (child processes)

class Engine:
    """fetch(ids) -> uint8 (n, row_bytes); cold_paths: what to evict; new_pass(): before a cold pass;
    unmap()/remap(): around an eviction (pages a live mapping holds cannot be dropped, so an in-process
    engine is closed and opened again, outside the timing, before each cold batch)."""

    daemon = None

    def new_pass(self):
        pass

    def unmap(self):
        pass

    def remap(self):
        pass

    def close(self):
        return {}


class PleioEngine(Engine):
    strategy = {"strategy": "auto"}

    def __init__(self, lay, a):
        import pleio
        self.open = lambda: pleio.open(a.table, **self.strategy)
        t0 = time.perf_counter()
        self.t = self.open()
        self.setup = {"open_s": time.perf_counter() - t0}
        self.buf = np.empty((max(SIZES), lay.row_bytes), np.uint8)
        self.cold_paths = [lay.file]

    def fetch(self, ids):
        return self.t.gather(ids, out=self.buf[:len(ids)], dtype="raw")

    def unmap(self):
        self.t = None

    def remap(self):
        self.t = self.open()


class PleioCachedEngine(PleioEngine):
    """pleio's budgeted row cache (256 MiB), the counterpart of the agent's cache. It reads O_DIRECT and
    stays out of the page cache, so a cold batch needs no new handle: its cache lives on across batches,
    as the agent's does within a pass; a new handle (an empty cache) starts each pass."""

    strategy = {"strategy": "cached", "budget": 256 << 20}

    def new_pass(self):
        self.t = None
        self.t = self.open()

    def unmap(self):
        pass

    def remap(self):
        pass


class PleioSharedEngine(PleioCachedEngine):
    """pleio's machine-wide row cache (`shared`, 256 MiB): the counterpart of the agent with no agent. The
    segment in /dev/shm is made by the first process to gather and goes with the last handle, so a new
    handle starts each pass with an empty segment, as the agent starts each pass with a new cache."""

    strategy = {"strategy": "shared", "budget": 256 << 20}
    cache_bytes = 0

    def new_pass(self):
        self.cache_bytes = max(self.cache_bytes, pleio_shm_bytes())
        super().new_pass()

    def close(self):
        self.cache_bytes = max(self.cache_bytes, pleio_shm_bytes())
        return {"shm_cache_bytes": self.cache_bytes}


def pleio_shm_bytes():
    return sum(p.stat().st_blocks * 512 for p in Path(os.environ.get("PLEIO_SHM_DIR", "/dev/shm")).glob("pleio-*"))


class MmapEngine(Engine):
    def __init__(self, lay, a):
        self.lay = lay
        self.remap()
        self.cols = np.arange(lay.row_bytes, dtype=np.int64)
        self.setup = {}
        self.cold_paths = [lay.file]

    def unmap(self):
        self.mm = None

    def remap(self):
        self.mm = np.memmap(self.lay.file, np.uint8, mode="r")

    def fetch(self, ids):
        return self.mm[self.lay.row_offsets(ids)[:, None] + self.cols]


class EngramEngine(Engine):
    def __init__(self, lay, a):
        import engramdb
        self.copy = Path(a.work) / "engramdb"
        self.open = lambda: engramdb.Store(str(self.copy), shards=len(lay.shards),
                                           rows_per_shard=lay.rows_per_shard, width=lay.row_bytes)
        t0 = time.perf_counter()
        self.st = self.open()
        self.setup = {"open_s": time.perf_counter() - t0}
        self.cold_paths = sorted(str(p) for p in self.copy.glob("shard_*.bin"))
        self.row_bytes = lay.row_bytes

    def fetch(self, ids):
        # Store.fetch takes a list of ints (DiskPleEmbedding.forward does `.tolist()` too) and returns bytes
        raw = self.st.fetch(ids.tolist())
        return np.frombuffer(raw, np.uint8).reshape(len(ids), self.row_bytes)

    def unmap(self):
        self.st = None

    def remap(self):
        self.st = self.open()


class AgentEngine(Engine):
    def __init__(self, lay, a):
        self.lib = sple_lib()
        self.lay, self.a = lay, a
        self.sock = str(Path(a.work) / "agent.sock")
        self.buf = np.empty((max(SIZES), lay.row_bytes), np.uint8)
        self.cold_paths = [lay.file]
        self.starts = []
        self.peaks = []
        self.cache_bytes = 0
        self.daemon = None
        self.new_pass()
        self.setup = {"agent_start_s": self.starts[0]}

    def new_pass(self):
        if self.daemon is not None:
            self.cache_bytes = max(self.cache_bytes, shm_cache_bytes())
            self.peaks.append(stop(self.daemon))
        self.daemon, t0 = start_agent(self.lay.file, self.sock, self.a.agent_rows, Path(self.a.work) / "agent.log")
        try:
            self.c = SpleClient(self.lib, "unix:" + self.sock, timeout=600)
        except BaseException:
            stop(self.daemon)
            raise
        self.starts.append(time.perf_counter() - t0)

    def fetch(self, ids):
        return self.c.fetch(ids, self.buf[:len(ids)])

    def close(self):
        self.cache_bytes = max(self.cache_bytes, shm_cache_bytes())
        self.peaks.append(stop(self.daemon))
        for p in Path("/dev/shm").glob("service-ple-*"):
            p.unlink()
        return {"daemon": "service-ple-agent", "daemon_peak_rss_kib": max(p.get("VmHWM", 0) for p in self.peaks),
                "shm_cache_bytes": self.cache_bytes, "agent_cache_rows": self.a.agent_rows,
                "agent_start_s_max": max(self.starts)}


class ServerEngine(Engine):
    def __init__(self, lay, a):
        self.lib = sple_lib()
        t0 = time.perf_counter()
        self.daemon = subprocess.Popen([bin_("service-ple-server"), "--fichero", lay.file, "--puerto", str(PORT)],
                                       stdout=open(Path(a.work) / "server.log", "ab"), stderr=subprocess.STDOUT)
        self.c = SpleClient(self.lib, f"127.0.0.1:{PORT}", timeout=600)
        self.setup = {"server_load_s": time.perf_counter() - t0}
        self.buf = np.empty((max(SIZES), lay.row_bytes), np.uint8)
        self.cold_paths = []

    def fetch(self, ids):
        return self.c.fetch(ids, self.buf[:len(ids)])

    def close(self):
        return {"daemon": "service-ple-server", "daemon_peak_rss_kib": stop(self.daemon).get("VmHWM", 0)}


class PleioRedisEngine(Engine):
    """pleio reading the table from Redis: one redis-server on loopback (the counterpart of
    service-ple-server, one RAM server), the table uploaded by `pleio publish` (a setup cost, as the
    server's load is), `pleio.open("redis://...")`. No row cache in the client: every gather goes to the
    server, cold for the client in both phases."""

    strategy = {"strategy": "auto"}
    masters = 1

    def __init__(self, lay, a):
        import pleio
        self.servers = Servers(self.masters, Path(a.work) / f"redis-{self.masters}",
                               ports=[PORT + 7 + i for i in range(self.masters)])
        self.daemon = self.servers.procs[0]
        self.url = self.servers.url("bench")
        t0 = time.perf_counter()
        subprocess.run([a.pleio, "publish", a.table, self.url, "--json"], check=True, capture_output=True)
        self.setup = {"publish_s": time.perf_counter() - t0}
        self.open = lambda: pleio.open(self.url, **self.strategy)
        self.t = self.open()
        self.buf = np.empty((max(SIZES), lay.row_bytes), np.uint8)
        self.cold_paths = []

    def fetch(self, ids):
        return self.t.gather(ids, out=self.buf[:len(ids)], dtype="raw")

    def close(self):
        used = self.servers.used_memory()
        self.t = None
        peaks = [stop(d).get("VmHWM", 0) for d in self.servers.procs]
        self.servers.stop()
        return {"daemon": "redis-server", "daemon_peak_rss_kib": sum(peaks), "redis_used_memory": used,
                "redis_masters": self.masters}


class PleioRedisClusterEngine(PleioRedisEngine):
    """PleioRedisEngine on a Redis Cluster of 3 masters on loopback (no replicas): each batch's reads
    go to the three in one pipelined round each."""

    masters = 3


class PleioRedisSharedEngine(PleioRedisEngine):
    """pleio's machine-wide row cache (`shared`, 256 MiB) in front of the Redis server: misses go to
    Redis. A new handle starts each pass with an empty segment, as PleioSharedEngine's does."""

    strategy = {"strategy": "shared", "budget": 256 << 20}

    def new_pass(self):
        self.t = None
        self.t = self.open()


ENGINES = {"pleio": PleioEngine, "pleio-cached": PleioCachedEngine, "pleio-shared": PleioSharedEngine,
           "mmap": MmapEngine, "engramdb": EngramEngine,
           "service-ple-agent": AgentEngine, "service-ple-server": ServerEngine,
           "pleio-redis": PleioRedisEngine, "pleio-redis-cluster": PleioRedisClusterEngine,
           "pleio-redis-shared": PleioRedisSharedEngine}


def summary(ns, rows):
    ns = np.asarray(ns, dtype=np.float64)
    return {"batches": len(ns), "median_us": float(np.median(ns)) / 1e3,
            "p99_us": float(np.percentile(ns, 99)) / 1e3, "max_us": float(ns.max()) / 1e3,
            "rows_per_s": rows * len(ns) / (ns.sum() / 1e9)}


def run_child(a):
    lay = Layout(a.table)
    batches = np.load(a.batches)
    rss_base = proc_status()
    eng = ENGINES[a.child](lay, a)
    try:
        res = measure(eng, lay, batches, a)
    except BaseException:
        if eng.daemon is not None:
            stop(eng.daemon)
        raise
    res["daemon"] = eng.close()
    st = proc_status()
    res["rss_kib"] = {"peak": st["VmHWM"], "anon_end": st["RssAnon"], "file_end": st["RssFile"],
                      "shmem_end": st["RssShmem"], "python_numpy_base": rss_base["VmRSS"]}
    print(json.dumps(res))


def measure(eng, lay, batches, a):
    res = {"engine": a.child, "setup": eng.setup, "figures": [], "mismatches": []}
    watch = [Residency(p) for p in eng.cold_paths]
    left_max = 0
    for kind in KINDS:
        for size in SIZES:
            bl = batches[f"{kind}_{size}"]
            eng.new_pass()
            for phase, passes in (("cold", 1), ("warm", a.warm_repeat)):
                times = []
                for _ in range(passes):
                    for b, ids in enumerate(bl):
                        if phase == "cold" and watch:
                            eng.unmap()
                            left_max = max([left_max] + [w.evict() for w in watch])
                            eng.remap()
                        t0 = time.perf_counter_ns()
                        out = eng.fetch(ids)
                        times.append(time.perf_counter_ns() - t0)
                        out = np.asarray(out)
                        ref = lay.reference(ids)
                        bad = np.nonzero((out != ref).any(axis=1))[0]
                        if len(bad):
                            zero = int((out[bad] == 0).all(axis=1).sum())
                            res["mismatches"].append({"kind": kind, "size": size, "phase": phase, "batch": b,
                                                      "rows": len(bad), "zero_rows": zero,
                                                      "ids": [int(x) for x in ids[bad][:8]]})
                f = summary(times, size)
                f.update(kind=kind, size=size, phase=phase)
                res["figures"].append(f)
                log(f"{a.child:19} {kind:6} {size:5} {phase}: median {f['median_us']:10.1f} us  "
                    f"p99 {f['p99_us']:10.1f} us  {f['rows_per_s']:12,.0f} rows/s")
    res["resident_pages_left_after_evict_max"] = left_max
    return res


# ---------------------------------------------------------------- setup (parent)

def ensure_netns(argv):
    """Re-execute inside a new network namespace with loopback up."""
    if os.environ.get("PLEIO_RIVALS_NETNS") == "1":
        return
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        sys.exit("rivals: needs unshare and ip (util-linux, iproute2), and root, to run the daemons "
                 "in a network namespace of their own")
    env = dict(os.environ, PLEIO_RIVALS_NETNS="1")
    cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable, *argv]
    os.execvpe("unshare", cmd, env)


def make_table(pleio_bin, out, rows):
    if out.exists():
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    subprocess.run([pleio_bin, "synth", "--format", "safetensors", "--encoding", "fp8", "--files", "1",
                    "--shard-rows", "ceil", "--rows", str(rows), "-o", str(out)], check=True)
    return time.perf_counter() - t0


def repack_engramdb(lay, dest):
    """engramdb's Store-I layout: shard_NNN.bin, the shard's rows back to back (fsync'd)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    t0 = time.perf_counter()
    fin = os.open(lay.file, os.O_RDONLY)
    try:
        for i, (_, _, off, nbytes) in enumerate(lay.shards):
            fout = os.open(dest / f"shard_{i:03d}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                done = 0
                while done < nbytes:
                    chunk = os.pread(fin, min(8 << 20, nbytes - done), off + done)
                    os.write(fout, chunk)
                    done += len(chunk)
                os.fsync(fout)
            finally:
                os.close(fout)
    finally:
        os.close(fin)
    secs = time.perf_counter() - t0
    disk = sum(p.stat().st_blocks * 512 for p in dest.iterdir())
    return {"repack_s": secs, "extra_disk_bytes": disk}


def corpus_rows(pleio_bin, table):
    out = subprocess.run([pleio_bin, "rows", table, "--corpus", "--json"], check=True, capture_output=True)
    j = json.loads(out.stdout)
    return np.asarray(j["tokens"], dtype=np.int64), np.asarray(j["rows"], dtype=np.int64)


def make_batches(lay, rows, n, seed=7):
    """Random: distinct ids across every batch of a size; corpus: 1 or 112 consecutive tokens at spread positions."""
    rng = np.random.default_rng(seed)
    b = {}
    for size in SIZES:
        ids = rng.choice(lay.rows, size=n * size, replace=False).astype(np.int64)
        b[f"random_{size}"] = ids.reshape(n, size)
        tokens = size // 16
        starts = np.linspace(0, len(rows) - tokens, n, dtype=np.int64)
        b[f"corpus_{size}"] = np.stack([rows[s:s + tokens].reshape(-1) for s in starts])
    return b


# ---------------------------------------------------------------- probes

def probe_table(pleio_bin, work, name="probe-ckpt", extra=("--encoding", "fp8", "--shard-rows", "ceil")):
    """A small table (65000 rows: the last of 128 ceil shards is short, as in the release) for the probes."""
    d = Path(work) / name
    if d.exists():
        shutil.rmtree(d)
    subprocess.run([pleio_bin, "synth", "--format", "safetensors", "--files", "1", "--rows", "65000", *extra,
                    "-o", str(d)], check=True, capture_output=True)
    return d


def agent_accepts(ckpt, table, work):
    """Does a service-ple agent start on this file, and serve its rows? Or its exit status and last line."""
    sock = str(Path(work) / "fmt.sock")
    proc, _ = start_agent(table, sock, 65536, Path(work) / "fmt-agent.log")
    try:
        c = SpleClient(sple_lib(), "unix:" + sock, timeout=5)
        lay = Layout(ckpt)
        ids = np.array([0, 1, lay.rows // 2, lay.rows - 1], dtype=np.int64)
        got = c.fetch(ids, np.full((len(ids), lay.row_bytes), 0xAA, np.uint8))
        return {"result": "serves it", "detail": rows_desc(got, lay.reference(ids)) + " (4 rows checked)"}
    except RuntimeError:
        proc.wait(5)
        last = Path(work, "fmt-agent.log").read_text(errors="replace").strip().splitlines()[-1]
        return {"result": f"agent exits {proc.returncode}", "detail": last.split(" ", 2)[-1][:160]}
    finally:
        stop(proc)
        for p in Path("/dev/shm").glob("service-ple-*"):
            p.unlink()


def format_probes(pleio_bin, work):
    """Which checkpoints each engine reads as they are (engramdb reads none: only its own repacked files)."""
    import pleio
    out = []
    for name, extra in (("FP8, BF16 table scale, vLLM's ceil shards", ("--encoding", "fp8", "--shard-rows", "ceil")),
                        ("FP8, F32 table scale", ("--encoding", "fp8", "--shard-rows", "ceil", "--fp8-scale", "2e-4")),
                        ("FP8, 100 shards split as vLLM does (ceil: the last one shorter)",
                         ("--encoding", "fp8", "--shards", "100", "--shard-rows", "ceil")),
                        ("FP8, 100 shards split as mlx-vlm does (divmod: the first ones longer)",
                         ("--encoding", "fp8", "--shards", "100", "--shard-rows", "divmod")),
                        ("FP8, a BF16 scale per row", ("--encoding", "fp8-row", "--shard-rows", "ceil")),
                        ("BF16", ("--encoding", "bf16", "--shard-rows", "ceil")),
                        ("NVFP4", ("--encoding", "nvfp4", "--shard-rows", "ceil"))):
        d = probe_table(pleio_bin, work, "fmt-ckpt", extra)
        f = str(next(d.glob("*.safetensors")))
        out.append({"case": name, "engine": "pleio", **outcome(lambda: f"reads it ({pleio.open(str(d)).encoding})")})
        out.append({"case": name, "engine": "service-ple", **agent_accepts(d, f, work)})
        out.append({"case": name, "engine": "engramdb", "result": "n/a",
                    "detail": "reads only its own shard_NNN.bin files; the wheel has no converter"})
        shutil.rmtree(d)
    for p in out:
        p["detail"] = p["detail"].replace(str(work) + "/", "")
    return out


def outcome(fn):
    """What a call does: ("ok", rows) or ("raises", 'Type: message')."""
    try:
        r = fn()
        return {"result": "returns", "detail": r}
    except BaseException as e:  # noqa: B036 (PanicException derives from BaseException)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return {"result": "raises", "detail": f"{type(e).__name__}: {str(e).splitlines()[0][:240]}"}


def rows_desc(out, ref):
    out = np.asarray(out)
    if (out == 0).all():
        return "zero rows, no error"
    if ref is not None and np.array_equal(out, ref):
        return "the right rows"
    return "wrong rows, no error"


def run_probes(pleio_bin, work):
    import engramdb
    import pleio
    d = probe_table(pleio_bin, work)
    lay = Layout(d)
    probes = []

    def add(case, engine, o):
        probes.append({"case": case, "engine": engine, **o})

    # engramdb's repacked copy; service-ple's agent
    eng_dir = Path(work) / "probe-engramdb"
    repack_engramdb(lay, eng_dir)
    store = engramdb.Store(str(eng_dir), shards=len(lay.shards), rows_per_shard=lay.rows_per_shard, width=lay.row_bytes)
    lib = sple_lib()
    sock = str(Path(work) / "probe.sock")
    agent, _ = start_agent(lay.file, sock, 65536, Path(work) / "probe-agent.log")
    cl = SpleClient(lib, "unix:" + sock)
    t = pleio.open(str(d))
    padded = len(lay.shards) * lay.rows_per_shard  # engramdb's idea of the row count
    bad_ids = {"id = rows (just past the end)": lay.rows, "id = 10^9": 10**9, "id = -1": -1}
    if padded > lay.rows:
        bad_ids[f"id = rows + {padded - lay.rows - 1} (inside the last shard's padding)"] = padded - 1
    for case, i in bad_ids.items():
        ids = np.array([5, i], dtype=np.int64)
        add(case, "pleio", outcome(lambda: rows_desc(t.gather(ids, dtype="raw"), None)))
        add(case, "engramdb", outcome(lambda: rows_desc(
            np.frombuffer(store.fetch([int(x) for x in ids]), np.uint8).reshape(2, -1)[1:], None)))
        add(case, "service-ple", outcome(lambda: rows_desc(
            cl.fetch(ids, np.full((2, lay.row_bytes), 0xAA, np.uint8))[1:], None)))

    # a dead agent: rows it had served stay readable in the shared cache, the others come back as zeros
    cl.fetch(np.arange(16, dtype=np.int64), np.empty((16, lay.row_bytes), np.uint8))
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()
    miss = np.arange(30000, 30016, dtype=np.int64)
    add("agent killed mid-run: rows it never served", "service-ple", outcome(lambda: rows_desc(
        cl.fetch(miss, np.full((16, lay.row_bytes), 0xAA, np.uint8)), lay.reference(miss))))
    hit = np.arange(16, dtype=np.int64)
    add("agent killed mid-run: rows it had served", "service-ple", outcome(lambda: rows_desc(
        cl.fetch(hit, np.full((16, lay.row_bytes), 0xAA, np.uint8)), lay.reference(hit))))
    errbuf = ctypes.create_string_buffer(512)
    add("agent killed mid-run: sple_errores() (what the vLLM hook raises on)", "service-ple",
        {"result": "returns", "detail": f"{lib.sple_errores(errbuf, len(errbuf))} failed requests counted"})
    add("agent killed mid-run", "pleio", {"result": "n/a", "detail": "no agent: the engine process reads the file itself"})
    add("agent killed mid-run", "engramdb", {"result": "n/a", "detail": "no agent: in-process Store"})

    # a table file missing at start
    missing = str(Path(work) / "no-such-dir")
    add("table file missing at start", "pleio", outcome(lambda: repr(pleio.open(missing))))
    add("table file missing at start", "engramdb", outcome(lambda: repr(engramdb.Store(
        missing, shards=len(lay.shards), rows_per_shard=lay.rows_per_shard, width=lay.row_bytes))))
    r = subprocess.run([bin_("service-ple-agent"), "--socket", sock + "2", "--fichero", missing + "/x.safetensors"],
                       capture_output=True, text=True, timeout=30)
    line = (r.stdout + r.stderr).strip().splitlines()[-1] if (r.stdout + r.stderr).strip() else ""
    add("table file missing at start", "service-ple",
        {"result": f"agent exits {r.returncode}", "detail": line.split(" ", 2)[-1][:160]})
    add("table file missing at start", "service-ple client", outcome(lambda: SpleClient(lib, "unix:" + sock + "2", timeout=0.2)))

    # one shard file of engramdb's copy missing
    (eng_dir / "shard_005.bin").rename(eng_dir / "gone.bin")
    add("engramdb copy: one shard file missing", "engramdb", outcome(lambda: repr(engramdb.Store(
        str(eng_dir), shards=len(lay.shards), rows_per_shard=lay.rows_per_shard, width=lay.row_bytes))))
    (eng_dir / "gone.bin").rename(eng_dir / "shard_005.bin")

    # the table file truncated while open (the last half of its rows gone)
    agent, _ = start_agent(lay.file, sock, 65536, Path(work) / "probe-agent.log")
    cl = SpleClient(lib, "unix:" + sock)
    late = np.array([lay.rows - 3], dtype=np.int64)
    late_ref = lay.reference(late)
    half = int(lay.offsets[len(lay.shards) // 2])
    os.truncate(lay.file, half)
    for p in sorted(eng_dir.glob("shard_*.bin"))[len(lay.shards) // 2:]:
        os.truncate(p, 0)
    case = "table file truncated while open"
    add(case, "pleio", outcome(lambda: rows_desc(t.gather(late, dtype="raw"), late_ref)))
    add(case, "engramdb", outcome(lambda: rows_desc(
        np.frombuffer(store.fetch([int(x) for x in late]), np.uint8).reshape(1, -1), late_ref)))
    add(case, "service-ple", outcome(lambda: rows_desc(
        cl.fetch(late, np.full((1, lay.row_bytes), 0xAA, np.uint8)), late_ref)))
    stop(agent)
    for p in Path("/dev/shm").glob("service-ple-*"):
        p.unlink()
    shutil.rmtree(d)
    shutil.rmtree(eng_dir)
    for p in probes:  # the work directory's path says nothing
        p["detail"] = p["detail"].replace(str(work) + "/", "")
    return probes


def rowid_check(table, table_rows, tokens, rows, n):
    """engramdb's row ids (its documented calls, reading the checkpoint's own metadata) against pleio's."""
    from engramdb import rowids_for_seq
    from engramdb.ple_discovery import discover_ple
    from engramdb.ple_memory import ple_memory_from_discovery

    info = discover_ple(table)
    tok, want = tokens[:n], rows[:n]
    res = {"tokens": n, "ngram_vocab_size_base": info.get("ngram_vocab_size_base"),
           "layer_multipliers": info.get("layer_multipliers")}
    calls = {
        "rowids_for_seq(tokens, info=discover_ple(ckpt))": lambda: rowids_for_seq(tok, info=info),
        "ple_memory_from_discovery(discover_ple(ckpt)).rowids_for_tokens(tokens)":
            lambda: ple_memory_from_discovery(info, store=object()).rowids_for_tokens(tok),
    }
    res["calls"] = []
    for name, fn in calls.items():
        o = outcome(lambda: np.asarray(fn(), dtype=np.int64))
        if o["result"] == "returns":
            got = o["detail"]
            wrong = int((got != want).sum())
            res["calls"].append({"call": name, "wrong_ids": wrong, "ids": int(want.size),
                                 "out_of_table": int((got >= table_rows).sum()),
                                 "max_id": int(got.max())})
        else:
            res["calls"].append({"call": name, "error": o["detail"]})
    return res


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", help="the FP8 checkpoint directory (made with pleio synth if missing)")
    ap.add_argument("--rows", default="8M", help="rows of the table made when missing (default 8M: 1.19 GiB)")
    ap.add_argument("--pleio", default=str(ROOT / "target" / "release" / "pleio"), help="the pleio CLI (synth, rows)")
    ap.add_argument("--work", help="engramdb's copy, sockets, logs (default: beside the table)")
    ap.add_argument("--batches", type=int, default=20, help="batches per kind and size (default 20)")
    ap.add_argument("--warm-repeat", type=int, default=5, help="warm passes over the same batches (default 5)")
    ap.add_argument("--agent-rows", type=int, default=16777216, help="the agent's cache rows (its installer's default)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="which engines (default all)")
    ap.add_argument("--rowid-tokens", type=int, default=8192, help="corpus tokens for the row-id check")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--keep", action="store_true", help="keep engramdb's copy (the table is always kept)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--batches-file", dest="batches_path", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        a.batches = a.batches_path
        return run_child(a)

    ensure_netns(sys.argv)
    table = Path(a.table or CACHE / "rivals" / f"fp8-{a.rows}")
    a.table = str(table)
    work = Path(a.work or str(table) + "-work")
    work.mkdir(parents=True, exist_ok=True)
    a.work = str(work)
    synth_s = make_table(a.pleio, table, a.rows)
    lay = Layout(table)
    log(f"table {lay.file}: {lay.rows:,} rows x {lay.row_bytes} B in {len(lay.shards)} shards, "
        f"{os.path.getsize(lay.file) / 2**30:.2f} GiB")

    tokens, rows = corpus_rows(a.pleio, a.table)
    batches = make_batches(lay, rows, a.batches)
    bpath = work / "batches.npz"
    np.savez(bpath, **batches)

    engines = a.engines.split(",")
    setup = {}
    if "engramdb" in engines:
        setup["engramdb"] = repack_engramdb(lay, work / "engramdb")
        log(f"engramdb repack: {setup['engramdb']['repack_s']:.1f} s, "
            f"{setup['engramdb']['extra_disk_bytes'] / 2**30:.2f} GiB more on disk")
    results = {}
    for e in engines:
        cmd = [sys.executable, __file__, "--child", e, "--table", a.table, "--work", a.work,
               "--batches-file", str(bpath), "--warm-repeat", str(a.warm_repeat), "--agent-rows", str(a.agent_rows),
               "--pleio", a.pleio]
        r = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            results[e] = {"engine": e, "error": f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}"}
            continue
        results[e] = json.loads(r.stdout.strip().splitlines()[-1])
        results[e]["setup"].update(setup.get(e, {}))
    if not a.keep and (work / "engramdb").exists():
        shutil.rmtree(work / "engramdb")

    log("probes")
    probes = run_probes(a.pleio, a.work)
    formats = format_probes(a.pleio, a.work)
    rid = rowid_check(a.table, lay.rows, tokens, rows, min(a.rowid_tokens, len(tokens)))

    ratios = []
    p = results.get("pleio", {})
    for e, r in results.items():
        if e.startswith("pleio") or "figures" not in r or "figures" not in p:
            continue
        for f in r["figures"]:
            g = next(x for x in p["figures"] if (x["kind"], x["size"], x["phase"]) == (f["kind"], f["size"], f["phase"]))
            ratios.append({"rival": e, "kind": f["kind"], "size": f["size"], "phase": f["phase"],
                           "rival_over_pleio": f["median_us"] / g["median_us"]})
    for x in ratios:
        log(f"{x['rival']:19} {x['kind']:6} {x['size']:5} {x['phase']}: rival / pleio median = "
            f"{x['rival_over_pleio']:.2f}")

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    import engramdb
    import pleio
    report = {
        "command": "~/.cache/pleio/rivals-venv/bin/python scripts/rivals_bench.py " + " ".join(sys.argv[1:]),
        "commit": commit + ("-dirty" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_start_end": [LOAD0, list(os.getloadavg())],
        "nproc": os.cpu_count(),
        "versions": {"pleio": pleio.__version__, "engramdb-python": engramdb.__version__,
                     "service-ple": "0.2.2", "vllm-service-ple": "0.2.2"},
        "table": {"file": os.path.basename(lay.file), "rows": lay.rows, "row_bytes": lay.row_bytes,
                  "shards": len(lay.shards), "file_bytes": os.path.getsize(lay.file),
                  "scale_dtype": lay.scale[0], "synth_s": synth_s},
        "batches": a.batches, "warm_repeat": a.warm_repeat,
        "engines": results, "ratios": ratios, "probes": probes, "formats": formats, "rowids": rid,
    }
    text = json.dumps(report, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
        log(f"wrote {a.json}")
    else:
        print(text)
    return 0


LOAD0 = list(os.getloadavg())

if __name__ == "__main__":
    sys.exit(main())
