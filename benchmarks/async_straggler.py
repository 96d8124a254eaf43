"""Asynchronous model average with a straggler: each rank's own samples/s,
against torch DDP (gloo) and training alone, with and without one rank slowed.

    PYTHONPATH=$PWD python benchmarks/async_straggler.py [--slow-ms 200] [--json results.json] [--smoke]

The script is its own driver (``python -m bagua_core.run --nproc-per-node 2
--no-prefix``; see benchmarks/_launch.py). Every configuration trains the
model of benchmarks/train_throughput.py (VGG-like, 6.7 M parameters by
default) from the same weights with SGD, one configuration after the other,
in the same processes:

    DDP                   torch DistributedDataParallel over gloo: every step waits for every rank
    Bagua Async           AsyncModelAverageAlgorithm(sync_interval_ms=--interval-ms): weights averaged
                          by the engine's background loop while each rank trains at its own pace
                          (aborted after the timed steps, outside the timing)
    no communication      each rank trains alone

each twice: every rank at full speed, then with rank ``--slow-rank`` sleeping
``--slow-ms`` after each of its steps (a straggler). Each rank times its own
``--steps`` steps (after ``--warmup`` untimed ones), without barriers in
between, and reports its own samples/s. With a straggler DDP runs every rank
at the straggler's pace; asynchronous model average keeps the other ranks at
their own speed. On a shared machine the load changes between
configurations; the last column, measured within one run, is the robust one:
DDP holds every rank at 1.0x.
"""

from __future__ import annotations

import argparse
import sys
import time

import _launch  # benchmarks/_launch.py: the script is its own driver
from _training import finish, start_worker  # benchmarks/_training.py

CONFIGS = ("DDP", "Bagua Async", "no communication")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step (default 16)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per rank per configuration (default 40)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--channels", default="32,64,128,256", help="conv widths (as train_throughput.py)")
    p.add_argument("--hidden", type=int, default=2048, help="width of the hidden dense layers")
    p.add_argument("--interval-ms", type=int, default=500, help="Bagua Async's sync_interval_ms (default 500)")
    p.add_argument("--slow-rank", type=int, default=1, help="the rank slowed down (default 1)")
    p.add_argument("--slow-ms", type=float, default=200.0, help="its sleep after each step (default 200 ms)")
    p.add_argument("--smoke", action="store_true", help="tiny model, few steps")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--nproc", type=int, default=2, help="processes (driver mode only; default 2)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before the driver stops the run")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_size, args.steps, args.warmup, args.channels, args.hidden = 4, 6, 1, "8,16", 32
        args.slow_ms, args.interval_ms = min(args.slow_ms, 50.0), min(args.interval_ms, 20)
    args.channels = tuple(int(c) for c in args.channels.split(","))
    if min(args.batch_size, args.steps, args.hidden, *args.channels) < 1 or args.warmup < 0 or args.slow_ms < 0:
        p.error("sizes and counts must be positive (warm-up and slow-ms >= 0)")
    if args.interval_ms < 0:
        p.error("--interval-ms must be >= 0")
    return args


def run(name, args, batches, rank, slow_ms):
    """This rank's samples/s over the timed steps of configuration ``name``."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from train_throughput import build_model

    torch.manual_seed(0)
    model = build_model(args.channels, args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    net, algo = model, None
    if name == "DDP":
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model)
    elif name == "Bagua Async":
        from bagua_torch.algorithms import AsyncModelAverageAlgorithm

        algo = AsyncModelAverageAlgorithm(sync_interval_ms=args.interval_ms)
        net = model.with_bagua([opt], algo)
    sleep_s = slow_ms / 1000.0 if rank == args.slow_rank else 0.0

    def steps(n, i0):
        for i in range(i0, i0 + n):
            x, y = batches[i % len(batches)]
            F.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
            if sleep_s:
                time.sleep(sleep_s)

    steps(args.warmup, 0)
    dist.barrier()
    t0 = time.perf_counter()
    steps(args.steps, args.warmup)
    elapsed = time.perf_counter() - t0
    rounds = None
    if algo is not None:
        rounds = model.bagua_ddp.averager.rounds
        algo.abort(net)  # after the timing: the last round, the same weights everywhere
        model.bagua_ddp.close()
    dist.barrier()
    return args.steps * args.batch_size / elapsed, rounds


def work(argv) -> int:
    args = parse_args(argv)
    import torch.distributed as dist
    from train_throughput import make_batches

    rank, world, _ = start_worker(120)
    if not 0 <= args.slow_rank < world:
        raise SystemExit(f"--slow-rank {args.slow_rank} is not a rank of {world}")
    batches = make_batches(rank, args.batch_size)
    results = {}
    for slow_ms in (0.0, args.slow_ms):
        for name in CONFIGS:
            speed, rounds = run(name, args, batches, rank, slow_ms)
            every = [None] * world
            dist.all_gather_object(every, (speed, rounds))
            results[(name, slow_ms)] = every
            if rank == 0:
                print(
                    f"{name:<18} slow rank {args.slow_rank} +{slow_ms:.0f} ms/step: samples/s per rank "
                    + ", ".join(f"{s:.1f}" for s, _ in every)
                    + ("" if rounds is None else f" (background rounds per rank: {[r for _, r in every]})"),
                    flush=True,
                )
    if rank == 0:
        print()
        print(
            "| configuration | straggler | "
            + " | ".join(f"rank {r} samples/s" for r in range(world))
            + " | fast ranks vs no straggler | fast ranks / slow rank |"
        )
        print("|---|---|" + "---:|" * world + "---:|---:|")
        for name in CONFIGS:
            base = results[(name, 0.0)]
            for slow_ms in (0.0, args.slow_ms):
                every = results[(name, slow_ms)]
                fast = [r for r in range(world) if r != args.slow_rank]
                ratio = sum(every[r][0] / base[r][0] for r in fast) / len(fast)
                vs_slow = sum(every[r][0] for r in fast) / len(fast) / every[args.slow_rank][0]
                label = "none" if slow_ms == 0 else f"rank {args.slow_rank} +{slow_ms:.0f} ms/step"
                print(
                    f"| {name} | {label} | "
                    + " | ".join(f"{s:.1f}" for s, _ in every)
                    + f" | {ratio:.2f}x | {vs_slow:.2f}x |"
                )
        print(
            f"\n(each rank's own samples/s over {args.steps} steps of batch {args.batch_size}; "
            f"Bagua Async sync_interval_ms={args.interval_ms})",
            flush=True,
        )
    doc = {
        "results": [
            {"config": n, "slow_ms": s, "per_rank": [{"samples_per_s": v, "rounds": r} for v, r in every]}
            for (n, s), every in results.items()
        ],
        "slow_rank": args.slow_rank,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "interval_ms": args.interval_ms,
        "channels": list(args.channels),
        "hidden": args.hidden,
    }
    return finish(rank, args.json, doc)


if __name__ == "__main__":
    sys.exit(_launch.main(__file__, work, parse_args))
