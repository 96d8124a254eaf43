"""Train with one process per host and several devices per process: XLA
averages the gradients over the host's devices, Bagua's algorithm runs
between the hosts.

    bagua-run --nproc-per-node 2 examples/train_multi_device_jax.py --cpu-devices 4

Each process builds a ``Mesh`` over its own devices, puts its share of the
global batch on them as a global array sharded along ``"data"``, and chains
``bagua_jax.transform(algorithm, mesh=mesh)`` into optax: the jitted step's
gradient is already the mean over the host's devices (XLA's collective), and
the transform runs the algorithm once per process, between processes, with
its result replicated over the mesh. ``--cpu-devices N`` splits this
machine's CPU into N XLA devices (on GPU hosts the mesh holds the GPUs).
Rank 0 prints the mean loss per epoch and the held-out accuracy (the task of
examples/train_demo_jax.py).
"""

import argparse
import itertools
import os


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", default="bytegrad", help="a registered algorithm name (default bytegrad)")
    p.add_argument("--cpu-devices", type=int, default=0, help="split the CPU into this many XLA devices")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=60, help="steps per epoch")
    p.add_argument("--batch-per-device", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


args = parse_args()
if args.cpu_devices:  # before JAX initialises its backends
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={args.cpu_devices} --xla_cpu_multi_thread_eigen=false"
    )

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from train_demo_jax import make_data  # noqa: E402 (the demo's task)

import bagua_jax  # noqa: E402

FEATURES, CLASSES = 16, 4


def batches(rank, rows):
    """This rank's batches of train_demo_jax.py's task (Gaussian clusters), one seed per step."""
    for step in itertools.count():
        yield make_data(rows, FEATURES, CLASSES, seed=1 + rank + 1000 * step)


def init_params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {
        "hidden": jax.random.normal(k1, (FEATURES, 32)) * 0.2,
        "out": jax.random.normal(k2, (32, CLASSES)) * 0.2,
    }


def logits(params, x):
    return jnp.tanh(x @ params["hidden"]) @ params["out"]


def loss_fn(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits(params, x), y).mean()


def main():
    group = bagua_jax.init_process_group()
    mesh = Mesh(np.array(jax.local_devices()), ("data",))
    algorithm = bagua_jax.algorithms.as_algorithm(args.algorithm)
    bagua = bagua_jax.transform(algorithm, mesh=mesh)
    weights = algorithm.to_core().plan().communicates == "weights"
    tx = optax.chain(optax.sgd(args.lr), bagua) if weights else optax.chain(bagua, optax.sgd(args.lr))

    replicated, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params = jax.device_put(init_params(), replicated)
    state = tx.init(params)

    @jax.jit
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)  # mean over the host's devices
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    rows = args.batch_per_device * mesh.size
    data = batches(group.rank, rows)
    for epoch in range(args.epochs):
        losses = []
        for _ in range(args.steps):
            x, y = next(data)
            params, state, loss = step(params, state, jax.device_put(x, by_row), jax.device_put(y, by_row))
            losses.append(loss)
        mine = np.mean([float(loss) for loss in losses])  # host values: the collective runs on one device
        mean = float(bagua_jax.allreduce(jnp.asarray(mine, jnp.float32), op="avg"))
        if group.rank == 0:
            print(f"{algorithm.name} epoch {epoch + 1}/{args.epochs}: loss {mean:.4f}", flush=True)
    x, y = make_data(2048, FEATURES, CLASSES, seed=0)
    accuracy = float(jnp.mean(jnp.argmax(logits(params, x), -1) == y))
    if group.rank == 0:
        print(f"{group.size} processes x {mesh.size} devices, accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
