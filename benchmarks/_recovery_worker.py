"""One replica of benchmarks/recovery.py: trains an MLP on a fixed synthetic
batch until it is killed, through Bagua's live jobs (``bagua``: bagua_torch.live)
or torchft (``torchft``: its Manager with FT-DDP, or its DiLoCo), and appends
to its record file one line at its start and one per committed step:
``{"event": "start"|"step", "t": time.time(), "step", "world", "quorum"}``
(``quorum``: the membership's number, Bagua's generation or torchft's quorum
id, read from its Manager's private ``_quorum_id``: it has no public one).

Run by the driver under an agent per replica (bagua-run for Bagua, torchrun
for torchft, each the system's own launcher), with BAGUA_LIGHTHOUSE or
TORCHFT_LIGHTHOUSE set.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch

SYNC_EVERY = 8  # local steps / DiLoCo: inner steps per outer exchange


def _model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )  # fmt: skip


def _batch(batch: int):
    g = torch.Generator().manual_seed(int(os.environ.get("REPLICA", "0")))
    return torch.randn(batch, 256, generator=g), torch.randint(0, 10, (batch,), generator=g)


class _Record:
    def __init__(self, path: str):
        self._f = open(path, "a", buffering=1)

    def __call__(self, event: str, **fields) -> None:
        self._f.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


def bagua(args, record: _Record) -> None:
    from bagua_torch.algorithms import Algorithm
    from bagua_torch.checkpoint import save_checkpoint
    from bagua_torch.live import LiveTraining

    model = _model(args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hyper = {"sync_interval": SYNC_EVERY} if args.algorithm == "local_steps" else {}
    live = LiveTraining(model, [optimizer], Algorithm.init(args.algorithm, **hyper), timeout_s=30)
    x, y = _batch(args.batch)
    while True:
        with live.attempt():
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if args.checkpoint_every and (live.step + 1) % args.checkpoint_every == 0:  # every rank: collective
                save_checkpoint(live.step + 1, args.checkpoint_dir, model, optimizer, keep_last=2)
        record("step", step=live.step, world=live.world_size, quorum=live.generation)


def torchft(args, record: _Record) -> None:
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    model = _model(args.width)
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)

    def state_dict():
        return {"model": model.state_dict(), "inner": inner.state_dict(), "outer": outer.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        outer.load_state_dict(sd["outer"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"replica_{os.environ['REPLICA']}",
        use_async_quorum=args.algorithm == "gradient_allreduce",  # DiLoCo requires a synchronous quorum
        timeout=timedelta(seconds=10),
    )
    x, y = _batch(args.batch)
    if args.algorithm == "gradient_allreduce":  # FT-DDP
        ddp, optimizer = DistributedDataParallel(manager, model), Optimizer(manager, inner)
        while True:
            optimizer.zero_grad()  # starts the quorum
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            before = manager.current_step()
            optimizer.step()  # applied when every participant commits; the step counter then moves
            if manager.current_step() > before:
                record("step", step=manager.current_step(), world=manager.num_participants(), quorum=manager._quorum_id)
    with DiLoCo(manager, [model], inner, outer, sync_every=SYNC_EVERY, pin_memory=False):
        while True:
            inner.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            inner.step()  # DiLoCo's hook: every SYNC_EVERY steps, the outer exchange
            record("step", step=manager.current_step(), world=manager.num_participants(), quorum=manager._quorum_id)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--system", choices=["bagua", "torchft"], required=True)
    p.add_argument("--algorithm", choices=["gradient_allreduce", "local_steps"], required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    record = _Record(args.record)
    record("start", pid=os.getpid())
    (bagua if args.system == "bagua" else torchft)(args, record)


if __name__ == "__main__":
    main()
