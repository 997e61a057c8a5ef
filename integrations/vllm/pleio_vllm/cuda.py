"""The GPU path of ``Qwen4ExpPLEPinnedHostEmbedding._lookup`` served by pleio.

Three steps queued on the current stream (vLLM's PLE prefetch stream), each
capturable into a CUDA graph:

1. the int64 ids, device to pinned host staging (``copy_(non_blocking)``);
2. a host node (``cuLaunchHostFunc``) that gathers their rows with pleio
   into pinned row staging, zeros outside this rank's vocabulary range;
3. the rows, pinned staging to ``output`` (``copy_(non_blocking)``).

Staging is allocated once per module, before any capture, for the largest
lookup vLLM can ask (the prefetch buffer's tokens x heads), so a captured
graph keeps valid addresses. Each distinct lookup size gets one job (its
size and range fixed), kept alive for the graphs that captured it.

The host function is a ctypes callback: it takes the GIL while it runs
(pleio's gather then releases it). A thread that holds the GIL must not wait
for the prefetch stream outside torch (torch releases the GIL in its
synchronizing calls). An error inside the host node cannot be raised there:
the rows are zeros and the error is raised by the next lookup of that module.
NOT YET RUN ON A GPU: see integrations/vllm/gpu_check.sh.
"""

from __future__ import annotations

import ctypes
import threading

import torch

_HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_JOBS: dict[int, "_Job"] = {}
_LOCK = threading.Lock()
_STATE: dict = {}


class _Job:
    __slots__ = ("srv", "ids", "rows", "n", "lo", "hi", "module")

    def __init__(self, module, srv, ids, rows, n, lo, hi):
        self.module, self.srv, self.ids, self.rows, self.n, self.lo, self.hi = module, srv, ids, rows, n, lo, hi


def _run(key) -> None:
    job = _JOBS.get(int(key or 0))
    if job is None:
        return
    try:
        out = job.rows[: job.n * job.srv.row_bytes].view(job.srv.out_dtype).view(job.n, -1)
        job.srv.fill(job.ids[: job.n], out, job.lo, job.hi)
    except BaseException as e:  # noqa: BLE001 - a host node cannot raise: kept for the next lookup
        job.rows[: job.n * job.srv.row_bytes].zero_()
        job.module._pleio_error = e


_CALLBACK = _HOSTFN(_run)


def _libcuda():
    lib = _STATE.get("libcuda")
    if lib is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, _HOSTFN, ctypes.c_void_p]
        lib.cuLaunchHostFunc.restype = ctypes.c_int
        _STATE["libcuda"] = lib
    return lib


def _staging(module, srv, n: int):
    st = getattr(module, "_pleio_staging", None)
    if st is not None and st[0].numel() >= n:
        return st
    if torch.cuda.is_current_stream_capturing() or getattr(module, "_pleio_captured", False):
        raise RuntimeError(
            f"pleio: a PLE lookup of {n} ids after CUDA graph capture needs more staging than was "
            f"allocated ({0 if st is None else st[0].numel()} ids)"
        )
    buf = getattr(module, "_prefetch_buffer", None)
    cap = n if buf is None else max(n, buf.shape[0] * buf.shape[1])
    ids = torch.empty(cap, dtype=torch.int64, pin_memory=True)
    rows = torch.empty(cap * srv.row_bytes, dtype=torch.uint8, pin_memory=True)
    module._pleio_staging = (ids, rows)
    return module._pleio_staging


def lookup_on_stream(module, srv, flat_ids: torch.Tensor, output: torch.Tensor, lo: int, hi: int) -> None:
    """Queues D2H ids, the host-node gather and H2D rows on the current stream."""
    err = getattr(module, "_pleio_error", None)
    if err is not None:
        module._pleio_error = None
        raise RuntimeError(f"pleio: an earlier PLE lookup of {module._pleio_prefix} failed: {err}") from err
    n = flat_ids.numel()
    ids_h, rows_h = _staging(module, srv, n)
    capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        module._pleio_captured = True
    key = (id(module), n, lo, hi)
    with _LOCK:
        jobs = module.__dict__.setdefault("_pleio_jobs", {})
        job_id = jobs.get(key)
        if job_id is None:
            job_id = len(_JOBS) + 1
            _JOBS[job_id] = _Job(module, srv, ids_h, rows_h, n, lo, hi)
            jobs[key] = job_id
    stream = torch.cuda.current_stream()
    ids_h[:n].copy_(flat_ids.long(), non_blocking=True)
    rc = _libcuda().cuLaunchHostFunc(ctypes.c_void_p(stream.cuda_stream), _CALLBACK, ctypes.c_void_p(job_id))
    if rc != 0:
        raise RuntimeError(f"pleio: cuLaunchHostFunc failed with CUresult {rc}")
    output.view(torch.uint8).reshape(-1).copy_(rows_h[: n * srv.row_bytes], non_blocking=True)
