"""Training that goes on while workers are lost and come back, without
restarting the survivors (per-step fault tolerance, ``bagua_torch.live``).

Start torchft's Lighthouse once, then each replica under its own agent (a
replica restarts on its own; the others go on):

    torchft_lighthouse --min_replicas 2 --heartbeat_timeout_ms 1000 --join_timeout_ms 5000 &
    export BAGUA_LIGHTHOUSE=HOST:29510
    bagua-run --nproc-per-node 1 --max-restarts 3 examples/live_train.py      # once per replica

Each step's global batch is fixed (``--global-batch`` rows of a synthetic
regression, split evenly among the members present): with GradientAllReduce
(the default ``--algorithm``) the job follows full-batch gradient descent
whoever is present, so a run with faults ends where an unfaulted one does.
With an algorithm whose replicas differ between exchanges (local steps,
decentralized) the job ends on the average of the members' weights. A lost peer costs the step in
flight; a replica that comes back takes the model, optimizer and step from
rank 0 over Bagua's transport and joins at the next step.

``--record FILE`` writes what this replica saw (its process, restarts, each
rebuilt group, the final weights); ``--kill-at-step S`` makes the replica
SIGKILL itself inside step S, before its gradients are exchanged (first start
only).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch

import bagua_torch
from bagua_torch.algorithms import Algorithm, QAdamAlgorithm, QAdamOptimizer
from bagua_torch.live import LiveTraining


def regression(steps: int, global_batch: int, features: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, global_batch, features, generator=g, dtype=torch.float64)
    y = torch.tanh(x @ torch.randn(features, 1, generator=g, dtype=torch.float64))
    return x, y


def model_for(features: int) -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(features, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def main() -> None:
    parser = argparse.ArgumentParser(description="Per-step fault tolerance with Bagua (torch)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=12, help="divisible by every number of members")
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--algorithm", default="gradient_allreduce", help="a Bagua algorithm name")
    parser.add_argument(
        "--optimizer", choices=["sgd", "adam"], default="sgd", help="sgd: with momentum 0.9 (qadam: QAdam's own)"
    )
    parser.add_argument("--warmup-steps", type=int, default=20, help="QAdam's uncompressed warm-up")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds of pretend compute per step")
    parser.add_argument("--record", default=None)
    parser.add_argument("--kill-at-step", type=int, default=None)
    args = parser.parse_args()

    x, y = regression(args.steps, args.global_batch, args.features)
    model = model_for(args.features)
    if args.algorithm == "qadam":  # its optimizer and its algorithm go together
        optimizer = QAdamOptimizer(model.parameters(), lr=args.lr, warmup_steps=args.warmup_steps)
        algorithm = QAdamAlgorithm(optimizer)
    else:
        if args.optimizer == "adam":  # DiLoCo's recipe for local steps: Adam inside, Nesterov outside
            optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        algorithm = Algorithm.init(args.algorithm)
    live = LiveTraining(model, [optimizer], algorithm)
    first_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    started = time.time()
    average_at_end = None  # replicas that differ between exchanges end on their average: one step more
    while live.step < args.steps + bool(average_at_end):
        with live.attempt():
            average_at_end = model.bagua_ddp.communicates_weights
            if live.step == args.steps:
                for p in model.parameters():
                    bagua_torch.allreduce_inplace(p.data, op=bagua_torch.ReduceOp.AVG)
                continue
            if args.global_batch % live.world_size:
                raise ValueError(f"--global-batch {args.global_batch} does not split among {live.world_size}")
            share = args.global_batch // live.world_size
            rows = slice(live.rank * share, (live.rank + 1) * share)
            loss = torch.nn.functional.mse_loss(model(x[live.step, rows]), y[live.step, rows])
            if first_start and live.step == args.kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            time.sleep(args.pause)
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x.flatten(0, 1)), y.flatten(0, 1)).item()
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    if args.record:
        with open(args.record, "a") as f:
            record = {"pid": os.getpid(), "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
            record.update(changes=live.changes, failures=live.failures, weights=weights)
            record.update(seconds=time.time() - started, final_world=live.world_size, loss=loss)
            f.write(json.dumps(record) + "\n")
    live.close()


if __name__ == "__main__":
    main()
