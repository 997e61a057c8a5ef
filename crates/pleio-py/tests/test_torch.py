"""The torch door: pleio.torch.gather and Table.gather on torch tensors (any
id shape, every output dtype, bfloat16 through DLPack's kDLBfloat, pinned
and flat outs), PleEmbedding, and the typed errors that leave ``out``
untouched. Skipped, with the reason, where torch is not installed
(scripts/py_test.sh runs the suite in the torch venv when it can make it)."""

import ctypes

import numpy as np
import pytest

import pleio

torch = pytest.importorskip("torch", reason="torch is not installed in this venv")
pt = pytest.importorskip("pleio.torch")

from conftest import cli  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.uint8]
NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.uint8: "raw"}
STRATEGIES = ["fault", "advise", "pread", "uring", "uring-direct", "pool", "auto", "cached", "shared"]


def np_bytes(a) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def t_bytes(t) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("torch") / "fp8"
    cli("synth", "--format", "safetensors", "--encoding", "fp8", "--rows", "4000", "--files", "2",
        "--seed", "9", "-o", path)
    return path


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: NAMES[d])
def test_gather_any_shape_equals_numpy(q, dtype):
    t = pleio.open(q.path)
    rng = np.random.default_rng(1)
    ids = torch.from_numpy(rng.integers(0, q.rows, (5, 16)))
    got = pt.gather(t, ids, dtype=dtype)
    width = q.row_bytes if dtype == torch.uint8 else q.row_elems
    assert got.shape == (5, 16, width) and got.dtype == dtype
    ref = t.gather(ids.numpy().ravel(), dtype=NAMES[dtype])
    assert t_bytes(got) == np_bytes(ref)
    # Table.gather itself takes ids of any shape, NumPy or torch
    assert t.gather(ids.numpy(), dtype=NAMES[dtype]).shape == (5, 16, width)
    assert t.gather(ids, dtype=NAMES[dtype]).shape == (5, 16, width)
    # 3-D and 0-D-like shapes
    assert pt.gather(t, ids.reshape(2, 5, 8), dtype=dtype).shape == (2, 5, 8, width)
    assert pt.gather(t, torch.zeros((0, 16), dtype=torch.long), dtype=dtype).shape == (0, 16, width)


@pytest.mark.parametrize("idt", [torch.int64, torch.int32, torch.int16, torch.uint8, torch.uint16, torch.uint32, torch.uint64])
def test_id_dtypes(q, idt):
    t = pleio.open(q.path)
    ids = torch.tensor([0, 1, 200, 3, 200], dtype=torch.int64).to(idt)
    ref = t.gather(np.array([0, 1, 200, 3, 200]))
    assert t_bytes(pt.gather(t, ids)) == np_bytes(ref)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_checkpoint_every_strategy_bf16_out_in_place(ckpt, strategy):
    t = pleio.open(ckpt, strategy=strategy)
    ids = torch.tensor([[0, t.rows - 1, 7, 7], [1999, 2000, 2001, 3]])
    ref = t.gather(ids.numpy().ravel(), dtype="bfloat16")
    out = torch.full((2, 4, t.row_elems), 3.0, dtype=torch.bfloat16)
    assert pt.gather(t, ids, dtype=torch.bfloat16, out=out) is out
    assert t_bytes(out) == np_bytes(ref)
    # a flat out of the right size, and uint16 bits for bf16
    flat = torch.empty(8 * t.row_elems, dtype=torch.bfloat16)
    pt.gather(t, ids, dtype=torch.bfloat16, out=flat)
    assert t_bytes(flat) == np_bytes(ref)
    bits = torch.zeros((8, t.row_elems), dtype=torch.uint16)
    t.gather(ids, out=bits, dtype="bfloat16")
    assert t_bytes(bits) == np_bytes(ref)


def test_pinned_out(q):
    t = pleio.open(q.path)
    ids = torch.arange(10)
    try:
        out = torch.empty((10, q.row_elems)).pin_memory()
    except RuntimeError as e:  # no CUDA driver: pinned memory cannot be had
        pytest.skip(f"pinned memory needs a CUDA driver here: {e}")
    pt.gather(t, ids, out=out)
    assert t_bytes(out) == np_bytes(t.gather(ids.numpy()))


def test_f32_out_at_an_unaligned_offset(q):
    t = pleio.open(q.path)
    ids = torch.arange(4)
    backing = torch.zeros(4 * q.row_elems * 4 + 2, dtype=torch.uint8)
    # a float32 view is always aligned in torch; an odd byte offset through
    # DLPack of a uint8 tensor is not float32: refused, untouched
    with pytest.raises(pleio.OutputError, match="dtype"):
        t.gather(ids, out=backing[1:-1], dtype="float32")
    assert int(backing.sum()) == 0


def bad_out_cases(q, n):
    e = q.row_elems
    return [
        (torch.full((n, e + 1), 7.0), torch.float32, "elements"),
        (torch.full((n, e), 7.0, dtype=torch.float64), torch.float32, "dtype"),
        (torch.full((n, e), 7.0), torch.bfloat16, "dtype"),
        (torch.full((n, e), 7.0, dtype=torch.float16), torch.bfloat16, "dtype"),
        (torch.full((n, 2 * e), 7.0)[:, ::2], torch.float32, "contiguous"),
        (torch.full((e, n), 7.0).T, torch.float32, "contiguous"),
        (torch.full((n, q.row_bytes), 7, dtype=torch.int8), torch.uint8, "dtype"),
    ]


def test_bad_out_raises_before_anything_is_written(q):
    t = pleio.open(q.path)
    ids = torch.arange(6)
    for out, dtype, what in bad_out_cases(q, 6):
        before = out.clone()
        with pytest.raises(pleio.OutputError, match=what):
            pt.gather(t, ids, dtype=dtype, out=out)
        assert torch.equal(out, before), what


def test_bad_ids_raise_typed_errors_and_write_nothing(q):
    t = pleio.open(q.path)
    out = torch.full((3, q.row_elems), 7.0)
    with pytest.raises(pleio.RowOutOfRangeError, match=str(q.rows)):
        pt.gather(t, torch.tensor([0, q.rows, 1]), out=out)
    with pytest.raises(pleio.RowOutOfRangeError):
        pt.gather(t, torch.tensor([0, -1, 1]), out=out)
    assert bool((out == 7.0).all())
    with pytest.raises(TypeError, match="integers"):
        pt.gather(t, torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="dtype"):
        pt.gather(t, torch.arange(3), dtype=torch.float64)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class FakeDevice:
    """A DLPack producer whose tensor claims to live on a CUDA device (what
    a CUDA torch tensor hands over), backed by host memory so that a write
    would be visible."""

    def __init__(self, n, e, device_type=2, code=2, bits=32):
        self.host = np.full((n, e), 7, dtype=np.float32)
        self.shape = (ctypes.c_int64 * 2)(n, e)
        self.managed = _DLManaged()
        t = self.managed.dl_tensor
        t.data = self.host.ctypes.data
        t.device = _DLDevice(device_type, 0)
        t.ndim = 2
        t.dtype = _DLDataType(code, bits, 1)
        t.shape = self.shape
        t.strides = None
        t.byte_offset = 0

    def __dlpack__(self, *args, **kwargs):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (self.managed.dl_tensor.device.device_type, 0)


def test_a_cuda_out_is_refused_untouched(q):
    t = pleio.open(q.path)
    fake = FakeDevice(4, q.row_elems)
    with pytest.raises(pleio.OutputError, match="cuda"):
        t.gather(np.arange(4), out=fake)
    assert bool((fake.host == 7).all())
    # host memory under the same producer is written
    host = FakeDevice(4, q.row_elems, device_type=1)
    t.gather(np.arange(4), out=host)
    assert np.array_equal(host.host, t.gather(np.arange(4)))


def test_cuda_ids_are_refused(q):
    t = pleio.open(q.path)
    fake = FakeDevice(1, 4, device_type=2, code=0, bits=64)
    fake.host = np.zeros(4, dtype=np.int64)
    fake.managed.dl_tensor.data = fake.host.ctypes.data
    out = torch.full((1, 4, q.row_elems), 7.0)
    with pytest.raises(ValueError, match="cuda"):
        t.gather(fake, out=out)
    assert bool((out == 7.0).all())


def test_rounding_argument_is_checked(q):
    t = pleio.open(q.path)
    with pytest.raises(ValueError, match="rounding"):
        pt.gather(t, torch.arange(3), dtype=torch.bfloat16, rounding="nearest-ish")


def test_ple_embedding_module(ckpt):
    t = pleio.open(ckpt)
    emb = pt.PleEmbedding(t, dtype=torch.bfloat16)
    assert (emb.num_embeddings, emb.embedding_dim) == (t.rows, t.row_elems)
    assert emb.weight.shape == (0, t.row_elems) and emb.weight.dtype == torch.bfloat16
    ids = torch.tensor([[[1, 2], [3, 4]]])
    got = emb(ids)
    assert got.shape == (1, 2, 2, t.row_elems) and got.dtype == torch.bfloat16
    assert t_bytes(got) == np_bytes(t.gather(ids.numpy().ravel(), dtype="bfloat16"))
    emb.to(torch.float32)  # follows the model's dtype, like an nn.Embedding
    assert emb(ids).dtype == torch.float32
    assert t_bytes(emb(ids)) == np_bytes(t.gather(ids.numpy().ravel()))
    assert "pleio" in repr(emb)
    assert not list(emb.parameters()) and not emb.state_dict()
