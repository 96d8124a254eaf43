"""GPU worker: bagua_jax on a CUDA device at world size 1, against the same
calls on CPU. Started by tests/jax/test_jax_cuda.py through tests.harness.mp.launch.

  jax_cuda_worker.py staged   a Gloo group, which bagua_jax stages through
                              pinned host memory for CUDA arrays
  jax_cuda_worker.py nccl     an NCCL process group (new_group(backend="nccl"))

Every case runs the CPU reference on the default (Gloo, CPU) group and the same
inputs on the GPU through the CUDA FFI handlers, and compares: collectives and
the transform steps bitwise (world size 1: the engine's CUDA kernels must equal
its CPU loops), QAdam (whose optimizer arithmetic is XLA's on each platform)
and the eager async average to a tight tolerance.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave NCCL and Bagua their memory

import jax
import jax.numpy as jnp
import numpy as np
import optax

import bagua_core
import bagua_jax
from bagua_core import _C
from tests.gpu.jax_cuda_cases import ALGORITHMS, case_names
from tests.harness.worker import run_cases

KIND = sys.argv[1]
CPU = jax.devices("cpu")[0]
GPU = jax.devices("cuda")[0]
GPU_INDEX = int(getattr(GPU, "local_hardware_id", None) or 0)
SHAPES = [(4, 3), (3,), (5, 7)]
NEVER_MS = 10**7  # an async sync interval longer than the run

groups: dict = {}


def on_gpu(x):
    return jax.device_put(x, GPU)


def on_cpu(x):
    return jax.device_put(x, CPU)


def platforms(tree):
    return {d.platform for leaf in jax.tree_util.tree_leaves(tree) for d in leaf.devices()}


def assert_same(got, want, exact=True, what=""):
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves), what
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype, g.shape, w.shape)
        if exact:
            np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64), err_msg=f"{what} leaf {i}")
        else:
            np.testing.assert_allclose(
                g.astype(np.float64), w.astype(np.float64), rtol=1e-5, atol=1e-6, err_msg=f"{what} leaf {i}"
            )


def make_cuda_group(world):
    """The group the GPU side uses: an NCCL group, or a clone of the (Gloo)
    world group, whose communicator bagua_jax stages for CUDA arrays."""
    if KIND == "nccl":
        g = bagua_core.new_group(backend="nccl")
        assert g.device_type == "cuda" and g.device_index == GPU_INDEX, (g.device_type, g.device_index)
        return g
    g = world.clone()
    assert g.device_type == "cpu", g.device_type
    return g


def side(group):
    return "cuda" if group is groups["cuda"] else "cpu"


def rng_inputs(step, shapes=SHAPES, scale=1.0):
    r = np.random.default_rng(1234 + step)
    return [(scale * r.standard_normal(s)).astype(np.float32) for s in shapes]


# --------------------------------------------------------------------------- cases


def case_init():
    groups["cpu"] = bagua_jax.init_process_group()
    groups["cuda"] = make_cuda_group(groups["cpu"])
    assert _C.has_cuda_ffi
    assert "bagua_allreduce" in bagua_jax._src.ffi.register_targets()["cuda"]


def collectives(dtype):
    def case():
        x = (np.arange(24) % 7).reshape(2, 3, 4).astype(jnp.dtype(dtype))
        cpu, gpu = groups["cpu"], groups["cuda"]
        ops = ["sum", "max", "min", "prod"] + (["avg"] if jnp.issubdtype(x.dtype, jnp.floating) else [])
        for op in ops:
            want = bagua_jax.allreduce(on_cpu(x), op, group=cpu)
            eager = bagua_jax.allreduce(on_gpu(x), op, group=gpu)
            jitted = jax.jit(lambda a, op=op: bagua_jax.allreduce(a, op, group=gpu))(on_gpu(x))
            assert platforms(eager) == {"gpu"} and platforms(jitted) == {"gpu"}
            assert_same(eager, want, what=f"allreduce {op} eager")
            assert_same(jitted, want, what=f"allreduce {op} jit")
        assert_same(
            jax.jit(lambda a: bagua_jax.broadcast(a, 0, group=gpu))(on_gpu(x)),
            bagua_jax.broadcast(on_cpu(x), 0, group=cpu),
            what="broadcast",
        )
        assert_same(
            jax.jit(lambda a: bagua_jax.allgather(a, group=gpu))(on_gpu(x)),
            bagua_jax.allgather(on_cpu(x), group=cpu),
            what="allgather",
        )

    return case


def case_jit_donated_and_ordered():
    gpu = groups["cuda"]

    def f(a, b):
        a = bagua_jax.allreduce(a * 2, "sum", group=gpu)
        b = bagua_jax.allreduce(b + 1, "max", group=gpu)  # data-independent: ordered by the token
        return bagua_jax.broadcast(a + b, 0, group=gpu), b

    x = np.linspace(-1, 1, 1 << 16, dtype=np.float32)
    want = jax.jit(lambda a, b: (a * 2 + (b + 1), b + 1))(on_cpu(x), on_cpu(x))
    f_jit = jax.jit(f, donate_argnums=(0, 1))
    for _ in range(3):  # warm and repeated: scratch reused, nothing stale
        got = f_jit(on_gpu(x), on_gpu(x))
        assert_same(got, want, what="donated")


def case_wrong_platform_refused():
    """CPU arrays on an NCCL group are refused; CUDA arrays on a Gloo group
    are staged (the staged session's every case), here on the world group."""
    x = np.arange(3, dtype=np.float32)
    if KIND == "nccl":
        try:
            bagua_jax.allreduce(on_cpu(x), group=groups["cuda"])
        except ValueError as e:
            assert "is on cpu" in str(e), e
        else:
            raise AssertionError("allreduce accepted a CPU array on an NCCL group")
    else:
        assert_same(bagua_jax.allreduce(on_gpu(x), group=groups["cpu"]), x, what="staged on the world group")


def make_algorithm(name):
    """(algorithm, phase): "grad" algorithms go before the optimizer (here: alone),
    "weight" ones after it (need params), "qadam" is its own optimizer."""
    a = bagua_jax
    return {
        "gradient_allreduce": (lambda: a.GradientAllReduceAlgorithm(hierarchical=False), "grad"),
        "bytegrad": (lambda: a.ByteGradAlgorithm(hierarchical=False), "grad"),
        "decentralized_all": (
            lambda: a.DecentralizedAlgorithm(hierarchical=False, peer_selection_mode="all", communication_interval=2),
            "weight",
        ),
        "decentralized_shift_one": (
            lambda: a.DecentralizedAlgorithm(hierarchical=False, peer_selection_mode="shift_one"),
            "weight",
        ),
        "low_precision_decentralized": (
            lambda: a.LowPrecisionDecentralizedAlgorithm(hierarchical=False, communication_interval=2),
            "weight",
        ),
        "qadam": (lambda: a.QAdamAlgorithm(a.qadam(0.01, warmup_steps=2), hierarchical=False), "qadam"),
        "async_model_average": (
            lambda: a.AsyncModelAverageAlgorithm(sync_interval_ms=NEVER_MS, warmup_steps=2),
            "async",
        ),
    }[name]


def run_transform(name, group, put, steps=5):
    """The updates and states of ``steps`` updates of transform(name) on
    ``group`` with arrays put by ``put``; or the exception making it failed."""
    make, phase = make_algorithm(name)
    algo = make()
    try:
        tx = bagua_jax.transform(algo, process_group=group, name=f"{name}-{side(group)}")
    except ValueError as e:  # the algorithm cannot run on one rank: the same on both platforms
        return ("refused", type(e).__name__)
    params = [put(x) for x in rng_inputs(0)]
    state = tx.init(params)
    update = jax.jit(tx.update)
    out = []
    for t in range(steps):
        g = [put(x) for x in rng_inputs(100 + t, scale=0.1)]
        if phase == "grad":
            u, state = update(g, state)
        else:
            u, state = update(g, state, params)
        params = optax.apply_updates(params, u) if phase in ("qadam", "async") else [put(x) for x in rng_inputs(t + 1)]
        out.append(
            (
                [np.asarray(x) for x in jax.tree_util.tree_leaves(u)],
                [np.asarray(x) for x in jax.tree_util.tree_leaves(state)],
            )
        )
        if put is on_gpu:
            assert platforms(u) == {"gpu"}, platforms(u)
    if phase == "async":
        out.append(([np.asarray(x) for x in jax.tree_util.tree_leaves(algo.abort(params))], []))
        algo._binding.close()
    return out


def transform_case(name):
    def case():
        want = run_transform(name, groups["cpu"], on_cpu)
        got = run_transform(name, groups["cuda"], on_gpu)
        if isinstance(want, tuple) or isinstance(got, tuple):
            assert got == want, (got, want)
            return
        exact = make_algorithm(name)[1] != "qadam"  # async: the same host step on both
        for t, ((gu, gs), (wu, ws)) in enumerate(zip(got, want)):
            assert_same(gu, wu, exact, f"{name} step {t} updates")
            assert_same(gs, ws, exact, f"{name} step {t} state")

    return case


def case_transform_on_gpu_mesh():
    """The multi-device layout on the GPUs (bagua_jax._src.local_devices): a
    Mesh over this process's GPUs, transform(mesh=) on replicated global
    arrays gives bitwise what the one-device path gives, on every GPU."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    gpus = jax.local_devices(backend="gpu")
    mesh = Mesh(np.array(gpus), ("data",))
    replicated = NamedSharding(mesh, P())
    for name in ("gradient_allreduce", "bytegrad"):
        make, _ = make_algorithm(name)
        on_mesh = bagua_jax.transform(make(), process_group=groups["cuda"], mesh=mesh, name=f"{name}-mesh")
        alone = bagua_jax.transform(make(), process_group=groups["cuda"], name=f"{name}-alone")
        grads = rng_inputs(7, scale=0.1)
        s_mesh = on_mesh.init([jax.device_put(x, replicated) for x in grads])
        s_alone = alone.init([on_gpu(x) for x in grads])
        got, _ = jax.jit(on_mesh.update)([jax.device_put(x, replicated) for x in grads], s_mesh)
        want, _ = jax.jit(alone.update)([on_gpu(x) for x in grads], s_alone)
        for g, w in zip(got, want):
            for shard in g.addressable_shards:
                assert_same(np.asarray(shard.data), np.asarray(w), True, f"{name} on {shard.device}")


def case_step_number_restored_state():
    """The CUDA handler counts step numbers on the host (csrc/ffi/cuda_handlers.cc):
    after a state restored in the same process, the first call still uses the
    host count, and the next ones the restored number read back from the device.
    LowPrecisionDecentralized with communication_interval=2 makes the number
    visible (it communicates on even steps only)."""

    def run(group, put, numbers):
        tx = bagua_jax.transform(
            bagua_jax.LowPrecisionDecentralizedAlgorithm(hierarchical=False, communication_interval=2),
            process_group=group,
            name=f"restore-{side(group)}",
        )
        update = jax.jit(tx.update)
        params = [put(x) for x in rng_inputs(0)]
        state = saved = tx.init(params)
        out = []
        for t, number in enumerate(numbers):
            if t == 4:
                state = saved  # "restore the checkpoint" taken after the first update
            if number is not None:  # the CPU reference: the number the CUDA handler is documented to use
                state = state._replace(step=put(jnp.asarray(number, jnp.int32)))
            g = [put(x) for x in rng_inputs(200 + t, scale=0.1)]
            u, state = update(g, state, params)
            jax.block_until_ready((u, state))  # the asynchronous check completes before the next call
            if t == 0:
                saved = state
            out.append([np.asarray(x) for x in jax.tree_util.tree_leaves((u, state.step_state))])
        return out

    # device numbers 0 1 2 3 | restored: 1 2 3; the CUDA handler's: 0 1 2 3 | 4 (the host
    # count; its check finds the mismatch) then 2 3 (read back from the device)
    got = run(groups["cuda"], on_gpu, [None] * 7)
    want = run(groups["cpu"], on_cpu, [0, 1, 2, 3, 4, 2, 3])
    for t, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, what=f"call {t}")


def case_step_overhead():
    """Times a jitted GradientAllReduce update of 16 MiB on the GPU: the first
    call (the host count seeds from the device: one stream synchronize) and the
    steady state. Printed for the device run's summary; asserts nothing about speed."""
    tx = bagua_jax.transform(
        bagua_jax.GradientAllReduceAlgorithm(hierarchical=False), process_group=groups["cuda"], name="overhead"
    )
    g = [on_gpu(np.ones(1 << 22, np.float32))]
    state = tx.init(g)
    update = jax.jit(tx.update)
    jax.block_until_ready(update(g, state))  # compiles, seeds
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        u, state = update(g, state)
        jax.block_until_ready(u)
        times.append(time.perf_counter() - t0)
    plain = jax.jit(lambda a: a * 1.0)
    jax.block_until_ready(plain(g[0]))
    t0 = time.perf_counter()
    for _ in range(30):
        jax.block_until_ready(plain(g[0]))
    base = (time.perf_counter() - t0) / 30
    print(
        f"BAGUA-GPU-TIMING jax transform GradientAllReduce 16 MiB ({KIND}): median "
        f"{1e6 * float(np.median(times)):.0f} us per update, a plain jitted copy {1e6 * base:.0f} us",
        flush=True,
    )


def main():
    table = {
        "init": case_init,
        "jit_donated_and_ordered": case_jit_donated_and_ordered,
        "wrong_platform_refused": case_wrong_platform_refused,
        "step_number_restored_state": case_step_number_restored_state,
        "step_overhead": case_step_overhead,
        "transform_on_gpu_mesh": case_transform_on_gpu_mesh,
    }
    for d in ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"]:
        table[f"collectives_{d}"] = collectives(d)
    for a in ALGORITHMS:
        table[f"transform_{a}"] = transform_case(a)
    failures = run_cases([(c, table[c]) for c in case_names()])
    jax.effects_barrier()
    bagua_core.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
