"""bagua_jax collectives through the engine's XLA FFI handlers, multi-process.

One session of real processes per world size (2 and 3) runs every case; this
file is also the worker script (run as __main__ by tests.harness.mp.launch). References
are numpy on the same deterministic inputs, JAX's own multi-process CPU
collectives (jax.distributed + Gloo), and a single-process JAX training run.
"""

from __future__ import annotations

import os
import sys

import numpy as np

# Case names, in the order the workers run them (every rank runs all of them:
# they are collectives). "not_initialised" must come before "init", and
# "dead_peer" last.
CASES = [
    "not_initialised",
    "init",
    "allreduce_sum_dtypes",
    "allreduce_ops",
    "allreduce_eager",
    "broadcast_roots",
    "allgather_dtypes",
    "vs_jax_collectives",
    "ordering_data_independent",
    "ordering_across_calls",
    "donated_alias",
    "grad_allreduce",
    "grad_broadcast_allgather",
    "vmap",
    "subgroup",
    "mlp_training",
    "errors",
    "jax_distributed_shutdown",
    "dead_peer",
]

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"]


# --------------------------------------------------------------------------- pytest side

import pytest  # noqa: E402

_sessions: dict = {}


def _session(world_size: int):
    if world_size not in _sessions:
        pytest.importorskip("jax")
        pytest.importorskip("optax")
        from tests.harness.mp import launch

        _sessions[world_size] = launch(os.path.abspath(__file__), world_size, timeout=120)
    return _sessions[world_size]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("case", CASES)
def test_case(world_size, case):
    run = _session(world_size)
    recs = run.cases().get(case, {})
    assert len(recs) == world_size, f"ranks reported: {sorted(recs)}\n{run.summary()}"
    bad = {r: rec["error"] for r, rec in recs.items() if not rec["ok"]}
    assert not bad, "\n".join(f"rank {r}: {e}" for r, e in bad.items())


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world_size", [2, 3])
def test_workers_exit_cleanly(world_size):
    run = _session(world_size)
    assert not run.timed_out, run.summary()
    assert all(w.returncode == 0 for w in run.workers), run.summary()


# --------------------------------------------------------------------------- worker side

RANK = int(os.environ.get("RANK", "0"))
SIZE = int(os.environ.get("WORLD_SIZE", "1"))


def inputs(rank: int, shape, dtype, salt: int = 0):
    """Rank-dependent small integers: sums, products and means stay exact."""
    rng = np.random.default_rng(1000 * salt + rank)
    return rng.integers(0, 5, size=shape).astype(_np_dtype(dtype))


def _np_dtype(dtype):
    import jax.numpy as jnp

    return np.dtype(getattr(jnp, dtype)) if isinstance(dtype, str) else np.dtype(dtype)


def all_inputs(shape, dtype, salt=0):
    return np.stack([inputs(r, shape, dtype, salt) for r in range(SIZE)])


def assert_equal(got, want, **tol):
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want).astype(np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    if tol:
        np.testing.assert_allclose(got, want, **tol)
    else:
        np.testing.assert_array_equal(got, want)


def case_not_initialised():
    import bagua_jax

    try:
        bagua_jax.allreduce(np.ones(3, np.float32))
    except bagua_jax.GroupNotInitializedError as e:
        assert "init" in str(e)
    else:
        raise AssertionError("allreduce without a process group did not raise")


def case_init():
    import bagua_jax

    group = bagua_jax.init()
    assert (group.rank, group.size) == (RANK, SIZE), (group.rank, group.size)


def case_allreduce_sum_dtypes():
    import jax

    import bagua_jax

    f = jax.jit(lambda x: bagua_jax.allreduce(x, op="sum"))
    for i, dt in enumerate(DTYPES):
        x = inputs(RANK, (5, 7), dt, salt=i)
        assert_equal(f(jax.numpy.asarray(x)), all_inputs((5, 7), dt, salt=i).sum(0))
    # A scalar and an empty array.
    assert_equal(f(np.float32(RANK + 1)), sum(range(1, SIZE + 1)))
    assert f(np.zeros((0, 3), np.float32)).shape == (0, 3)


def case_allreduce_ops():
    import jax

    import bagua_core
    import bagua_jax

    reducers = {"sum": np.sum, "min": np.min, "max": np.max, "prod": np.prod, "avg": np.mean}
    for dt in ["float32", "int32", "bfloat16"]:
        for name, red in reducers.items():
            if name == "avg" and dt == "int32":
                continue
            x = inputs(RANK, (33,), dt, salt=7) + 1
            want = red(all_inputs((33,), dt, salt=7) + 1, axis=0)
            got = jax.jit(lambda a, op=name: bagua_jax.allreduce(a, op=op))(x)
            tol = dict(rtol=1e-2) if dt == "bfloat16" else dict(rtol=1e-6) if name == "avg" else {}
            assert_equal(got, want, **tol)
    # Ops as bagua_core's enum, upper case names, and plain ints work too.
    x = inputs(RANK, (4,), "float32", salt=3)
    want = all_inputs((4,), "float32", salt=3).max(0)
    assert_equal(bagua_jax.allreduce(x, op=bagua_core.ReduceOp.MAX), want)
    assert_equal(bagua_jax.allreduce(x, op="MAX"), want)
    assert_equal(bagua_jax.allreduce(x, op=3), want)


def case_allreduce_eager():
    import jax.numpy as jnp

    import bagua_jax

    x = jnp.asarray(inputs(RANK, (3, 2), "float32", salt=11))
    assert_equal(bagua_jax.allreduce(x), all_inputs((3, 2), "float32", salt=11).sum(0))
    # The input is untouched although the call reduces in place internally.
    assert_equal(x, inputs(RANK, (3, 2), "float32", salt=11))
    assert_equal(bagua_jax.allreduce(np.int64(RANK)), sum(range(SIZE)))


def case_broadcast_roots():
    import jax

    import bagua_jax

    for root in range(SIZE):
        for i, dt in enumerate(["float32", "float64", "bfloat16", "int64", "uint8"]):
            x = inputs(RANK, (6,), dt, salt=20 + i)
            want = inputs(root, (6,), dt, salt=20 + i)
            assert_equal(jax.jit(lambda a, r=root: bagua_jax.broadcast(a, root=r))(x), want)
            assert_equal(bagua_jax.broadcast(x, root), want)


def case_allgather_dtypes():
    import jax

    import bagua_jax

    f = jax.jit(bagua_jax.allgather)
    for i, dt in enumerate(DTYPES):
        x = inputs(RANK, (3, 4), dt, salt=30 + i)
        out = f(x)
        assert out.shape == (SIZE, 3, 4) and out.dtype == x.dtype, (out.shape, out.dtype)
        assert_equal(out, all_inputs((3, 4), dt, salt=30 + i))
    assert_equal(bagua_jax.allgather(np.int32(RANK)), np.arange(SIZE))


def case_vs_jax_collectives():
    # JAX's own multi-process CPU collectives (Gloo through jax.distributed) as oracle.
    import jax
    from jax.experimental import multihost_utils

    import bagua_jax

    x = inputs(RANK, (17,), "float32", salt=40) * (RANK + 1) - 3
    stacked = multihost_utils.process_allgather(x)
    assert_equal(jax.jit(bagua_jax.allgather)(x), stacked)
    assert_equal(jax.jit(lambda a: bagua_jax.allreduce(a, "sum"))(x), stacked.sum(0))
    assert_equal(jax.jit(lambda a: bagua_jax.allreduce(a, "max"))(x), stacked.max(0))
    i = inputs(RANK, (9,), "int32", salt=41)
    assert_equal(bagua_jax.allreduce(i, "min"), multihost_utils.process_allgather(i).min(0))


def case_ordering_data_independent():
    # Two collectives on unrelated data in one program. Each rank makes a
    # different one of them expensive to compute, tempting a scheduler to run
    # the cheap one first on some ranks only; the values are rank-dependent, so
    # any swap would mix the two reductions and show in the results.
    import jax
    import jax.numpy as jnp

    import bagua_jax

    def slow(v):
        return jax.lax.fori_loop(0, 200, lambda _, w: jnp.sin(w) * 0 + w, v)

    @jax.jit
    def f(a, b):
        if RANK % 2 == 0:
            a = slow(a)
        else:
            b = slow(b)
        return bagua_jax.allreduce(a), bagua_jax.allgather(b), bagua_jax.allreduce(b * 10)

    for _ in range(3):
        a = np.full((1000,), RANK + 1, np.float32)
        b = np.full((1000,), 100 * (RANK + 1), np.float32)
        ra, gb, rb = f(a, b)
        assert_equal(ra, np.full(1000, sum(range(1, SIZE + 1))))
        assert_equal(gb, np.stack([np.full(1000, 100 * (r + 1)) for r in range(SIZE)]))
        assert_equal(rb, np.full(1000, 1000 * sum(range(1, SIZE + 1))))


def case_ordering_across_calls():
    # Eager and jitted collectives of different shapes, dispatched back to back
    # without waiting: the runtime token keeps them in call order.
    import jax

    import bagua_jax

    g = jax.jit(lambda x: bagua_jax.allgather(x * 2))
    outs = []
    for k in range(5):
        outs.append(bagua_jax.allreduce(np.full((k + 1,), RANK, np.int32)))
        outs.append(g(np.full((2, k + 2), RANK, np.float32)))
        outs.append(bagua_jax.broadcast(np.full((3,), RANK + k, np.int64), root=k % SIZE))
    for k in range(5):
        assert_equal(outs[3 * k], np.full(k + 1, sum(range(SIZE))))
        assert_equal(outs[3 * k + 1], np.stack([np.full((2, k + 2), 2 * r) for r in range(SIZE)]))
        assert_equal(outs[3 * k + 2], np.full(3, k % SIZE + k))


def case_donated_alias():
    import jax
    import jax.numpy as jnp

    import bagua_jax

    f = jax.jit(lambda x: bagua_jax.allreduce(x, "avg"), donate_argnums=0)
    for n in (1, 1000, 1 << 18):
        x = jnp.asarray(inputs(RANK, (n,), "float32", salt=50))
        y = f(x)
        assert x.is_deleted(), "donated input was not consumed"
        assert_equal(y, all_inputs((n,), "float32", salt=50).mean(0), rtol=1e-6)
    # Without donation the aliased call must leave its input untouched.
    x = jnp.asarray(inputs(RANK, (257,), "float32", salt=51))
    h = jax.jit(lambda v: bagua_jax.broadcast(v, root=SIZE - 1) + bagua_jax.allreduce(v))
    want = inputs(SIZE - 1, (257,), "float32", salt=51) + all_inputs((257,), "float32", salt=51).sum(0)
    assert_equal(h(x), want)
    assert_equal(x, inputs(RANK, (257,), "float32", salt=51))


def case_grad_allreduce():
    # Objective = sum over ranks of each rank's loss: d/dx_r = allreduce of cotangents.
    import jax
    import jax.numpy as jnp

    import bagua_jax

    w = [inputs(r, (6,), "float32", salt=60) + 1 for r in range(SIZE)]
    x = inputs(RANK, (6,), "float32", salt=61)
    loss = lambda v: jnp.sum(bagua_jax.allreduce(v) * w[RANK])  # noqa: E731
    assert_equal(jax.jit(jax.grad(loss))(x), np.sum(w, axis=0))
    loss_avg = lambda v: jnp.sum(bagua_jax.allreduce(v, "avg") * w[RANK])  # noqa: E731
    assert_equal(jax.grad(loss_avg)(x), np.mean(w, axis=0), rtol=1e-6)
    # JVP: the tangent is reduced like the primal.
    t = inputs(RANK, (6,), "float32", salt=62)
    _, jvp = jax.jvp(lambda v: bagua_jax.allreduce(v), (x,), (t,))
    assert_equal(jvp, all_inputs((6,), "float32", salt=62).sum(0))


def case_grad_broadcast_allgather():
    import jax
    import jax.numpy as jnp

    import bagua_jax

    w = [inputs(r, (4,), "float32", salt=70) + 1 for r in range(SIZE)]
    x = inputs(RANK, (4,), "float32", salt=71)
    root = SIZE - 1
    gb = jax.jit(jax.grad(lambda v: jnp.sum(bagua_jax.broadcast(v, root=root) * w[RANK])))(x)
    assert_equal(gb, np.sum(w, axis=0) if RANK == root else np.zeros(4))
    # allgather: rank r's input appears as row r on every rank.
    wg = [inputs(r, (SIZE, 4), "float32", salt=72) for r in range(SIZE)]
    gg = jax.jit(jax.grad(lambda v: jnp.sum(bagua_jax.allgather(v) * wg[RANK])))(x)
    assert_equal(gg, np.sum([wg[r][RANK] for r in range(SIZE)], axis=0))


def case_vmap():
    import jax

    import bagua_jax

    x = inputs(RANK, (3, 5), "float32", salt=80)
    assert_equal(jax.jit(jax.vmap(bagua_jax.allreduce))(x), all_inputs((3, 5), "float32", salt=80).sum(0))
    out = jax.vmap(bagua_jax.allgather, in_axes=1, out_axes=0)(x)
    assert out.shape == (5, SIZE, 3), out.shape
    assert_equal(out, all_inputs((3, 5), "float32", salt=80).transpose(2, 0, 1))


def case_subgroup():
    # A group of ranks 1.. (rank 0 is not a member); its collectives and the
    # world's share one order.
    import jax

    import bagua_core
    import bagua_jax

    sub = bagua_core.new_group(list(range(1, SIZE)))
    x = inputs(RANK, (5,), "float32", salt=90)
    members = all_inputs((5,), "float32", salt=90)[1:]
    if RANK == 0:
        try:
            bagua_jax.allreduce(x, group=sub)
        except ValueError as e:
            assert "not a member" in str(e), str(e)
        else:
            raise AssertionError("a non-member's collective did not raise")
        assert_equal(jax.jit(bagua_jax.allreduce)(x), all_inputs((5,), "float32", salt=90).sum(0))
        return

    @jax.jit
    def f(v):
        return (
            bagua_jax.allreduce(v, group=sub),
            bagua_jax.allreduce(v),
            bagua_jax.allgather(v, group=sub),
            bagua_jax.broadcast(v, root=sub.size - 1, group=sub),
        )

    s, w, gathered, b = f(x)
    assert_equal(s, members.sum(0))
    assert_equal(w, all_inputs((5,), "float32", salt=90).sum(0))
    assert_equal(gathered, members)
    assert_equal(b, members[-1])


def case_mlp_training():
    import jax
    import jax.numpy as jnp
    import optax
    from jax.experimental import multihost_utils

    import bagua_jax

    n, d, h, steps = 24, 8, 16, 6
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(n, d)).astype(np.float32)
    ys = np.sin(xs.sum(1, keepdims=True)).astype(np.float32)
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params0 = {
        "w1": jax.random.normal(k1, (d, h), jnp.float32) * 0.3,
        "b1": jnp.zeros(h, jnp.float32),
        "w2": jax.random.normal(k2, (h, 1), jnp.float32) * 0.3,
        "b2": jnp.zeros(1, jnp.float32),
    }

    def loss_fn(p, x, y):
        z = jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return jnp.mean((z - y) ** 2)

    tx = optax.sgd(0.1)

    @jax.jit
    def step(p, s, x, y):
        grads = jax.grad(loss_fn)(p, x, y)
        grads = jax.tree.map(lambda g: bagua_jax.allreduce(g, op="avg"), grads)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    @jax.jit
    def reference_step(p, s):  # one process, all the data
        updates, s = tx.update(jax.grad(loss_fn)(p, xs, ys), s, p)
        return optax.apply_updates(p, updates), s

    shard = slice(RANK * n // SIZE, (RANK + 1) * n // SIZE)
    p, s = params0, tx.init(params0)
    rp, rs = params0, tx.init(params0)
    for _ in range(steps):
        p, s = step(p, s, xs[shard], ys[shard])
        rp, rs = reference_step(rp, rs)
    flat = np.concatenate([np.asarray(v).ravel() for v in jax.tree.leaves(p)])
    everyone = multihost_utils.process_allgather(flat)
    for r in range(SIZE):
        assert np.array_equal(everyone[r].view(np.uint32), flat.view(np.uint32)), f"rank {r} differs"
    ref = np.concatenate([np.asarray(v).ravel() for v in jax.tree.leaves(rp)])
    np.testing.assert_allclose(flat, ref, rtol=1e-5, atol=1e-6)
    assert not np.allclose(flat, np.concatenate([np.asarray(v).ravel() for v in jax.tree.leaves(params0)]))


def case_errors():
    import jax
    import jax.numpy as jnp

    import bagua_jax

    x = jnp.ones(3, jnp.float32)
    expect = [
        (TypeError, "unsupported dtype", lambda: bagua_jax.allreduce(jnp.ones(3, jnp.int8))),
        (TypeError, "unsupported dtype", lambda: jax.jit(bagua_jax.allgather)(jnp.ones(3, jnp.complex64))),
        (ValueError, "unknown reduce op", lambda: bagua_jax.allreduce(x, op="median")),
        (ValueError, "not a rank", lambda: bagua_jax.broadcast(x, root=SIZE)),
        (TypeError, "bagua_core process group", lambda: bagua_jax.allreduce(x, group="world")),
        (NotImplementedError, "op='sum'", lambda: jax.grad(lambda v: bagua_jax.allreduce(v, "max").sum())(x)),
        # An array on a CUDA device while the group is CPU: checked when lowering.
        (
            ValueError,
            "array is on cuda",
            lambda: jax.jit(bagua_jax.allreduce).trace(x).lower(lowering_platforms=("cuda",)),
        ),
    ]
    for exc, text, fn in expect:
        try:
            fn()
        except exc as e:
            assert text in str(e), f"{exc.__name__} without {text!r}: {e}"
        else:
            raise AssertionError(f"expected {exc.__name__} ({text})")
    # The ranks are still in step after the failed calls.
    assert_equal(bagua_jax.allreduce(x), np.full(3, SIZE))


def case_jax_distributed_shutdown():
    # Done before killing a peer: JAX's coordination service would otherwise
    # wait for the dead process at exit.
    import jax

    jax.distributed.shutdown()


def case_dead_peer():
    import jax

    import bagua_jax
    from tests.harness.worker import exit_as_dead_peer, expect_failure_within

    exit_as_dead_peer("dead_peer", RANK, SIZE)
    f = jax.jit(lambda v: bagua_jax.allreduce(v))
    expect_failure_within(45, lambda: np.asarray(f(np.ones(1 << 16, np.float32))), "bagua allreduce")


def main() -> int:
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's coordinator takes MASTER_PORT (free: there is no torchrun store);
    # Bagua's own store listens on MASTER_PORT + 1.
    jax.distributed.initialize(f"127.0.0.1:{os.environ['MASTER_PORT']}", SIZE, RANK, initialization_timeout=60)
    from tests.harness.worker import run_cases

    failures = run_cases([(name, globals()["case_" + name]) for name in CASES])
    sys.stdout.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
