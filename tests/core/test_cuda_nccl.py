"""CUDA side of the engine: build flags, device discovery, NCCL library
resolution and loading, the NCCL communicator and the CUDA kernels.

CPU tests run everywhere. Tests marked ``gpu`` need a CUDA device and torch
with CUDA, and skip cleanly otherwise; on a GPU machine they run every
NcclCommunicator operation on torch CUDA tensors (one process per GPU, or a
single process on a single GPU) against torch CPU results.
"""

import functools
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bagua_core import _C, _nccl
from tests.gpu.available import gpu_skip_reason
from tests.gpu.nccl_cases import DTYPES, case_names
from tests.harness import mp
from tests.harness.built_with import needs_test_bindings
from tests.harness.paths import GPU_WORKERS, REPO

CODE = dict(DTYPES)
needs_cuda_build = pytest.mark.skipif(not _C.built_with_cuda, reason="built without CUDA")


def _nvcc_available():
    return shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")


# ---------------------------------------------------------------------------
# Build and device discovery


def test_built_with_cuda_when_nvcc_exists():
    if not _nvcc_available():
        pytest.skip("no nvcc on this machine")
    assert _C.built_with_cuda is True


def test_cuda_device_count_without_gpu_is_zero():
    n = _C.cuda_device_count()
    assert isinstance(n, int) and n >= 0
    if not os.path.exists("/dev/nvidia0") and not os.path.exists("/dev/nvidiactl"):
        assert n == 0
        assert _C.cuda_unavailable_reason()  # says why, in words
    if _C.built_with_cuda:
        assert _C.cuda_runtime_version() >= 11000


def test_module_imports_without_torch():
    code = "import sys, bagua_core._nccl; assert 'torch' not in sys.modules and 'jax' not in sys.modules"
    subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, check=True, timeout=60, env={**os.environ, "PYTHONPATH": REPO}
    )


# ---------------------------------------------------------------------------
# Library resolution (bagua_core/_nccl.py)


def _fake_lib(directory):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "libnccl.so.2")
    with open(path, "wb") as f:
        f.write(b"not really")
    return path


def test_find_library_reports_what_was_tried(tmp_path):
    with pytest.raises(_nccl.NcclNotFoundError) as info:
        _nccl.find_library(env={}, search_path=[str(tmp_path)], maps_text="")
    msg = str(info.value)
    assert "BAGUA_NCCL_LIBRARY" in msg and "nvidia-nccl" in msg and "pip install" in msg
    assert isinstance(info.value, _C.BaguaError)


def test_find_library_explicit_path(tmp_path):
    lib = _fake_lib(str(tmp_path / "lib"))
    assert _nccl.find_library(env={"BAGUA_NCCL_LIBRARY": lib}, maps_text="") == lib
    assert _nccl.find_library(library=lib, env={}, maps_text="") == lib
    assert _nccl.find_library(env={"BAGUA_NCCL_LIBRARY": str(tmp_path / "lib")}, maps_text="") == lib  # a directory
    with pytest.raises(_nccl.NcclNotFoundError, match="does not exist"):
        _nccl.find_library(env={"BAGUA_NCCL_LIBRARY": str(tmp_path / "missing.so")}, maps_text="")
    with pytest.raises(_nccl.NcclNotFoundError, match="directory without"):
        _nccl.find_library(env={"BAGUA_NCCL_LIBRARY": str(tmp_path)}, maps_text="")


def test_find_library_in_wheel_layout(tmp_path):
    lib = _fake_lib(str(tmp_path / "site" / "nvidia" / "nccl" / "lib"))
    found = _nccl.find_library(env={}, search_path=[str(tmp_path / "empty"), str(tmp_path / "site")], maps_text="")
    assert found == lib


def test_find_library_already_mapped(tmp_path):
    lib = _fake_lib(str(tmp_path / "torch" / "lib"))
    maps = textwrap.dedent(f"""\
        7f0000000000-7f0000001000 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
        7f0000002000-7f0000003000 r-xp 00000000 08:01 456 {lib}
        7f0000004000-7f0000005000 rw-p 00000000 00:00 0
        """)
    assert _nccl.mapped_libraries(maps) == [lib]
    assert _nccl.find_library(env={}, search_path=[], maps_text=maps) == lib


def _maps_with(path):
    return f"7f0000002000-7f0000003000 r-xp 00000000 08:01 456 {path}\n"


def test_library_order_is_process_then_setting_then_wheel(tmp_path, caplog):
    """One NCCL per process: the one torch loaded wins over BAGUA_NCCL_LIBRARY
    (said in a warning), which wins over the wheel."""
    assert _nccl.ORDER == ("process", "setting", "wheel")
    torch_lib = _fake_lib(str(tmp_path / "torch" / "lib"))
    setting = _fake_lib(str(tmp_path / "setting"))
    wheel = _fake_lib(str(tmp_path / "site" / "nvidia" / "nccl" / "lib"))
    site = [str(tmp_path / "site")]
    env = {"BAGUA_NCCL_LIBRARY": setting}
    with caplog.at_level("WARNING", logger="bagua"):
        assert _nccl.find_library(env=env, search_path=site, maps_text=_maps_with(torch_lib)) == torch_lib
    assert "BAGUA_NCCL_LIBRARY" in caplog.text and "is ignored" in caplog.text and torch_lib in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="bagua"):  # the setting naming torch's own file: no warning
        assert (
            _nccl.find_library(env={"BAGUA_NCCL_LIBRARY": torch_lib}, search_path=site, maps_text=_maps_with(torch_lib))
            == torch_lib
        )
    assert "ignored" not in caplog.text
    assert _nccl.find_library(env=env, search_path=site, maps_text="") == setting
    assert _nccl.find_library(env={}, search_path=site, maps_text="") == wheel
    with pytest.raises(_nccl.NcclNotFoundError) as info:
        _nccl.find_library(env={}, search_path=[str(tmp_path / "empty")], maps_text="")
    msg = str(info.value)
    assert msg.index("this process") < msg.index("BAGUA_NCCL_LIBRARY") < msg.index("nvidia-nccl wheel")
    assert "import torch" in msg and "nvidia-nccl" in msg and "BAGUA_NCCL_LIBRARY" in msg


@needs_cuda_build
def test_communicators_use_one_library_per_process(tmp_path, monkeypatch):
    ok = _stub_library(str(tmp_path), 22907, True)
    other = _stub_library(str(tmp_path), 22801, True)
    monkeypatch.setattr(_nccl, "_process_library", None)
    monkeypatch.setattr(_nccl, "find_library", lambda library=None: library or ok)
    assert _nccl.library_for_communicators() == ok and _nccl.process_library() == ok
    assert _nccl.library_for_communicators(ok) == ok
    with pytest.raises(_C.BaguaError, match="one NCCL library per process"):
        _nccl.library_for_communicators(other)


@needs_cuda_build
def test_library_refused_before_it_is_remembered(tmp_path, monkeypatch):
    too_old = _stub_library(str(tmp_path), 21300, True)
    monkeypatch.setattr(_nccl, "_process_library", None)
    with pytest.raises(_C.BaguaError, match="needs NCCL >= 2.14.0"):
        _nccl.library_for_communicators(too_old)
    assert _nccl.process_library() is None


# ---------------------------------------------------------------------------
# Loading the library (C++: dlopen + dlsym of every function)


@needs_cuda_build
def test_nccl_version_errors_name_the_problem():
    with pytest.raises(_C.BaguaError, match="cannot load the NCCL library '/nonexistent/libnccl.so.2'"):
        _C.nccl_version("/nonexistent/libnccl.so.2")
    libc = _mapped("libc.so")[0]  # a real library, but not NCCL
    with pytest.raises(_C.BaguaError, match="no symbol 'ncclGetVersion'"):
        _C.nccl_version(libc)
    with pytest.raises(ValueError):
        _C.nccl_version("")


def _mapped(name):
    with open("/proc/self/maps") as f:
        paths = [line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6]
    return [p for p in paths if os.path.basename(p).startswith(name)]


def _stub_library(tmpdir, version, full):
    """A tiny shared library posing as NCCL: ncclGetVersion only, or every symbol."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    names = (
        [
            "ncclGetUniqueId",
            "ncclCommInitRankConfig",
            "ncclCommFinalize",
            "ncclCommDestroy",
            "ncclCommAbort",
            "ncclCommGetAsyncError",
            "ncclGetErrorString",
            "ncclGetLastError",
            "ncclAllReduce",
            "ncclReduce",
            "ncclBroadcast",
            "ncclAllGather",
            "ncclReduceScatter",
            "ncclSend",
            "ncclRecv",
            "ncclGroupStart",
            "ncclGroupEnd",
        ]
        if full
        else []
    )
    src = f"int ncclGetVersion(int* v) {{ *v = {version}; return 0; }}\n"
    src += "".join(f"int {n}(void) {{ return 0; }}\n" for n in names)
    c_path = os.path.join(tmpdir, f"stub_{version}_{int(full)}.c")
    so_path = c_path[:-2] + ".so"
    with open(c_path, "w") as f:
        f.write(src)
    subprocess.run([cc, "-shared", "-fPIC", "-o", so_path, c_path], check=True, timeout=60)
    return so_path


@needs_cuda_build
def test_nccl_library_checks_with_stub(tmp_path):
    old = _stub_library(str(tmp_path), 21300, False)
    assert _C.nccl_version(old) == 21300
    with pytest.raises(
        _C.BaguaError, match=r"no symbol 'ncclGetUniqueId' \(it is NCCL 2.13.0; Bagua needs NCCL >= 2.14.0\)"
    ):
        _C.nccl_check_library(old)
    too_old = _stub_library(str(tmp_path), 21300, True)
    with pytest.raises(_C.BaguaError, match="is NCCL 2.13.0; Bagua needs NCCL >= 2.14.0"):
        _C.nccl_check_library(too_old)
    ok = _stub_library(str(tmp_path), 22907, True)
    assert _C.nccl_check_library(ok) == 22907
    # ncclConfig_t is NCCL 2's layout: another major version is refused, naming both
    nccl3 = _stub_library(str(tmp_path), 30000, True)
    with pytest.raises(_C.BaguaError, match=r"is NCCL 3.0.0; Bagua passes NCCL 2's ncclConfig_t layout"):
        _nccl.check_library(nccl3)
    assert _nccl.version_string(22907) == "2.29.7" and _nccl.version_string(2708) == "2.7.8"


def _real_nccl():
    try:
        return _nccl.find_library()
    except _nccl.NcclNotFoundError:
        return None


@needs_cuda_build
def test_real_nccl_library_loads_without_gpu():
    lib = _real_nccl()
    if lib is None:
        pytest.skip("no NCCL library installed (set BAGUA_NCCL_LIBRARY to test one)")
    v = _C.nccl_version(lib)
    assert v >= 21400, v
    assert _C.nccl_check_library(lib) == v
    print(f"NCCL {_nccl.version_string(v)} at {lib}")


# ---------------------------------------------------------------------------
# The communicator without a GPU: clear exceptions, no crash


@pytest.fixture
def store():
    with _C.TcpStoreServer("127.0.0.1", 0) as server, _C.TcpStore("127.0.0.1", server.port, 0, 10.0) as client:
        yield client


def test_create_nccl_communicator_without_gpu_fails_cleanly(tmp_path, store):
    if _C.cuda_device_count() > 0:
        pytest.skip("this machine has a GPU")
    lib = _real_nccl() or _fake_lib(str(tmp_path))
    with pytest.raises(_C.BaguaError) as info:
        _C.create_nccl_communicator(store, "world", 0, 1, 0, 5.0, lib)
    msg = str(info.value)
    if _C.built_with_cuda:
        assert "no usable CUDA device" in msg and "world" in msg, msg
    else:
        assert "built without CUDA" in msg
    with pytest.raises(_C.BaguaError):
        _nccl.create_communicator(store, "world", 0, 1, 0, timeout_s=5.0, library=lib)


@needs_cuda_build
def test_create_nccl_communicator_rejects_bad_arguments(store):
    with pytest.raises(ValueError):
        _C.create_nccl_communicator(store, "w", 2, 2, 0, 5.0, "/x")  # rank out of range
    with pytest.raises(ValueError):
        _C.create_nccl_communicator(store, "w", 0, 0, 0, 5.0, "/x")  # empty group
    with pytest.raises(ValueError):
        _C.create_nccl_communicator(store, "w", 0, 1, -1, 5.0, "/x")  # device
    with pytest.raises(ValueError):
        _C.create_nccl_communicator(store, "w", 0, 1, 0, 0.0, "/x")  # timeout
    with pytest.raises((TypeError, ValueError), match="store"):
        _C.create_nccl_communicator(None, "w", 0, 1, 0, 5.0, "/x")
    with pytest.raises(TypeError):
        _C.create_nccl_communicator({}, "w", 0, 1, 0, 5.0, "/x")


@needs_test_bindings
@needs_cuda_build
def test_cuda_kernels_reject_host_memory_without_crash():
    x = np.ones(8, dtype=np.float32)
    # ValueError where CUDA can tell host memory; BaguaError without a driver
    with pytest.raises((ValueError, _C.BaguaError)):
        _C.kernels.cuda_divide(x.ctypes.data, 8, CODE["float32"], 2.0)
    assert np.all(x == 1)


# ---------------------------------------------------------------------------
# The element functions on the CPU (the same BAGUA_HD code as the CUDA kernels)


def _torch():
    return pytest.importorskip("torch")


@needs_test_bindings
@pytest.mark.parametrize("dname", [d for d, _ in DTYPES])
@pytest.mark.parametrize("kind", ["divide", "scale"])
def test_host_element_functions_match_torch(kind, dname):
    torch = _torch()
    dtype = getattr(torch, dname)
    g = torch.Generator().manual_seed(7)
    n = 1001
    if dname == "uint8":
        x = torch.randint(0, 256, (n,), generator=g).to(dtype)
    elif dtype.is_floating_point:
        x = (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dtype)
        x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")], dtype=dtype)
    else:
        x = torch.randint(-1000, 1000, (n,), generator=g).to(dtype)
    y = x.clone()
    if kind == "divide":
        _C.kernels.host_divide(y.data_ptr(), n, CODE[dname], 3.0)
        ref = x / 3.0 if dtype.is_floating_point else torch.div(x.to(torch.int64), 3, rounding_mode="trunc").to(dtype)
    else:
        _C.kernels.host_scale(y.data_ptr(), n, CODE[dname], 0.37)
        ref = x * 0.37 if dtype.is_floating_point else (x.double() * 0.37).trunc().to(dtype)
    # rounded to nearest even in the dtype, like torch: bit-identical (NaN payloads aside)
    ref = ref.to(dtype)
    if dtype.is_floating_point:
        nan = torch.isnan(ref)
        assert torch.equal(torch.isnan(y), nan)
        y, ref = y[~nan], ref[~nan]
    assert torch.equal(y.view(torch.uint8), ref.view(torch.uint8)), (y[:8], ref[:8])


@needs_test_bindings
def test_host_divide_rejects_bad_integer_divisor():
    x = np.arange(4, dtype=np.int32)
    for bad in (0.0, 2.5):
        with pytest.raises(ValueError, match="divisor"):
            _C.kernels.host_divide(x.ctypes.data, 4, CODE["int32"], bad)
    with pytest.raises(ValueError, match="dtype"):
        _C.kernels.host_divide(x.ctypes.data, 4, 42, 2.0)
    _C.kernels.host_divide(0, 0, CODE["int32"], 2.0)  # empty: nothing to touch
    assert list(x) == [0, 1, 2, 3]


# ---------------------------------------------------------------------------
# GPU: every operation on torch CUDA tensors (skipped without a GPU)


def _gpu_world():
    """Ranks for the GPU tests (one per GPU, at most 4), or a skip reason."""
    why = gpu_skip_reason()
    if why:
        return None, why
    import torch

    n = _C.cuda_device_count()
    if _real_nccl() is None:
        return None, "no NCCL library (pip install the gpu extra or set BAGUA_NCCL_LIBRARY)"
    return min(n, torch.cuda.device_count(), 4), ""


def _need_gpu(min_gpus=1):
    world, why = _gpu_world()
    if world is None:
        pytest.skip(why)
    if world < min_gpus:
        pytest.skip(f"needs {min_gpus} GPUs, found {world}")
    return world


@functools.lru_cache(maxsize=None)
def _gpu_session():
    world = _need_gpu()
    run = mp.launch(os.path.join(GPU_WORKERS, "nccl_worker.py"), world, timeout=600, env={"BAGUA_TEST_TIMEOUT": "120"})
    return world, run


@pytest.mark.gpu
@pytest.mark.timeout(660)
@pytest.mark.parametrize("case", case_names())
def test_gpu_nccl(case):
    world, run = _gpu_session()
    results = run.cases()
    if case not in results:
        pytest.fail(f"case {case} did not report\n{run.summary()}")
    for rank in range(world):
        rec = results[case].get(rank)
        assert rec is not None, f"rank {rank} did not report {case}\n{run.summary()}"
        assert rec["ok"], f"rank {rank}: {rec['error']}"
    assert not run.timed_out, run.summary()


@pytest.mark.gpu
@pytest.mark.timeout(200)
def test_gpu_missing_rank_times_out():
    _need_gpu()
    run = mp.launch(os.path.join(GPU_WORKERS, "nccl_failure_worker.py"), 1, args=["lonely"], timeout=180)
    cases = run.cases()
    for name in ("init_missing_rank_times_out", "new_communicator_after_abort"):
        assert name in cases and cases[name][0]["ok"], f"{name}\n{run.summary()}"
    run.check()


@pytest.mark.gpu
@pytest.mark.timeout(200)
def test_gpu_dead_peer_becomes_exception():
    _need_gpu(min_gpus=2)
    run = mp.launch(os.path.join(GPU_WORKERS, "nccl_failure_worker.py"), 2, args=["dead_peer"], timeout=180)
    cases = run.cases()
    for name in ("sync_op_fails", "later_call_fails_at_once", "watchdog_aborts_stream_op"):
        assert name in cases and cases[name][0]["ok"], f"{name}\n{run.summary()}"
    run.check()
