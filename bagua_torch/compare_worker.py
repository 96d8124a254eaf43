"""The torch side of ``bagua-compare`` (run by it under ``bagua-run``):
trains :class:`bagua_core.compare.problem.Problem`'s MLP, in the problem's
dtype, with ``with_bagua`` and plain SGD (QAdam: its own optimizer,
QAdamOptimizer), once per configuration of ``--algorithm``, each from a fresh
model, optimizer and algorithm; rank 0 writes every step's loss (mean over
ranks) and time.
Asynchronous model average averages at the problem's fixed steps
(``abort`` + ``resume``), or with ``--async-average-every 0`` at wall-clock
times (its trajectory then differs from run to run)."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

import bagua_torch
from bagua_core.compare.problem import algorithm_of, result, train_each, worker_arguments
from bagua_torch.algorithms import Algorithm, QAdamAlgorithm, QAdamOptimizer


def train(name: str, problem, group):
    """Trains ``problem``'s MLP from its initial weights with configuration
    ``name``; returns its :func:`~bagua_core.compare.problem.result` on rank 0."""
    layers = []
    for i, (fan_in, fan_out) in enumerate(problem.sizes):
        layers.append(torch.nn.Linear(fan_in, fan_out))
        if i + 1 < len(problem.sizes):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(getattr(torch, problem.dtype))
    with torch.no_grad():
        for p, w in zip(model.parameters(), problem.initial_weights()):
            p.copy_(torch.from_numpy(w))
    if name == "qadam":  # communicates its own optimizer's momentum
        opt = QAdamOptimizer(model.parameters(), lr=problem.adam_lr, warmup_steps=problem.warmup_steps)
        algorithm = QAdamAlgorithm(opt)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=problem.lr)
        registered, extra = algorithm_of(name)
        if name == "async":
            extra = {"warmup_steps": problem.warmup_steps}
            if problem.async_sync_interval_ms() is not None:
                extra["sync_interval_ms"] = problem.async_sync_interval_ms()
        elif name == "low_rank":  # compressed after the problem's warm-up
            extra = {"start_iter": problem.warmup_steps}
        algorithm = Algorithm.init(registered, **extra)
    model = model.with_bagua([opt], algorithm)

    losses, times = [], []
    for step in range(problem.steps):
        x, y = (torch.from_numpy(a) for a in problem.batch(step, group.rank))
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        if name == "async" and problem.averages_after(step):
            algorithm.abort(model)  # the average, with training stopped on every rank
            algorithm.resume(model)
    if name == "async":
        algorithm.abort(model)  # every rank: the loop's last round, then it stops
    model.bagua_ddp.close()  # its engine stops: the next configuration starts alone
    mean = torch.tensor(np.asarray(losses, np.float64))
    bagua_torch.allreduce_inplace(mean, op=bagua_torch.ReduceOp.AVG)
    return result("torch", name, group.size, mean.tolist(), times) if group.rank == 0 else None


def main(argv=None) -> None:
    args, problem = worker_arguments(argv)
    torch.set_num_threads(1)
    group = bagua_torch.init_process_group()
    train_each(args, problem, group, train)


if __name__ == "__main__":
    main()
