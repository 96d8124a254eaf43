"""Train a small Flax classifier data-parallel with Bagua's algorithms in JAX.

    bagua-run --nproc-per-node 2 examples/train_demo_jax.py --algorithm all

The JAX twin of examples/train_demo.py: the same task (synthetic Gaussian
clusters from a fixed seed), a Flax MLP, and ``bagua_jax.transform`` chained
into optax. Gradient algorithms go before the optimizer, weight algorithms
(Decentralized) after it:

    optax.chain(bagua_jax.transform(ByteGradAlgorithm()), optax.sgd(lr, momentum=0.9))
    optax.chain(optax.sgd(lr, momentum=0.9), bagua_jax.transform(DecentralizedAlgorithm()))

Rank 0 prints each epoch's mean loss over every rank and, at the end, a table
of the final loss, the held-out accuracy and the throughput of each algorithm.
"""

import argparse
import math
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")  # one core per rank

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

import bagua_jax
from bagua_core.algorithms import WEIGHTS
from bagua_jax.algorithms import Algorithm, QAdamAlgorithm

# Every registered algorithm, the baseline (gradient_allreduce) first, with demo
# settings where the defaults are meant for longer runs.
DEMO_SETTINGS = {
    # inner SGD with momentum: a lighter outer momentum than DiLoCo's 0.9 (meant for AdamW inside)
    "local_steps": {"outer_momentum": 0.5},
    # weights averaged in the background every 20 ms, after 20 allreduce steps
    "async": {"sync_interval_ms": 20, "warmup_steps": 20},
    # compressed from step 20 on, after plain allreduce steps (the default waits 1000)
    "low_rank": {"start_iter": 20},
}
ALGORITHMS = sorted(Algorithm.registered(), key=lambda name: name != "gradient_allreduce")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", choices=[*ALGORITHMS, "all"], default="all")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=16384, help="training samples in all (split across ranks)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--classes", type=int, default=8)
    return p.parse_args()


def make_data(n, features, classes, seed):
    """Overlapping Gaussian clusters: learnable, not trivially separable."""
    centres = np.random.default_rng(1234).standard_normal((classes, features)).astype(np.float32) * 0.5
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = centres[y] + rng.standard_normal((n, features)).astype(np.float32)
    return x, y


class MLP(nn.Module):
    classes: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(256)(x))
        x = nn.relu(nn.Dense(256)(x))
        return nn.Dense(self.classes)(x)


def optimizer(name, lr):
    """The placement rule: gradients are communicated before the optimizer,
    weights after it; QAdam's transform is the whole optimizer. Returns the
    optax transformation and the algorithm."""
    if name == "qadam":
        # eps bounds m / sqrt(v) where the frozen second moment is tiny (8-bit momentum noise)
        algorithm = QAdamAlgorithm(bagua_jax.qadam(lr / 20, warmup_steps=100, eps=1e-3))
        return bagua_jax.transform(algorithm), algorithm
    algorithm = Algorithm.init(name, **DEMO_SETTINGS.get(name, {}))
    sgd = optax.sgd(lr, momentum=0.9)
    if algorithm.to_core().plan().communicates == WEIGHTS:
        return optax.chain(sgd, bagua_jax.transform(algorithm)), algorithm
    return optax.chain(bagua_jax.transform(algorithm), sgd), algorithm


def train(name, args, data, test, rank, world):
    x, y = data
    model = MLP(args.classes)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, args.features)))  # the same on every rank
    tx, algorithm = optimizer(name, args.lr)
    state = tx.init(params)

    def loss_fn(p, xb, yb):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, xb), yb).mean()

    @jax.jit
    def step(p, s, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    steps = math.ceil(x.shape[0] / args.batch_size)
    order = np.random.default_rng(rank)
    samples = 0
    bagua_jax.allreduce(jnp.zeros(1)).block_until_ready()  # start together
    start = time.perf_counter()
    for epoch in range(args.epochs):
        perm = order.permutation(x.shape[0])
        losses = []
        for i in range(steps):
            idx = perm[i * args.batch_size : (i + 1) * args.batch_size]
            params, state, loss = step(params, state, x[idx], y[idx])
            losses.append(loss)
            samples += idx.size
        mean_loss = float(bagua_jax.allreduce(jnp.mean(jnp.stack(losses)), op="avg"))
        if rank == 0:
            print(
                f"{name:<18} epoch {epoch + 1}/{args.epochs} loss {mean_loss:.4f} {time.perf_counter() - start:5.1f}s",
                flush=True,
            )
    if name == "async":
        params = algorithm.abort(params)  # the same weights on every rank before evaluating
    bagua_jax.allreduce(jnp.zeros(1)).block_until_ready()
    elapsed = time.perf_counter() - start

    tx_, ty = test
    accuracy = float((model.apply(params, tx_).argmax(1) == ty).mean())
    return {"loss": mean_loss, "accuracy": accuracy, "samples_per_s": samples * world / elapsed}


def main():
    args = parse_args()
    group = bagua_jax.init_process_group()
    rank, world = group.rank, group.size
    per_rank = args.samples // world
    data = make_data(per_rank, args.features, args.classes, seed=rank + 1)
    test = make_data(2048, args.features, args.classes, seed=0)
    names = ALGORITHMS if args.algorithm == "all" else [args.algorithm]
    if rank == 0:
        print(
            f"JAX + Flax: {world} processes, {per_rank} samples each, batch {args.batch_size} per rank, "
            f"{args.epochs} epochs",
            flush=True,
        )

    results = {name: train(name, args, data, test, rank, world) for name in names}

    if rank == 0:
        print()
        print(f"{'algorithm (JAX)':<20}{'final loss':>12}{'accuracy':>10}{'samples/s':>12}")
        for name, r in results.items():
            print(f"{name:<20}{r['loss']:>12.4f}{r['accuracy']:>9.1%}{r['samples_per_s']:>12.0f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
