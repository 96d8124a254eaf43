"""bagua_jax with several devices per process (XLA's host platform split into
devices with --xla_force_host_platform_device_count), across real processes:

* GradientAllReduce in float64 on data whose sums are exact: training on
  global arrays over a Mesh (``transform(mesh=)``), inside the user's
  shard_map (``transform(axis_name=)``), and one device per process all give
  bitwise the weights of a numpy reference on the whole global batch (2
  processes x 4 devices and 8 x 1 split the same global batch of 8 shards;
  with 3 x 2, whose means divide by 3, within 1e-13);
* every algorithm (AsyncModelAverage's warm-up and training step included)
  on a mesh gives bitwise what the same algorithm gives on
  one device of the same processes (the engine's step on the process's
  value), and every device holds the same result;
* broadcast_params on global arrays over the mesh keeps their shardings;
* the leader broadcast that spreads an engine step's result over the
  process's devices, over two mesh axes and inside a scan;
* bad input (mesh= and axis_name= together, a mesh or shard_map axis that is
  not this process's data axis, a process-local array where a global one is
  needed, multi-device arrays without mesh=, a collective inside shard_map):
  a clear error at init or trace time, never a hang;
* a dead peer: every survivor's step on the mesh fails with PeerError on
  every device within seconds.

One multi-process session per layout runs every case (this file is also the
worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import os

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests
from tests.harness.worker import exit_as_dead_peer, expect_error, expect_failure_within

# session -> (processes, devices per process; a tuple: per rank)
LAYOUTS = {"p2d4": (2, 4), "p3d2": (3, 2), "p8d1": (8, 1), "p2uneven": (2, (2, 1))}
ROWS_PER_SHARD = 2
STEPS = 3
LR = 2.0**-6


def case_names(session: str):
    _, devices = LAYOUTS[session]
    if devices == 1:
        return ["one_device_per_process_matches_numpy"]
    if isinstance(devices, tuple):
        return ["uneven_device_counts_refused_at_init"]
    return [
        "mesh_matches_numpy",
        "shard_map_matches_numpy",
        "every_algorithm_on_mesh_matches_one_device",
        "broadcast_params_on_mesh",
        "leader_broadcast_in_loops_and_over_two_axes",
        "bad_input",
        "dead_peer_on_mesh",  # last: one process exits
    ]


def global_batch(shards: int):
    """Small integers: every sum and mean of the linear model's gradients below
    is exact in float64, so any summation order gives the same bits."""
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 4, (shards * ROWS_PER_SHARD, 4)).astype(np.float64)
    y = rng.integers(-3, 4, (shards * ROWS_PER_SHARD, 2)).astype(np.float64)
    return x, y


def numpy_reference(shards: int):
    """Full-batch gradient descent on mean((x @ w - y)^2) in numpy."""
    x, y = global_batch(shards)
    w = np.zeros((4, 2))
    for _ in range(STEPS):
        w = w - LR * (2.0 / (x.shape[0] * 2)) * x.T @ (x @ w - y)
    return w


# ---------------------------------------------------------------- worker side


class Worker(JaxWorker):
    def __init__(self):
        by_rank = os.environ.get("BAGUA_TEST_DEVICES_BY_RANK")
        if by_rank:  # before jax starts
            count = by_rank.split(",")[int(os.environ["RANK"])]
            os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={count}"
        super().__init__()
        self.jax.config.update("jax_enable_x64", True)
        from jax.sharding import Mesh

        self.mesh = Mesh(np.array(self.jax.local_devices()), ("data",))
        self.devices = len(self.jax.local_devices())
        self.shards = self.world * self.devices

    def my_rows(self):
        """This process's part of the global batch: its devices' shards, in order."""
        x, y = global_batch(self.shards)
        rows = slice(self.rank * self.devices * ROWS_PER_SHARD, (self.rank + 1) * self.devices * ROWS_PER_SHARD)
        return x[rows], y[rows]

    def loss(self, w, x, y):
        return ((x @ w - y) ** 2).mean()

    def sharded(self, value, spec):
        from jax.sharding import NamedSharding

        return self.jax.device_put(value, NamedSharding(self.mesh, spec))

    def assert_replicated_equal(self, array, want):
        """Every device of the process holds ``want``, bitwise."""
        for shard in array.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), want)

    def assert_matches_reference(self, array):
        """Every device holds the same weights, those of the numpy reference:
        bitwise when every mean divides by a power of two (exact), else closely."""
        first = np.asarray(array.addressable_shards[0].data)
        self.assert_replicated_equal(array, first)
        want = numpy_reference(self.shards)
        if self.shards & (self.shards - 1) == 0 and self.world & (self.world - 1) == 0:
            np.testing.assert_array_equal(first, want)
        else:
            np.testing.assert_allclose(first, want, rtol=1e-13, atol=0)

    def train(self, tx, w, x, y, loss=None, compile=None):
        """STEPS steps of gradient descent through ``tx`` from ``w``; the
        step is jitted, or ``compile(step)`` (e.g. a shard_map under jit)."""
        jax, optax = self.jax, self.optax
        loss = loss or self.loss

        def step(w, state, x, y):
            u, state = tx.update(jax.grad(loss)(w, x, y), state, w)
            return optax.apply_updates(w, u), state

        step = (compile or jax.jit)(step)
        state = tx.init(w)
        for _ in range(STEPS):
            w, state = step(w, state, x, y)
        return w, state

    # -- cases --
    def one_device_per_process_matches_numpy(self):
        import bagua_jax

        bagua_jax.init_process_group()
        tx = self.optax.chain(bagua_jax.transform("gradient_allreduce"), self.optax.sgd(LR))
        w, _ = self.train(tx, self.jnp.zeros((4, 2)), *self.my_rows())
        self.assert_matches_reference(w)

    def mesh_matches_numpy(self):
        from jax.sharding import PartitionSpec as P

        import bagua_jax

        jax = self.jax
        bagua_jax.init_process_group()
        tx = self.optax.chain(bagua_jax.transform("gradient_allreduce", mesh=self.mesh), self.optax.sgd(LR))
        x, y = (self.sharded(v, P("data")) for v in self.my_rows())
        # XLA averages the gradient over this process's devices; Bagua, over the processes
        w, state = self.train(tx, self.sharded(np.zeros((4, 2)), P()), x, y)
        self.assert_matches_reference(w)
        # eagerly too: the same update on concrete global arrays
        g = jax.grad(self.loss)(w, x, y)
        eager, _ = tx.update(g, state, w)
        jitted, _ = jax.jit(tx.update)(g, state, w)
        self.assert_replicated_equal(eager, np.asarray(jitted))

    def shard_map_matches_numpy(self):
        from jax import lax
        from jax.sharding import PartitionSpec as P

        import bagua_jax

        jax = self.jax
        bagua_jax.init_process_group()
        x, y = (self.sharded(v, P("data")) for v in self.my_rows())
        # check_vma=False: each device's gradient of its own shard, averaged by the transform;
        # check_vma=True: jax.grad of a replicated w already reduces over the axis (here of the
        # devices' mean loss), and the transform's average leaves that as it is
        for check_vma, loss in ((False, self.loss), (True, lambda w, x, y: lax.pmean(self.loss(w, x, y), "data"))):
            tx = self.optax.chain(bagua_jax.transform("gradient_allreduce", axis_name="data"), self.optax.sgd(LR))

            def compile(step, check_vma=check_vma):
                specs = dict(in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P()))
                return jax.jit(jax.shard_map(step, mesh=self.mesh, check_vma=check_vma, **specs))

            w, _ = self.train(tx, self.sharded(np.zeros((4, 2)), P()), x, y, loss, compile)
            self.assert_matches_reference(w)

    def every_algorithm_on_mesh_matches_one_device(self):
        from jax.sharding import PartitionSpec as P

        import bagua_jax

        jax, jnp, optax = self.jax, self.jnp, self.optax
        bagua_jax.init_process_group()
        algorithms = {
            "gradient_allreduce": lambda: bagua_jax.GradientAllReduceAlgorithm(),
            "bytegrad": lambda: bagua_jax.ByteGradAlgorithm(),
            "bytegrad_ef": lambda: bagua_jax.ByteGradAlgorithm(error_feedback=True),
            "halfgrad": lambda: bagua_jax.HalfGradAlgorithm(),
            "decentralized": lambda: bagua_jax.DecentralizedAlgorithm(),
            "low_precision_decentralized": lambda: bagua_jax.LowPrecisionDecentralizedAlgorithm(),
            "low_rank": lambda: bagua_jax.LowRankAlgorithm(rank=1, start_iter=1, min_compression_rate=1.0),
            "local_steps": lambda: bagua_jax.LocalStepsAlgorithm(sync_interval=2),
            "qadam": lambda: bagua_jax.QAdamAlgorithm(bagua_jax.qadam(0.01, warmup_steps=2)),
            # no round in so short a run: the warm-up and the engine's step on the host copy
            "async": lambda: bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=10**7, warmup_steps=2),
        }
        shapes = [(6, 5), (7,), (3, 4)]

        made = []

        def chain(make, **where):
            algo = make()
            made.append(algo)
            if isinstance(algo, bagua_jax.QAdamAlgorithm):
                return bagua_jax.transform(algo, **where)
            t = bagua_jax.transform(algo, **where)
            weights = algo.to_core().plan().communicates == "weights"
            return optax.chain(optax.sgd(0.1), t) if weights else optax.chain(t, optax.sgd(0.1))

        for name, make in algorithms.items():
            on_mesh, on_one = chain(make, mesh=self.mesh), chain(make)
            p_mesh = [self.sharded(np.zeros(s, np.float32), P()) for s in shapes]
            p_one = [jnp.zeros(s, jnp.float32) for s in shapes]
            s_mesh, s_one = on_mesh.init(p_mesh), on_one.init(p_one)
            update_mesh, update_one = jax.jit(on_mesh.update), jax.jit(on_one.update)
            for t in range(5):
                grads = self.rank_grads(shapes, t)
                u, s_mesh = update_mesh([self.sharded(g, P()) for g in grads], s_mesh, p_mesh)
                p_mesh = optax.apply_updates(p_mesh, u)
                u, s_one = update_one([jnp.asarray(g) for g in grads], s_one, p_one)
                p_one = optax.apply_updates(p_one, u)
            for a, b in zip(p_mesh, p_one):
                assert np.any(np.asarray(b) != 0), name
                try:
                    self.assert_replicated_equal(a, np.asarray(b))
                except AssertionError as e:
                    raise AssertionError(f"{name}: {e}") from None
        for algo in made:
            if isinstance(algo, bagua_jax.AsyncModelAverageAlgorithm):
                algo.abort()
                algo._binding.close()

    def broadcast_params_on_mesh(self):
        """broadcast_params on global arrays over the process's mesh, replicated
        and sharded: every process gets rank 0's values, each leaf keeps its
        sharding."""
        from jax.sharding import PartitionSpec as P

        import bagua_jax

        bagua_jax.init_process_group()
        mine = np.arange(8.0 * self.devices).reshape(self.devices * 2, 4) + 1000 * self.rank
        params = {"replicated": self.sharded(mine[:2], P()), "sharded": self.sharded(mine, P("data"))}
        got = bagua_jax.broadcast_params(params, root=0)
        root = np.arange(8.0 * self.devices).reshape(self.devices * 2, 4)
        for name, want in (("replicated", root[:2]), ("sharded", root)):
            assert got[name].sharding == params[name].sharding, name
            np.testing.assert_array_equal(np.asarray(got[name]), want)
        self.assert_replicated_equal(got["replicated"], root[:2])

    def uneven_device_counts_refused_at_init(self):
        """Processes that drive different numbers of devices would weigh their
        batches unequally: init refuses on every rank, with mesh= and
        axis_name= alike."""
        import bagua_jax

        bagua_jax.init_process_group()
        w = self.jnp.zeros((4, 2))
        for where in ({"mesh": self.mesh}, {"axis_name": "data"}):
            tx = bagua_jax.transform("gradient_allreduce", **where)
            expect_error(ValueError, lambda: tx.init(w), "devices per process", "differs across ranks")

    def leader_broadcast_in_loops_and_over_two_axes(self):
        """How an engine step's result reaches the process's other devices:
        every device gets the leader's values (several dtypes, odd sizes), over
        two mesh axes, at a call site that runs several times per run (a scan)."""
        from jax import lax
        from jax.sharding import Mesh, PartitionSpec as P

        from bagua_jax._src.collective_ops.leader_broadcast import leader_broadcast

        jax = self.jax
        grid = Mesh(np.array(jax.local_devices()).reshape(2, -1), ("a", "b"))

        def body(x, n):
            position = lax.axis_index(("a", "b"))

            def one(carry, _):  # the leader doubles, the others add their position
                out = [c * 2 + position.astype(c.dtype) for c in carry]
                return tuple(leader_broadcast(out, ("a", "b"))), None

            return lax.scan(one, (x, n), None, length=3)[0]

        run = jax.jit(jax.shard_map(body, mesh=grid, in_specs=(P(), P()), out_specs=(P(), P()), check_vma=False))
        x = np.arange(1001.0)
        n = np.arange(7, dtype=np.int32)
        for _ in range(2):  # a second run of the same program
            got_x, got_n = run(x, n)
            for shard in got_x.addressable_shards:
                np.testing.assert_array_equal(np.asarray(shard.data), x * 8)
            for shard in got_n.addressable_shards:
                np.testing.assert_array_equal(np.asarray(shard.data), n * 8)

    def bad_input(self):
        from jax.sharding import Mesh, PartitionSpec as P

        import bagua_jax

        jax, optax = self.jax, self.optax
        bagua_jax.init_process_group()
        expect_error(ValueError, lambda: bagua_jax.transform("bytegrad", mesh=self.mesh, axis_name="data"), "not both")
        expect_error(TypeError, lambda: bagua_jax.transform("bytegrad", mesh="data"), "jax.sharding.Mesh")
        expect_error(TypeError, lambda: bagua_jax.transform("bytegrad", axis_name=3), "axis_name")
        w = self.sharded(np.zeros((4, 2)), P())
        # axis_name outside shard_map
        tx = bagua_jax.transform("gradient_allreduce", axis_name="data")
        state = tx.init(w)
        expect_error(ValueError, lambda: jax.jit(tx.update)(w, state, w), "is not bound")
        # a mesh whose axis the user's shard_map does not have
        other = Mesh(np.array(jax.local_devices()), ("batch",))
        run = jax.jit(jax.shard_map(lambda g, s: tx.update(g, s)[0], mesh=other, in_specs=(P(), P()), out_specs=P()))
        expect_error(ValueError, lambda: run(w, state), "'data' is not bound")
        # a shard_map that also splits the devices along an axis axis_name does not name
        grid = Mesh(np.array(jax.local_devices()).reshape(-1, 1), ("data", "model"))
        run = jax.jit(jax.shard_map(lambda g, s: tx.update(g, s)[0], mesh=grid, in_specs=(P(), P()), out_specs=P()))
        expect_error(ValueError, lambda: run(w, state), "also splits the devices along ['model']")
        # a mesh or shard_map over some of the process's devices: Bagua runs over all of them
        part = Mesh(np.array(jax.local_devices()[:1]), ("data",))
        expect_error(
            ValueError, lambda: bagua_jax.transform("bytegrad", mesh=part), f"holds 1 of this process's {self.devices}"
        )
        run = jax.jit(jax.shard_map(lambda g, s: tx.update(g, s)[0], mesh=part, in_specs=(P(), P()), out_specs=P()))
        on_part = jax.device_get((w, state))  # host values: placed on the part by the call
        expect_error(ValueError, lambda: run(*on_part), "span 1 devices", f"this process has {self.devices}")
        # a process-local array (committed to one device) where mesh= needs global arrays
        on_mesh = bagua_jax.transform("gradient_allreduce", mesh=self.mesh)
        local = jax.device_put(np.zeros((4, 2)), jax.local_devices()[0])
        expect_error(ValueError, lambda: on_mesh.update(local, on_mesh.init(w)), "updates lives on", "NamedSharding")
        # global arrays over several devices without mesh=: refused, not run once per device
        plain = optax.chain(bagua_jax.transform("gradient_allreduce"), optax.sgd(0.1))
        expect_error(Exception, lambda: jax.jit(plain.update)(w, plain.init(w), w), "pass mesh=")
        x = self.sharded(np.arange(8.0 * self.devices), P("data"))
        expect_error(Exception, lambda: bagua_jax.allreduce(x), "pass mesh=")
        # a collective inside shard_map would run on every device: refused
        inside = jax.jit(jax.shard_map(bagua_jax.allreduce, mesh=self.mesh, in_specs=P("data"), out_specs=P("data")))
        expect_error(Exception, lambda: inside(x), "cannot run inside shard_map")
        # the collectives still work after the refusals (nothing was left half-run)
        total = bagua_jax.allreduce(self.jnp.ones(3))
        np.testing.assert_array_equal(np.asarray(total), np.full(3, float(self.world)))

    def dead_peer_on_mesh(self):
        """A peer process dies: the step on the mesh fails on every device of
        the survivors (the leader's engine step, and the other devices' copy
        of its result with it) well within the timeout, never a hang."""
        from jax.sharding import PartitionSpec as P

        import bagua_jax

        bagua_jax.init_process_group()
        tx = bagua_jax.transform("bytegrad", mesh=self.mesh)
        grads = self.sharded(np.ones(1 << 16), P())
        state = tx.init(grads)
        exit_as_dead_peer("dead_peer_on_mesh", self.rank, self.world)

        def step():
            out, _ = self.jax.jit(tx.update)(grads, state)
            for shard in out.addressable_shards:  # every device's copy
                np.asarray(shard.data)

        expect_failure_within(45, step, "PeerError")


# ---------------------------------------------------------------- pytest side


def _session(name: str) -> Session:
    processes, devices = LAYOUTS[name]
    if isinstance(devices, tuple):
        return Session(processes, env={"BAGUA_TEST_DEVICES_BY_RANK": ",".join(map(str, devices))})
    flags = f"--xla_force_host_platform_device_count={devices} --xla_cpu_multi_thread_eigen=false"
    return Session(processes, env={"XLA_FLAGS": flags})


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: _session(name) for name in LAYOUTS},
    case_names,
    timeout=240,
    test_timeout=300,
    requires=("jax", "optax"),
)


if __name__ == "__main__":
    worker_main(Worker, case_names)
