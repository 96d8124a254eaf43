"""bagua_jax's FFI handlers on both platforms, without a GPU: the module has
CUDA handlers exactly when it was built with CUDA, registering them on this
CPU-only jaxlib is harmless (the CPU collectives keep working: the JAX tests
on CPU run with them registered), and lowering for CUDA emits the same
targets as on CPU with XLA's token, refusing cleanly where no handler or the
wrong group; the leader broadcast alone is CPU only (XLA's collective-broadcast
on GPUs)."""

from __future__ import annotations

import os

import pytest

from bagua_core import _C
from tests.harness.paths import REPO

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

pytestmark = pytest.mark.skipif(not _C.has_xla_ffi, reason="bagua_core was built without the XLA FFI handlers")
needs_cuda_handlers = pytest.mark.skipif(
    not getattr(_C, "has_cuda_ffi", False), reason="bagua_core was built without CUDA: no CUDA handlers"
)

NAMES = {"bagua_allreduce", "bagua_broadcast", "bagua_allgather", "bagua_step", "bagua_async_step"}
CPU_ONLY = {"bagua_leader_broadcast"}  # on GPUs XLA's collective-broadcast does its work


def test_cuda_handlers_exactly_in_cuda_builds():
    assert _C.has_cuda_ffi is _C.built_with_cuda


def test_target_table_lists_both_platforms():
    table = _C.ffi_targets()
    assert set(table["cpu"]) == NAMES | CPU_ONLY
    if _C.has_cuda_ffi:
        assert set(table) == {"cpu", "CUDA"}
        assert set(table["CUDA"]) == NAMES
    else:
        assert set(table) == {"cpu"}


def test_registration_on_cpu_only_jaxlib_is_harmless():
    import bagua_jax  # registers on import
    from bagua_jax._src import ffi

    registered = ffi.register_targets()
    assert registered["cpu"] == NAMES | CPU_ONLY
    assert registered.get("cuda", set()) == (NAMES if _C.has_cuda_ffi else set())
    assert ffi.register_targets() is registered  # once per process
    assert {d.platform for d in jax.devices()} == {"cpu"}  # no CUDA backend came with it
    # CPU lowering and compilation are unchanged
    g = _group("cpu")
    compiled = jax.jit(lambda x: bagua_jax.allreduce(x, group=g)).trace(jnp.ones(3)).lower().compile()
    assert compiled is not None


def _group(platform):
    from bagua_jax._src.groups import GroupInfo

    return GroupInfo(handle=7, size=2, rank=0, platform=platform)  # lowering only: never run


def _cuda_text(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@needs_cuda_handlers
@pytest.mark.parametrize("which", ["allreduce", "broadcast", "allgather"])
def test_cuda_lowering_emits_the_collective_target(which):
    import bagua_jax

    g = _group("cuda")
    fn = {
        "allreduce": lambda x: bagua_jax.allreduce(x, "avg", group=g),
        "broadcast": lambda x: bagua_jax.broadcast(x, 1, group=g),
        "allgather": lambda x: bagua_jax.allgather(x, group=g),
    }[which]
    text = _cuda_text(fn, jnp.ones((2, 3), jnp.float32))
    calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert len(calls) == 1 and f"@bagua_{which}(" in calls[0], calls
    assert "comm = 7" in calls[0] and "!stablehlo.token" in calls[0]


@needs_cuda_handlers
def test_cuda_lowering_emits_the_step_target():
    from bagua_jax._src.collective_ops.algorithm_step import BoundStep, algorithm_step

    bound = BoundStep("decentralized", "communication_interval=2", _group("cuda"), -1, -1, True, 0, "m")
    text = _cuda_text(
        lambda s, a, b: algorithm_step([a, b], s, bound, bucket=3)[0],
        jnp.int32(0),
        jnp.ones(4, jnp.float32),
        jnp.ones(5, jnp.float32),
    )
    calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert len(calls) == 1 and "@bagua_step(" in calls[0], calls
    assert 'step = "decentralized"' in calls[0] and "bucket = 3" in calls[0] and "n_data = 2" in calls[0]


@needs_cuda_handlers
def test_cuda_lowering_emits_the_async_step_target():
    from bagua_jax._src.collective_ops.async_step import async_step

    text = _cuda_text(
        lambda s, p, u: async_step(s, [p], [u], handle=9)[0],
        jnp.int32(0),
        jnp.ones(4, jnp.float32),
        jnp.ones(4, jnp.float32),
    )
    calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert len(calls) == 1 and "@bagua_async_step(" in calls[0], calls
    assert "weights = 9" in calls[0] and "!stablehlo.token" in calls[0]


def test_leader_broadcast_lowers_to_the_copy_on_cpu_and_xla_collective_broadcast_on_cuda():
    """How an engine step's result reaches the process's other devices
    (local_devices.run_once): the CPU target, or XLA's collective-broadcast."""
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    from bagua_jax._src.collective_ops.leader_broadcast import leader_broadcast

    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    fn = jax.jit(
        jax.shard_map(
            lambda x: leader_broadcast([x], ("data",))[0], mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False
        )
    )
    cpu = fn.trace(jnp.ones(3)).lower(lowering_platforms=("cpu",)).as_text()
    assert "@bagua_leader_broadcast(" in cpu and "collective_broadcast" not in cpu
    cuda = fn.trace(jnp.ones(3)).lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.collective_broadcast" in cuda and "bagua_leader_broadcast" not in cuda


def test_cuda_lowering_without_cuda_handlers_is_refused(monkeypatch):
    import bagua_jax
    from bagua_jax._src import ffi

    ffi.register_targets()
    monkeypatch.setattr(ffi, "_registered", {"cpu": set(NAMES)})  # as a build without CUDA
    g = _group("cuda")
    with pytest.raises(NotImplementedError, match="no cuda implementation in this build"):
        _cuda_text(lambda x: bagua_jax.allreduce(x, group=g), jnp.ones(3))


def test_cuda_lowering_on_a_cpu_group_is_refused():
    import bagua_jax

    g = _group("cpu")
    with pytest.raises(ValueError, match="is on cuda but the process group communicates cpu memory"):
        _cuda_text(lambda x: bagua_jax.allreduce(x, group=g), jnp.ones(3))


STAGED_SCRIPT = """
import jax, jax.numpy as jnp, bagua_core, bagua_jax
g = bagua_jax.init_process_group()
assert g.device_type == "cpu"
text = jax.jit(lambda x: bagua_jax.allreduce(x, group=g)).trace(jnp.ones(3)).lower(lowering_platforms=("cpu",)).as_text()
assert "bagua_allreduce" in text
try:
    jax.jit(lambda x: bagua_jax.allreduce(x, group=g)).trace(jnp.ones(3)).lower(lowering_platforms=("cuda",))
except ValueError as e:
    print("REFUSED", e)
bagua_core.destroy_process_group()
"""


@pytest.mark.timeout(150)
@needs_cuda_handlers
def test_cuda_arrays_on_a_gloo_group_need_a_visible_gpu_to_be_staged():
    """A real Gloo group lowers CUDA collectives through a staged
    communicator on this process's GPU; without one the refusal says why."""
    import subprocess
    import sys

    from tests.harness import mp

    port = mp.free_master_ports()
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=REPO,
    )
    out = subprocess.run(
        [sys.executable, "-c", STAGED_SCRIPT], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED bagua_jax.allreduce: the array is on cuda" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "cannot be staged" in out.stdout and "gpu" in out.stdout.lower(), out.stdout
