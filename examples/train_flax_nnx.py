"""Train a Flax NNX model data-parallel, with Bagua's transform inside an
``nnx.Optimizer``.

    bagua-run --nproc-per-node 2 examples/train_flax_nnx.py --algorithm bytegrad

Every rank builds the model from its own seed, as scripts often do; the
weights are then made rank 0's with ``bagua_jax.broadcast_params`` (without
it, ``tx.init`` warns that they differ). Gradient algorithms go before the
optimizer in the chain, weight algorithms after it:

    optax.chain(bagua_jax.transform(ByteGradAlgorithm()), optax.adam(lr))
    optax.chain(optax.adam(lr), bagua_jax.transform(DecentralizedAlgorithm()))

The train step is ``nnx.jit``-ed. Rank 0 prints the mean loss per epoch and
the held-out accuracy.
"""

import argparse
import itertools
import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")  # one core per rank

import jax.numpy as jnp
import optax
from flax import nnx
from train_demo_jax import make_data  # the demo's task

import bagua_jax

FEATURES, CLASSES = 16, 4


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(FEATURES, 64, rngs=rngs)
        self.out = nnx.Linear(64, CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", default="bytegrad", help="a registered algorithm name (default bytegrad)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=60, help="steps per epoch")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.01)
    return p.parse_args()


def batches(rank, rows):
    """This rank's batches of train_demo_jax.py's task (Gaussian clusters), one seed per step."""
    for step in itertools.count():
        yield make_data(rows, FEATURES, CLASSES, seed=1 + rank + 1000 * step)


def main():
    args = parse_args()
    group = bagua_jax.init_process_group()
    model = MLP(nnx.Rngs(group.rank))  # a different start on every rank...
    nnx.update(model, bagua_jax.broadcast_params(nnx.state(model, nnx.Param)))  # ...made rank 0's

    algorithm = bagua_jax.algorithms.as_algorithm(args.algorithm)
    bagua = bagua_jax.transform(algorithm)
    weights = algorithm.to_core().plan().communicates == "weights"
    tx = optax.chain(optax.adam(args.lr), bagua) if weights else optax.chain(bagua, optax.adam(args.lr))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    data = batches(group.rank, args.batch_size)
    for epoch in range(args.epochs):
        losses = [train_step(model, optimizer, *next(data)) for _ in range(args.steps)]
        mean = float(bagua_jax.allreduce(jnp.mean(jnp.stack(losses)), op="avg"))
        if group.rank == 0:
            print(f"{algorithm.name} epoch {epoch + 1}/{args.epochs}: loss {mean:.4f}", flush=True)
    x, y = make_data(2048, FEATURES, CLASSES, seed=0)
    accuracy = float(jnp.mean(jnp.argmax(model(x), -1) == y))
    if group.rank == 0:
        print(f"{group.size} ranks, accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
