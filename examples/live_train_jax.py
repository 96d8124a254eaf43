"""Training that goes on while workers are lost and come back, without
restarting the survivors, in JAX (per-step fault tolerance,
``bagua_jax.live``; this script imports no torch). Start torchft's Lighthouse
once, then each replica under its own agent:

    torchft_lighthouse --min_replicas 2 --heartbeat_timeout_ms 1000 --join_timeout_ms 5000 &
    export BAGUA_LIGHTHOUSE=HOST:29510
    bagua-run --nproc-per-node 1 --max-restarts 3 examples/live_train_jax.py  # once per replica

As in examples/live_train.py (torch): each step's global batch is fixed and
split evenly among the members present, so with GradientAllReduce (the
default ``--algorithm``) the job follows full-batch gradient descent whoever
is present; with an algorithm whose replicas differ between exchanges (local
steps, decentralized) the job ends on the average of the members' params. ``--record FILE``
writes what this replica saw; ``--kill-at-step S`` makes the replica SIGKILL
itself inside step S (first start only).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")  # one core per replica

import jax
import jax.numpy as jnp
import numpy as np
import optax

import bagua_jax
from bagua_core.algorithms import WEIGHTS
from bagua_jax.live import LiveTraining


def regression(steps: int, global_batch: int, features: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps, global_batch, features))
    return x, np.tanh(x @ rng.standard_normal((features, 1)))


def init_params(features: int) -> dict:
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    return {
        "w1": jax.random.normal(k1, (features, 16), jnp.float64) / features**0.5,
        "b1": jnp.zeros(16, jnp.float64),
        "w2": jax.random.normal(k2, (16, 1), jnp.float64) / 4.0,
        "b2": jnp.zeros(1, jnp.float64),
    }


def loss_fn(params: dict, x, y):
    return jnp.mean((jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"] - y) ** 2)


def main() -> None:
    parser = argparse.ArgumentParser(description="Per-step fault tolerance with Bagua (JAX)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=12, help="divisible by every number of members")
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--algorithm", default="gradient_allreduce", help="a Bagua algorithm name")
    parser.add_argument("--error-feedback", action="store_true", help="the algorithm's error feedback (ByteGrad)")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd", help="sgd: with momentum 0.9")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds of pretend compute per step")
    parser.add_argument("--record", default=None)
    parser.add_argument("--kill-at-step", type=int, default=None)
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)  # float64: the test compares with full-batch training to 1e-9
    x, y = regression(args.steps, args.global_batch, args.features)

    extra = {"error_feedback": True} if args.error_feedback else {}
    algorithm = bagua_jax.algorithms.Algorithm.init(args.algorithm, **extra)
    communicates_weights = algorithm.to_core().plan().communicates == WEIGHTS
    if args.optimizer == "adam":  # DiLoCo's recipe for local steps: Adam inside, Nesterov outside
        inner = optax.adam(args.lr)
    else:
        inner = optax.sgd(args.lr, momentum=0.9)

    def build():  # on every rebuilt group: a transform bound to it, and the step using it
        bagua = bagua_jax.transform(algorithm)
        # gradients are averaged before the optimizer, weights after it
        tx = optax.chain(inner, bagua) if communicates_weights else optax.chain(bagua, inner)

        @jax.jit
        def train_step(state, x, y):
            params, opt = state
            grads = jax.grad(loss_fn)(params, x, y)
            updates, opt = tx.update(grads, opt, params)
            return optax.apply_updates(params, updates), opt

        return tx, train_step

    params = init_params(args.features)
    live = LiveTraining(build, init=lambda tx: (params, tx.init(params)))
    first_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    started = time.time()
    # replicas that differ between exchanges end on their average: one step more
    while live.step < args.steps + communicates_weights:
        with live.attempt():
            if live.step == args.steps:
                params, opt = live.state
                average = {k: bagua_jax.allreduce(v, op=bagua_jax.ReduceOp.AVG) for k, v in params.items()}
                live.state = (average, opt)
                continue
            share = args.global_batch // live.world_size
            rows = slice(live.rank * share, (live.rank + 1) * share)
            if first_start and live.step == args.kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
            live.state = live.step_fn(live.state, x[live.step, rows], y[live.step, rows])
            time.sleep(args.pause)
    weights = [np.asarray(live.state[0][k]).ravel().tolist() for k in sorted(live.state[0])]
    loss = float(loss_fn(live.state[0], x.reshape(-1, args.features), y.reshape(-1, 1)))
    if args.record:
        with open(args.record, "a") as f:
            record = {"pid": os.getpid(), "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
            record.update(changes=live.changes, failures=live.failures, weights=weights, final_world=live.world_size)
            record.update(loss=loss)
            record.update(seconds=time.time() - started, torch_imported="torch" in sys.modules)
            f.write(json.dumps(record) + "\n")
    live.close()


if __name__ == "__main__":
    main()
