"""Elastic training with Bagua in torch: a job that survives lost workers and
nodes by restarting from its last checkpoint, on any number of nodes between
MIN and MAX. Run the same line on every node (here up to 4, 2 workers each):

    bagua-run --nnodes 1:4 --nproc-per-node 2 --max-restarts 3 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29400 --rdzv-id job7 examples/elastic_train.py --checkpoint-dir /shared/ckpt

When a worker or a node dies, every node's agent restarts its workers (up to
``--max-restarts`` times) and the job goes on from the last checkpoint with
the nodes still there; a node that starts the same line later joins at the
next restart. What makes that exact:

* ``bagua_torch.checkpoint``: written so that a kill never leaves half a
  checkpoint in use; the model, optimizer, the algorithm's state, random
  states and the sampler's place go in (each rank's own where they differ
  per rank, e.g. ByteGrad's error-feedback residual).
* ``ResumableDistributedSampler``: restored on another number of ranks, the
  epoch goes on with exactly the samples not reached yet.
* ``PreemptionGuard``: a SIGTERM to any worker (a preemption notice) makes
  every worker save at the same step and stop.

The data is synthetic (a fixed random regression), so the script runs
anywhere. ``--record DIR`` writes, per worker, the sample indices of each
step (to count that every sample of an epoch is trained on once);
``--kill-rank-at-step R:S`` makes rank R SIGKILL itself before step S of
the job's first worker group; ``--out FILE`` saves the final state dict.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import uuid

import torch

import bagua_torch
from bagua_core import comm
from bagua_torch.algorithms import Algorithm, QAdamAlgorithm, QAdamOptimizer
from bagua_torch.checkpoint import PreemptionGuard, load_checkpoint, save_checkpoint
from bagua_torch.contrib import ResumableDistributedSampler


def synthetic_regression(size: int, features: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, features, generator=g)
    y = x @ torch.randn(features, 1, generator=g) / features**0.5 + 0.1 * torch.randn(size, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y, torch.arange(size))


def main() -> None:
    parser = argparse.ArgumentParser(description="Elastic training with Bagua (torch)")
    parser.add_argument("--steps", type=int, default=200, help="training steps of the whole job")
    parser.add_argument("--batch-size", type=int, default=8, help="per worker")
    parser.add_argument("--train-size", type=int, default=1024)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--algorithm", default="gradient_allreduce", help="a Bagua algorithm name")
    parser.add_argument("--error-feedback", action="store_true", help="the algorithm's error feedback (ByteGrad)")
    parser.add_argument("--checkpoint-dir", default="./elastic-ckpt", help="a directory every node can reach")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", default="", metavar="DIR", help="write each step's sample indices there")
    parser.add_argument("--kill-rank-at-step", default="", metavar="R:S", help="rank R SIGKILLs itself at step S")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds after each step (to watch a node join)")
    parser.add_argument("--out", default="", help="rank 0 saves the final model state dict (torch.save) there")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    bagua_torch.init_process_group()
    rank, world = bagua_torch.get_rank(), bagua_torch.get_world_size()
    first_group = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

    dataset = synthetic_regression(args.train_size, args.features, args.seed)
    sampler = ResumableDistributedSampler(dataset, shuffle=True, seed=args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(args.features, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if args.algorithm == "qadam":  # its optimizer and its algorithm go together
        optimizer = QAdamOptimizer(model.parameters(), lr=args.lr, warmup_steps=args.checkpoint_every)
        algorithm = QAdamAlgorithm(optimizer)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        extra = {"error_feedback": True} if args.error_feedback else {}
        algorithm = Algorithm.init(args.algorithm, **extra)
    model = model.with_bagua([optimizer], algorithm)
    step = load_checkpoint(args.checkpoint_dir, model, optimizer, sampler=sampler)
    if rank == 0:
        print(f"world size {world}, starting at step {step}, epoch {sampler.epoch}", flush=True)

    group_id = comm.broadcast_object(uuid.uuid4().hex if rank == 0 else None, 0)  # this worker group's
    record = os.path.join(args.record, f"{group_id}-rank{rank}.jsonl") if args.record else None
    kill_rank, _, kill_step = args.kill_rank_at_step.partition(":")

    with PreemptionGuard() as guard:
        while step < args.steps:
            loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
            for x, y, indices in loader:
                if kill_step and first_group and rank == int(kill_rank) and step + 1 == int(kill_step):
                    os.kill(os.getpid(), signal.SIGKILL)
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                sampler.advance(len(indices))
                step += 1
                if record:
                    line = {
                        "group": group_id,
                        "world": world,
                        "step": step,
                        "epoch": sampler.epoch,
                        "time": time.time(),
                    }
                    with open(record, "a") as f:
                        f.write(json.dumps(line | {"indices": indices.tolist()}) + "\n")
                time.sleep(args.pause)
                stop = guard.should_stop()
                if step % args.checkpoint_every == 0 or stop or step == args.steps:
                    save_checkpoint(step, args.checkpoint_dir, model, optimizer, sampler=sampler, keep_last=3)
                if rank == 0 and step % args.checkpoint_every == 0:
                    print(f"step {step} world size {world} loss {loss.item():.4f}", flush=True)
                if stop or step == args.steps:
                    if args.out and rank == 0 and step == args.steps:
                        torch.save(model.state_dict(), args.out)  # with the algorithm's state
                    return
            sampler.set_epoch(sampler.epoch + 1)


if __name__ == "__main__":
    main()
