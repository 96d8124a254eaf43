"""The JAX side of ``bagua-compare`` (run by it under ``bagua-run``): trains
:class:`bagua_core.compare.problem.Problem`'s MLP, in the problem's dtype
(float64 turns on ``jax_enable_x64``), with ``bagua_jax.transform`` and plain
SGD, once per configuration of ``--algorithm``, each from fresh weights,
optimizer and transform (the transform before the optimizer for gradient
algorithms, after it for weight algorithms; QAdam's transform is the whole
optimizer, bagua_jax.qadam;
asynchronous model average averages at the problem's fixed steps, as the
torch side); rank 0 writes every step's loss
(mean over ranks) and time."""

from __future__ import annotations

import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")  # one core per rank, as torch

import jax
import jax.numpy as jnp
import numpy as np
import optax

import bagua_jax
from bagua_core.algorithms import WEIGHTS
from bagua_core.compare.problem import algorithm_of, result, train_each, worker_arguments


def forward(params, x):
    """The MLP with torch's layouts: params = [w0, b0, w1, b1, ...], w (out, in)."""
    n = len(params) // 2
    for i in range(n):
        x = x @ params[2 * i].T + params[2 * i + 1]
        if i + 1 < n:
            x = jax.nn.relu(x)
    return x


def train(name: str, problem, group):
    """Trains ``problem``'s MLP from its initial weights with configuration
    ``name``; returns its :func:`~bagua_core.compare.problem.result` on rank 0."""
    if name == "qadam":  # the transform is the whole optimizer
        tx = bagua_jax.transform(
            bagua_jax.QAdamAlgorithm(bagua_jax.qadam(problem.adam_lr, warmup_steps=problem.warmup_steps))
        )
    else:
        registered, extra = algorithm_of(name)
        if name == "async":
            extra = {"warmup_steps": problem.warmup_steps}
            if problem.async_sync_interval_ms() is not None:
                extra["sync_interval_ms"] = problem.async_sync_interval_ms()
        elif name == "low_rank":  # compressed after the problem's warm-up
            extra = {"start_iter": problem.warmup_steps}
        algorithm = bagua_jax.algorithms.Algorithm.init(registered, **extra)
        bagua = bagua_jax.transform(algorithm)
        sgd = optax.sgd(problem.lr)
        weights = algorithm.to_core().plan().communicates == WEIGHTS
        tx = optax.chain(sgd, bagua) if weights else optax.chain(bagua, sgd)
    params = [jnp.asarray(w) for w in problem.initial_weights()]
    state = tx.init(params)

    def loss_fn(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(forward(p, x), y).mean()

    @jax.jit
    def step(p, s, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    losses, times = [], []
    for t in range(problem.steps):
        x, y = problem.batch(t, group.rank)
        start = time.perf_counter()
        params, state, loss = step(params, state, x, y.astype(np.int32))
        loss.block_until_ready()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
        if name == "async" and problem.averages_after(t):
            params = algorithm.abort(params)  # the average, with training stopped on every rank
            algorithm.resume(params)
    if name == "async":
        algorithm.abort(params)  # every rank: the loop's last round, then it stops
    mean = bagua_jax.allreduce(jnp.asarray(losses, problem.dtype), op="avg")
    return result("jax", name, group.size, np.asarray(mean).tolist(), times) if group.rank == 0 else None


def main(argv=None) -> None:
    args, problem = worker_arguments(argv)
    if problem.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    group = bagua_jax.init_process_group()
    train_each(args, problem, group, train)


if __name__ == "__main__":
    main()
