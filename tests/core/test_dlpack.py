"""DLPack import (zero-copy views of numpy / torch / JAX arrays) and core-owned
Buffers exported to numpy / torch / JAX. Single process."""

import ctypes
import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

import bagua_core as bc
from tests.harness.dlpack_structs import (
    DELETER,
    DLDataType,
    DLDevice,
    DLManagedTensor,
    DLTensor,
    FakeDeviceArray,
    legacy_capsule,
)

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy
ml_dtypes = pytest.importorskip("ml_dtypes")

SUPPORTED = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"]


def numpy_array(dtype, n=6):
    if dtype == "bfloat16":
        return np.arange(n).astype(ml_dtypes.bfloat16)
    return np.arange(n).astype(dtype)


# --- import -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", SUPPORTED)
def test_import_numpy_torch_jax_every_dtype(dtype):
    a = numpy_array(dtype).reshape(2, 3)
    v = bc.import_array(a)
    assert (v.address, v.numel, v.shape, v.dtype.name) == (a.ctypes.data, 6, (2, 3), dtype)
    assert (v.device_type, v.device_index, v.read_only) == ("cpu", 0, False)
    assert v.nbytes == a.nbytes

    t = torch.arange(6).to(getattr(torch, dtype)).reshape(3, 2)
    v = bc.import_array(t)
    assert (v.address, v.shape, v.dtype.name) == (t.data_ptr(), (3, 2), dtype)

    if dtype in ("float64", "int64") and not jax.config.jax_enable_x64:
        return  # jax stores these as 32-bit without x64
    j = jnp.arange(6, dtype=dtype)
    v = bc.import_array(j)
    assert (v.address, v.dtype.name, v.read_only) == (j.unsafe_buffer_pointer(), dtype, True)


@pytest.mark.parametrize(
    "bad,name",
    [
        (np.zeros(3, np.complex64), "complex64"),
        (np.zeros(3, np.bool_), "bool"),
        (np.zeros(3, np.int8), "int8"),
        (np.zeros(3, np.uint16), "uint16"),
        (torch.zeros(3, dtype=torch.complex128), "complex128"),
        (torch.zeros(3, dtype=torch.int16), "int16"),
        (np.zeros(3, ml_dtypes.float8_e4m3fn), "float8"),
    ],
)
def test_unsupported_dtype_is_type_error_naming_it(bad, name):
    with pytest.raises(TypeError, match=name):
        bc.import_array(bad)


def test_not_an_array():
    with pytest.raises(TypeError, match="DLPack"):
        bc.import_array([1.0, 2.0])


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(12.0).reshape(3, 4)[:, ::2],
        lambda: np.arange(12.0).reshape(3, 4).T,
        lambda: np.arange(6.0)[::-1],
        lambda: torch.arange(12.0).reshape(3, 4).t(),
    ],
)
def test_non_contiguous_rejected(make):
    with pytest.raises(ValueError, match="not C-contiguous"):
        bc.import_array(make())


def test_contiguous_corner_cases():
    # size-1 dimensions may carry any stride; empty arrays have no layout
    t = torch.zeros(1, 5).t().contiguous().t()  # shape (1, 5), odd stride on the size-1 dim
    assert bc.import_array(t).numel == 5
    assert bc.import_array(torch.zeros(5, 1).expand(5, 1)).numel == 5
    assert bc.import_array(np.zeros((0, 4))[:, ::2]).numel == 0
    assert bc.import_array(np.ones((), np.float32)).shape == ()
    a = np.arange(10.0)
    assert bc.import_array(a[3:]).address == a.ctypes.data + 3 * 8


def test_read_only_flags():
    a = np.arange(4.0)
    a.flags.writeable = False
    assert bc.import_array(a).read_only  # versioned capsule carries the flag
    assert bc.import_array(jnp.arange(4.0)).read_only  # JAX: immutable by type
    assert not bc.import_array(np.arange(4.0)).read_only


def test_view_keeps_producer_alive_and_deleter_runs():
    a = np.arange(1000.0)
    alive = weakref.ref(a)
    v = bc.import_array(a)
    del a
    gc.collect()
    assert alive() is not None, "the view must keep the producer's array alive"
    assert ctypes.c_double.from_address(v.address + 8 * 7).value == 7.0
    del v
    gc.collect()
    assert alive() is None, "dropping the view must call the producer's deleter"


def test_capsule_is_consumed_once():
    cap = np.arange(3.0).__dlpack__(max_version=(1, 0))
    v = bc.DLPackView(cap)
    assert "used_dltensor_versioned" in repr(cap)
    with pytest.raises(ValueError, match="already consumed"):
        bc.DLPackView(cap)
    del v
    with pytest.raises(TypeError, match="capsule"):
        bc.DLPackView(object())


class LegacyProducer:
    """A producer older than DLPack 1.0: __dlpack__ takes no max_version."""

    def __init__(self, a):
        self.a = a
        self.calls = []

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_legacy_producer_fallback():
    a = np.arange(5, dtype=np.int32)
    p = LegacyProducer(a)
    v = bc.import_array(p)
    assert v.address == a.ctypes.data and v.numel == 5 and not v.read_only
    assert p.calls == [None]


def test_unsupported_device():
    class OnVulkan(LegacyProducer):
        def __dlpack_device__(self):
            return (7, 0)

    with pytest.raises(TypeError, match="device"):
        bc.import_array(OnVulkan(np.zeros(2)))
    with pytest.raises(TypeError, match="device type 7"):
        bc.DLPackView(FakeDeviceArray(2, device_type=7).__dlpack__())
    v = bc.import_array(FakeDeviceArray(3, device_type=2))
    assert (v.device_type, v.device_index, v.numel) == ("cuda", 0, 3)


def test_byte_offset_and_deleter_of_a_hand_made_capsule():
    storage = np.arange(10, dtype=np.float32)
    shape = (ctypes.c_int64 * 1)(4)
    deleted = []
    deleter = DELETER(lambda p: deleted.append(True))
    m = DLManagedTensor()
    m.dl_tensor = DLTensor(storage.ctypes.data, DLDevice(1, 0), 1, DLDataType(2, 32, 1), shape, None, 3 * 4)
    m.deleter = deleter
    cap = legacy_capsule(m)
    v = bc.DLPackView(cap)
    assert v.address == storage.ctypes.data + 12 and v.shape == (4,)
    assert ctypes.c_float.from_address(v.address).value == 3.0
    assert not deleted
    del v
    gc.collect()
    assert deleted == [True]


# --- buffers ------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 3, 17, 1000, 4097])
def test_buffer_alignment(n):
    b = bc.empty(n, "uint8")
    assert b.address % 64 == 0 and b.nbytes == n and b.shape == (n,)


@pytest.mark.parametrize("dtype", SUPPORTED)
def test_buffer_zero_copy_views(dtype):
    b = bc.zeros((2, 3), dtype)
    assert (b.shape, b.dtype.name, b.numel, b.nbytes) == ((2, 3), dtype, 6, 6 * b.dtype.itemsize)
    a = b.numpy()
    t = torch.from_dlpack(b)
    assert t.data_ptr() == b.address and a.ctypes.data == b.address
    a[1, 2] = 7
    assert float(t[1, 2]) == 7.0
    t[0, 0] = 5
    assert float(a[0, 0]) == 5.0
    if dtype in ("float64", "int64") and not jax.config.jax_enable_x64:
        return
    j = jnp.from_dlpack(b)
    assert j.unsafe_buffer_pointer() == b.address, "jax must view, not copy"
    assert j.dtype == jnp.dtype(dtype) and float(j[1, 2]) == 7.0 and float(j[0, 0]) == 5.0


def test_buffer_outlives_its_python_object():
    b = bc.empty(1 << 16, "float32")
    a = np.from_dlpack(b)
    t = torch.from_dlpack(b)
    j = jnp.from_dlpack(bc.zeros(4, "float32"))  # the buffer object dies at once
    a[:] = 2.0
    del b
    gc.collect()
    bc.zeros(1 << 16, "float32")  # would reuse freed memory
    assert float(t.sum()) == 2.0 * (1 << 16) and float(j.sum()) == 0.0


def test_buffer_dlpack_protocol():
    b = bc.zeros((2, 2), "float32")
    assert b.__dlpack_device__() == (1, 0)
    assert "dltensor_versioned" in repr(b.__dlpack__(max_version=(1, 0)))
    assert "dltensor" in repr(b.__dlpack__())
    c = np.from_dlpack(b, copy=True)
    c[0, 0] = 9
    assert c.ctypes.data != b.address and b.numpy()[0, 0] == 0
    with pytest.raises(BufferError):
        b.__dlpack__(dl_device=(2, 0))
    # an unconsumed capsule releases its reference when collected
    cap = b.__dlpack__(max_version=(1, 0))
    del cap
    gc.collect()
    v = bc.import_array(b)
    assert v.address == b.address and not v.read_only


def _engine_view():
    from bagua_core._loader import _C

    bucket = _C.Bucket("b", int(bc.DType.float32), [("x", (2, 2))], 1)
    return bucket.view("x")


PRODUCERS = {"Buffer": lambda: bc.zeros((2, 2), "float32"), "engine MemoryView": _engine_view}


@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_every_producer_answers_the_protocol_alike(producer):
    """Buffer and engine views share one export path: same capsules, same
    answers to the consumer's arguments."""
    x = PRODUCERS[producer]()
    assert x.__dlpack_device__() == (1, 0)
    assert "dltensor_versioned" in repr(x.__dlpack__(max_version=(1, 0)))
    assert "dltensor_versioned" in repr(x.__dlpack__(max_version=[1, 3]))
    legacy = x.__dlpack__(max_version=(0, 8))
    assert "dltensor" in repr(legacy) and "versioned" not in repr(legacy)
    assert "versioned" not in repr(x.__dlpack__())
    x.__dlpack__(dl_device=(1, 0), copy=False)
    with pytest.raises(BufferError, match="another device"):
        x.__dlpack__(dl_device=(2, 0))
    for bad in (
        {"max_version": 1},
        {"max_version": "1.0"},
        {"max_version": (1, 0, 0)},
        {"dl_device": "cpu"},
        {"dl_device": (1.5, 0)},
        {"copy": "yes"},
    ):
        with pytest.raises(TypeError, match=next(iter(bad))):
            x.__dlpack__(**bad)
    t = torch.from_dlpack(x)
    t.fill_(3.0)
    assert np.from_dlpack(x).sum() == 12.0  # both views share the memory
    del t
    caps = [x.__dlpack__(max_version=(1, 0)), x.__dlpack__()]
    del caps  # unconsumed capsules free their exports
    gc.collect()


def test_buffer_misc():
    assert bc.empty((), "int64").shape == () and bc.empty((), "int64").numel == 1
    e = bc.empty((0, 5), "float32")
    assert np.from_dlpack(e).shape == (0, 5)
    b = bc.zeros(4, "bfloat16")
    assert b.numpy().dtype == ml_dtypes.bfloat16
    assert b.view(bc.DType.uint8).shape == (8,) and b.view(bc.DType.uint8).address == b.address
    with pytest.raises(ValueError):
        bc.zeros(3, "uint8").view(bc.DType.float32)
    j = jnp.arange(5.0)
    c = bc.from_array(j)
    assert c.address != j.unsafe_buffer_pointer() and np.array_equal(c.numpy(), np.arange(5.0))
    with pytest.raises(TypeError, match="bool"):
        bc.empty(3, "bool")
    with pytest.raises(ValueError, match="negative"):
        bc.empty((2, -1), "float32")
    assert bc.as_dtype(torch.bfloat16) == bc.DType.bfloat16
    assert bc.as_dtype(jnp.float16) == bc.DType.float16 and bc.as_dtype(np.int64) == bc.DType.int64
    assert "Buffer(shape=(0, 5), dtype=float32" in repr(e)


def test_core_imports_neither_torch_nor_jax():
    code = (
        "import sys, bagua_core, bagua_core.comm, bagua_core.process_group, bagua_core.buffer; "
        "bad = [m for m in ('torch', 'jax', 'jaxlib') if m in sys.modules]; "
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_cuda_buffer_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(bc.BaguaError, match="(?i)cuda"):
        bc.empty(3, "float32", device="cuda")


@pytest.mark.gpu
def test_cuda_buffer_zero_copy_with_torch():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    b = bc.zeros((4, 2), "float32", device="cuda")
    assert b.__dlpack_device__() == (2, 0)
    t = torch.from_dlpack(b)
    assert t.is_cuda and t.data_ptr() == b.address
    t += 3
    torch.cuda.synchronize()
    v = bc.import_array(t)
    assert (v.device_type, v.address, v.shape) == ("cuda", b.address, (4, 2))
    c = bc.from_array(t)  # device-to-device copy
    assert float(torch.from_dlpack(c).sum()) == 24.0
