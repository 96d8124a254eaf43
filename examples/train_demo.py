"""Train a small classifier data-parallel with Bagua's algorithms.

    bagua-run --nproc-per-node 2 examples/train_demo.py --algorithm all

(or torchrun). The data is synthetic (Gaussian clusters drawn from a fixed
seed: nothing to download); each rank trains on its own shard. Rank 0 shows a
progress bar per epoch and, at the end, a table of the final loss, the
held-out accuracy and the throughput of each algorithm.
"""

import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F

import bagua_torch
from bagua_torch.algorithms import Algorithm, QAdamAlgorithm, QAdamOptimizer

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
    g = torch.Generator().manual_seed(1234)  # the same cluster centres for every split
    centres = torch.randn(classes, features, generator=g) * 0.5
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = centres[y] + torch.randn(n, features, generator=g)
    return x, y


def make_model(features, classes):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(features, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, classes),
    )


class ProgressBar:
    """A plain-text bar: redrawn in place on a terminal, one line per epoch
    otherwise (e.g. under bagua-run, which forwards whole lines)."""

    def __init__(self, label, total, enabled, width=30):
        self.label, self.total, self.enabled, self.width = label, total, enabled, width
        self.live = enabled and sys.stdout.isatty()
        self.start = time.perf_counter()

    def _line(self, done, loss):
        filled = int(self.width * done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label} [{bar}] {done:>4}/{self.total} loss {loss:.4f} {time.perf_counter() - self.start:5.1f}s"

    def update(self, done, loss):
        if self.live and (done == self.total or done % max(1, self.total // 50) == 0):
            print("\r" + self._line(done, loss), end="", flush=True)

    def close(self, loss):
        if self.enabled:
            print(("\r" if self.live else "") + self._line(self.total, loss), flush=True)


def train(name, args, data, test, rank, world):
    x, y = data
    model = make_model(args.features, args.classes)
    if name == "qadam":  # QAdam communicates its own optimizer's momentum
        # eps bounds m / sqrt(v) where the frozen second moment is tiny: there
        # the 8-bit momentum's quantisation noise would otherwise make huge steps
        opt = QAdamOptimizer(model.parameters(), lr=args.lr / 20, warmup_steps=100, eps=1e-3)
        algorithm = QAdamAlgorithm(opt)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        algorithm = Algorithm.init(name, **DEMO_SETTINGS.get(name, {}))
    model = model.with_bagua([opt], algorithm)

    steps = math.ceil(x.shape[0] / args.batch_size)
    order = torch.Generator().manual_seed(rank)
    samples = 0
    bagua_torch.barrier()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        bar = ProgressBar(f"{name:<18} epoch {epoch + 1}/{args.epochs}", steps, enabled=rank == 0)
        perm = torch.randperm(x.shape[0], generator=order)
        running = torch.zeros(2)  # loss sum, batches
        for i in range(steps):
            idx = perm[i * args.batch_size : (i + 1) * args.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            running += torch.tensor([loss.item(), 1.0])
            samples += idx.numel()
            bar.update(i + 1, running[0].item() / running[1].item())
        bagua_torch.allreduce_inplace(running)  # the epoch's mean loss over every rank
        bar.close(running[0].item() / running[1].item())
    if name == "async":
        algorithm.abort(model)  # the same weights on every rank before evaluating
    bagua_torch.barrier()
    elapsed = time.perf_counter() - start

    with torch.no_grad():
        tx, ty = test
        accuracy = (model(tx).argmax(1) == ty).float().mean().item()
    model.bagua_ddp.close()  # the next algorithm wraps a fresh model
    return {
        "loss": running[0].item() / running[1].item(),
        "accuracy": accuracy,
        "samples_per_s": samples * world / elapsed,
    }


def main():
    args = parse_args()
    torch.set_num_threads(1)
    group = bagua_torch.init_process_group()
    rank, world = group.rank, group.size
    per_rank = args.samples // world
    data = make_data(per_rank, args.features, args.classes, seed=rank + 1)
    test = make_data(2048, args.features, args.classes, seed=0)
    names = ALGORITHMS if args.algorithm == "all" else [args.algorithm]
    if rank == 0:
        print(
            f"{world} processes, {per_rank} samples each, batch {args.batch_size} per rank, {args.epochs} epochs",
            flush=True,
        )

    results = {name: train(name, args, data, test, rank, world) for name in names}

    if rank == 0:
        print()
        print(f"{'algorithm':<20}{'final loss':>12}{'accuracy':>10}{'samples/s':>12}")
        for name, r in results.items():
            print(f"{name:<20}{r['loss']:>12.4f}{r['accuracy']:>9.1%}{r['samples_per_s']:>12.0f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
