"""bagua_jax on a CUDA device (world size 1) against the CPU: collectives and
transform(algorithm) for each algorithm through the CUDA FFI handlers
(csrc/ffi/cuda_handlers.cc), with the group's communicator staged through
Gloo and with NCCL. The worker is tests/gpu/jax_cuda_worker.py; every test
here is gpu-marked and skips, with the reason, without a GPU, without the CUDA
handlers in the build, or without jax's CUDA plugin. Registration of the CUDA
handlers without a GPU is tested in tests/jax/test_jax_cuda_registration.py."""

from __future__ import annotations

import importlib.util
import os

import pytest

from bagua_core import _C
from tests.gpu.available import gpu_skip_reason
from tests.gpu.jax_cuda_cases import KINDS, case_names
from tests.harness import mp
from tests.harness.paths import GPU_WORKERS

JAX_CUDA_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def skip_reason(kind: str):
    """Why the GPU session of ``kind`` cannot run here, or None."""
    if not getattr(_C, "has_cuda_ffi", False):
        return "bagua_core was built without the CUDA XLA FFI handlers (needs CUDA and jax at build time)"
    why = gpu_skip_reason(torch_needed=False)
    if why:
        return why
    if not any(_has_module(m) for m in JAX_CUDA_PLUGINS):
        return "jax has no CUDA plugin (install jax[cuda13])"
    if kind == "nccl":
        from bagua_core import _nccl

        try:
            _nccl.find_library()
        except Exception as e:  # noqa: BLE001 - any reason is a skip reason
            return f"no NCCL library: {e}"
    return None


_sessions: dict = {}


def _session(kind: str) -> mp.Run:
    why = skip_reason(kind)
    if why:
        pytest.skip(why)
    if kind not in _sessions:
        # the worker picks its platforms itself; tests/conftest.py pins this process to the CPU
        env = {"JAX_PLATFORMS": "cuda,cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        _sessions[kind] = mp.launch(
            os.path.join(GPU_WORKERS, "jax_cuda_worker.py"), 1, timeout=400, args=[kind], env=env
        )
    return _sessions[kind]


@pytest.mark.gpu
@pytest.mark.timeout(450)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", case_names())
def test_jax_cuda(kind, case):
    _session(kind).check_case(case, 1)


@pytest.mark.gpu
@pytest.mark.timeout(450)
@pytest.mark.parametrize("kind", KINDS)
def test_jax_cuda_worker_exits_cleanly(kind):
    run = _session(kind)
    for line in run.workers[0].stdout.splitlines():
        if line.startswith("BAGUA-GPU-TIMING"):
            print(line)
    run.check()
