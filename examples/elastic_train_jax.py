"""Elastic training with Bagua in JAX: a job that survives lost workers by
restarting from its last checkpoint. Run it under bagua-run's elastic launch
(torch elastic's agent; this script imports no torch):

    bagua-run --nproc-per-node 2 --max-restarts 3 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29400 --rdzv-id job7 examples/elastic_train_jax.py --checkpoint-dir /shared/ckpt

When a worker dies, the agents restart every worker (up to
``--max-restarts`` times) and the job goes on from the last checkpoint,
exactly where it was: ``bagua_jax.checkpoint`` saves the parameters, the
optax state with Bagua's transform state and the data position (through
orbax, one directory per rank, never half written), and the data order is a
function of the seed and the position. A checkpoint saved by another number
of workers (nodes joined or left) loads with every worker taking rank 0's
state (``world_size_policy="from_rank0"``: exact for the params and optimizer
state; a transform's per-rank state, e.g. error feedback, becomes rank 0's).
``PreemptionGuard``: a SIGTERM to any worker makes every worker save at the
same step and stop.

``--out FILE`` writes the final parameters (rank 0, npz);
``--kill-rank-at-step R:S`` makes rank R SIGKILL itself before step S of the
job's first worker group.
"""

from __future__ import annotations

import argparse
import os
import signal

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")  # one core per rank

import jax
import jax.numpy as jnp
import numpy as np
import optax

import bagua_jax
from bagua_core.algorithms import WEIGHTS
from bagua_jax.algorithms import Algorithm
from bagua_jax.checkpoint import PreemptionGuard, load_checkpoint, save_checkpoint


def synthetic_regression(size: int, features: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, features)).astype(np.float32)
    w = rng.standard_normal((features, 1)).astype(np.float32) / np.float32(features**0.5)
    return x, x @ w + np.float32(0.1) * rng.standard_normal((size, 1)).astype(np.float32)


def init_params(features: int, seed: int) -> dict:
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "w1": jax.random.normal(k1, (features, 32)) / features**0.5,
        "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 1)) / 32**0.5,
        "b2": jnp.zeros(1),
    }


def loss_fn(params: dict, x, y):
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


def batch_indices(position: np.ndarray, size: int, world: int, rank: int, batch: int, seed: int):
    """This rank's samples at ``position`` (epoch, samples the job took in it)
    and the position after the step: each epoch is one permutation of the
    data (seeded by the epoch), each step takes the next world x batch of it;
    an epoch ends when less than that is left."""
    epoch, taken = int(position[0]), int(position[1])
    if taken + world * batch > size:
        epoch, taken = epoch + 1, 0
    order = np.random.default_rng(seed + epoch).permutation(size)
    mine = order[taken + rank * batch : taken + (rank + 1) * batch]
    return mine, np.array([epoch, taken + world * batch], np.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description="Elastic training with Bagua (JAX)")
    parser.add_argument("--steps", type=int, default=200, help="training steps of the whole job")
    parser.add_argument("--batch-size", type=int, default=8, help="per worker")
    parser.add_argument("--train-size", type=int, default=1024)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--algorithm", default="gradient_allreduce", help="a Bagua algorithm's name")
    parser.add_argument("--checkpoint-dir", default="./elastic-ckpt-jax", help="a directory every node can reach")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="write the final parameters there (npz, rank 0)")
    parser.add_argument("--kill-rank-at-step", default="", metavar="R:S", help="rank R SIGKILLs itself at step S")
    args = parser.parse_args()

    group = bagua_jax.init_process_group()
    rank, world = group.rank, group.size
    first_group = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    x_all, y_all = synthetic_regression(args.train_size, args.features, args.seed)

    algorithm = Algorithm.init(args.algorithm)
    sgd = optax.sgd(args.lr, momentum=0.9)
    if algorithm.to_core().plan().communicates == WEIGHTS:  # weight algorithms go after the optimizer
        tx = optax.chain(sgd, bagua_jax.transform(algorithm))
    else:
        tx = optax.chain(bagua_jax.transform(algorithm), sgd)
    params = init_params(args.features, args.seed)
    state = {"params": params, "opt": tx.init(params), "position": np.zeros(2, np.int32)}
    step, state = load_checkpoint(args.checkpoint_dir, state, world_size_policy="from_rank0")
    step = step or 0
    if rank == 0:
        print(f"world size {world}, starting at step {step}", flush=True)

    @jax.jit
    def train_step(params, opt, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    kill_rank, _, kill_step = args.kill_rank_at_step.partition(":")
    with PreemptionGuard(every=5) as guard:
        while step < args.steps:
            if kill_step and first_group and rank == int(kill_rank) and step + 1 == int(kill_step):
                os.kill(os.getpid(), signal.SIGKILL)
            mine, position = batch_indices(
                np.asarray(state["position"]), args.train_size, world, rank, args.batch_size, args.seed
            )
            params, opt, loss = train_step(state["params"], state["opt"], x_all[mine], y_all[mine])
            state = {"params": params, "opt": opt, "position": position}
            step += 1
            stop = guard.should_stop()
            if step % args.checkpoint_every == 0 or stop or step == args.steps:
                save_checkpoint(args.checkpoint_dir, step, state, keep_last=3)
            if rank == 0 and step % args.checkpoint_every == 0:
                print(f"step {step} loss {float(loss):.4f}", flush=True)
            if stop:
                break
    if args.out and rank == 0:
        np.savez(args.out, **{k: np.asarray(v) for k, v in state["params"].items()})


if __name__ == "__main__":
    main()
