"""bagua_jax together with jax.distributed, across real processes with 2
devices each:

* ``launched``: under the launcher's environment, ``jax.distributed.initialize()``
  without arguments takes Bagua's rank and world size (and a coordinator port
  beside Bagua's store); ``bagua_jax.init_process_group()`` then agrees with
  JAX, a mesh over the process's devices trains as numpy does and as JAX's
  own data parallelism does (XLA averaging over a mesh of every process's
  devices), ``transform`` on such a global mesh is refused, ``broadcast_params``
  copies rank 0's values into global arrays replicated across the processes
  (refusing ones sharded across them), and a world size that disagrees with
  JAX's is an error;
* ``explicit``: no launcher's variables; ``jax.distributed.initialize(address,
  n, i)``, and ``bagua_jax.init_process_group()`` takes everything from JAX.

One multi-process session per way in (jax.distributed initialises once per
process); this file is also the worker script.
"""

from __future__ import annotations

import os

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests
from tests.harness.worker import expect_error

SESSIONS = ("launched", "explicit")
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def case_names(session: str):
    names = ["initialize_and_agree", "mesh_of_this_process_trains"]
    if session == "launched":
        names += [
            "matches_xla_across_processes",
            "global_mesh_refused",
            "broadcast_params_across_processes",
            "world_size_disagreement",
        ]
    return names


class Worker(JaxWorker):
    def __init__(self, session: str):
        super().__init__()
        jax = self.jax
        if session == "launched":
            import bagua_jax  # noqa: F401 (its cluster environment answers jax.distributed)

            jax.config.update("jax_cpu_collectives_implementation", "gloo")  # XLA's own, for the reference
            jax.distributed.initialize()
        else:
            address = f"127.0.0.1:{int(os.environ['MASTER_PORT']) + 2}"
            for name in LAUNCH_VARIABLES:
                os.environ.pop(name, None)
            jax.distributed.initialize(address, self.world, self.rank)
        from jax.sharding import Mesh

        self.mesh = Mesh(np.array(jax.local_devices()), ("data",))

    def initialize_and_agree(self):
        import bagua_jax

        assert (self.jax.process_index(), self.jax.process_count()) == (self.rank, self.world)
        group = bagua_jax.init_process_group()
        assert (group.rank, group.size) == (self.rank, self.world)
        total = bagua_jax.allreduce(self.jnp.full(3, float(self.rank + 1)))
        np.testing.assert_array_equal(np.asarray(total), np.full(3, self.world * (self.world + 1) / 2))

    def mesh_of_this_process_trains(self):
        from jax.sharding import NamedSharding, PartitionSpec as P

        import bagua_jax

        jax, optax = self.jax, self.optax
        bagua_jax.init_process_group()
        tx = optax.chain(bagua_jax.transform("gradient_allreduce", mesh=self.mesh), optax.sgd(0.25))
        rng = np.random.default_rng(3)
        shards = 2 * self.world
        x = rng.integers(-2, 3, (shards * 2, 3)).astype(np.float32)
        y = rng.integers(-2, 3, (shards * 2,)).astype(np.float32)
        w = jax.device_put(np.zeros(3, np.float32), NamedSharding(self.mesh, P()))
        state = tx.init(w)
        mine = slice(self.rank * 4, self.rank * 4 + 4)
        xs = jax.device_put(x[mine], NamedSharding(self.mesh, P("data")))
        ys = jax.device_put(y[mine], NamedSharding(self.mesh, P("data")))

        def loss(w, x, y):
            return ((x @ w - y) ** 2).mean()

        u, state = jax.jit(tx.update)(jax.grad(loss)(w, xs, ys), state, w)
        w = optax.apply_updates(w, u)
        want = -0.25 * 2 * x.T @ (x @ np.zeros(3) - y) / len(y)
        np.testing.assert_array_equal(np.asarray(w), want.astype(np.float32))

    def matches_xla_across_processes(self):
        """JAX's own data parallelism as the reference: a mesh over every
        process's devices, XLA averaging the gradient across the processes."""
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        import bagua_jax

        jax, optax = self.jax, self.optax
        bagua_jax.init_process_group()
        everyone = Mesh(np.array(jax.devices()), ("data",))
        rng = np.random.default_rng(4)
        x = rng.standard_normal((self.world * 8, 5)).astype(np.float32)
        y = rng.standard_normal((self.world * 8, 3)).astype(np.float32)
        mine = slice(self.rank * 8, self.rank * 8 + 8)

        def loss(w, x, y):
            return ((x @ w - y) ** 2).mean()

        def train(tx, mesh):
            rows = NamedSharding(mesh, P("data"))
            xs = jax.make_array_from_process_local_data(rows, x[mine])
            ys = jax.make_array_from_process_local_data(rows, y[mine])
            w = jax.device_put(np.zeros((5, 3), np.float32), NamedSharding(mesh, P()))
            state = tx.init(w)

            @jax.jit
            def step(w, state, xs, ys):
                u, state = tx.update(jax.grad(loss)(w, xs, ys), state, w)
                return optax.apply_updates(w, u), state

            for _ in range(3):
                w, state = step(w, state, xs, ys)
            return np.asarray(w.addressable_shards[0].data)

        want = train(optax.sgd(0.1), everyone)
        got = train(optax.chain(bagua_jax.transform("gradient_allreduce", mesh=self.mesh), optax.sgd(0.1)), self.mesh)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    def global_mesh_refused(self):
        from jax.sharding import Mesh

        import bagua_jax

        everyone = Mesh(np.array(self.jax.devices()), ("data",))
        expect_error(
            ValueError,
            lambda: bagua_jax.transform("gradient_allreduce", mesh=everyone),
            "holds devices of processes",
            "jax.local_devices()",
        )

    def broadcast_params_across_processes(self):
        """broadcast_params on global arrays over every process's devices: leaves
        replicated across the processes (whole, or sharded over each process's
        own devices) take rank 0's values on every device and keep their
        shardings; a leaf sharded across the processes is refused on every rank."""
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        import bagua_jax

        jax = self.jax
        rows = [[d for d in jax.devices() if d.process_index == p] for p in range(self.world)]
        everyone = Mesh(np.array(rows), ("process", "local"))

        def values(rank):
            return np.arange(24.0).reshape(4, 6) + 1000 * rank

        def global_array(spec):  # this process's values in its shards (replicas that disagree)
            mine = values(self.rank)
            return jax.make_array_from_callback(mine.shape, NamedSharding(everyone, spec), lambda i: mine[i])

        params = {"whole": global_array(P()), "over_local": global_array(P("local"))}
        got = bagua_jax.broadcast_params(params, root=0)
        for name, leaf in got.items():
            assert leaf.sharding == params[name].sharding, name
            for shard in leaf.addressable_shards:
                np.testing.assert_array_equal(np.asarray(shard.data), values(0)[shard.index], err_msg=name)
        across = {"w": global_array(P("process"))}
        expect_error(ValueError, lambda: bagua_jax.broadcast_params(across), "['w'] is sharded across processes")
        bagua_jax.broadcast_params({"x": np.ones(3)})  # the group is still in step

    def world_size_disagreement(self):
        from bagua_jax._src.distributed import settings_from_jax

        saved = os.environ["WORLD_SIZE"]
        os.environ["WORLD_SIZE"] = str(self.world + 1)
        try:
            expect_error(ValueError, settings_from_jax, f"process {self.rank} of {self.world}", "WORLD_SIZE=")
        finally:
            os.environ["WORLD_SIZE"] = saved


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {
        name: Session(
            2, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false"}
        )
        for name in SESSIONS
    },
    case_names,
    timeout=120,
    test_timeout=180,
    requires=("jax", "optax"),
)


if __name__ == "__main__":
    import sys

    worker_main(lambda: Worker(sys.argv[1]), case_names)
