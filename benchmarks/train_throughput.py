"""Training throughput: Bagua's algorithms against torch DDP (gloo), on 2 processes.

    PYTHONPATH=$PWD python benchmarks/train_throughput.py [--json results.json] [--smoke]

Run like this, the script is its own driver: it starts the workers with
``python -m bagua_core.run --nproc-per-node 2 --no-prefix`` (so nothing is left
behind: on a timeout or Ctrl-C the launcher is stopped, and it stops the
workers). The workers can also be launched directly with the same arguments:

    PYTHONPATH=$PWD python -m bagua_core.run --nproc-per-node 2 --no-prefix \\
        benchmarks/train_throughput.py [--json results.json]

Every configuration trains the same model (a VGG-like convolutional network
with BatchNorm on 32x32 synthetic images, 6.7 M parameters by default),
from the same initial weights, with the same batches (each rank its own) and
SGD with momentum, in the same processes:

    DDP                   torch DistributedDataParallel over gloo (defaults: 1 MiB first bucket,
                          then 25 MiB buckets)
    DDP+fp16              the same with ``fp16_compress_hook``
    DDP+PowerSGD          the same with ``powerSGD_hook`` (rank 1, error feedback, warm start,
                          from step 2), in ONE bucket: with several buckets torch's hook
                          deadlocks or mismatches collectives over gloo (see _training.py)
    Bagua GradientAllReduce, Bagua ByteGrad, Bagua Decentralized
                          ``model.with_bagua([opt], Algorithm())`` with the original defaults
                          (10 MiB buckets; the environment variable BAGUA_BUCKET_SIZE, in
                          bytes, changes that)
    Bagua ByteGrad+EF     ByteGradAlgorithm(error_feedback=True)
    Bagua LowPrecisionDecentralized
                          the same (after the optimizer step, 8-bit differences on a ring)
    Bagua LowRank         LowRankAlgorithm(rank=1, start_iter=2): PowerSGD as the hook above
    Bagua LocalSteps, Bagua LocalSteps+8bit
                          LocalStepsAlgorithm() (weights synchronised every 8 steps), and with
                          compression="minmax_uint8", error_feedback=True
    Bagua QAdam           QAdamOptimizer (Adam, lr 1e-3, eps 1e-3) with QAdamAlgorithm(); its warm-up lasts
                          the untimed steps, so the timed ones communicate compressed momentum
    Bagua Async           AsyncModelAverageAlgorithm() (weights averaged every 500 ms by the engine's
                          background loop). Its loop runs only in its own timed windows (abort()
                          after each, resume() before, untimed): its weight lock keeps its rounds
                          out of its own steps, so a loop left running did its averaging inside
                          the OTHER configurations' windows (measured: 68 of 75 rounds), which
                          made it look faster than "no communication". Each window lasts at least
                          --steps steps and until one round has completed (one pause + round
                          period); every step ends with the ranks agreeing whether to go on (a
                          4-byte allreduce), as every other window ends with a barrier. See
                          benchmarks/async_straggler.py for each rank's own speed with a straggler
    Bagua GradientAllReduce 25MiB
                          the same through ``bagua_torch.DistributedDataParallel`` with
                          ``bucket_cap_mb=25``, DDP's bucket size
    <Bagua config> 1 lane  any Bagua configuration but Async with one engine lane
                          (``BAGUA_ENGINE_LANES=1``: consecutive buckets one after the other)
                          instead of the default two; not in the default list
    no communication      each rank trains alone: the compute-only upper bound, which shows
                          how much of a step communication costs

All the models live side by side in each process. Each configuration first
runs ``--warmup`` untimed steps (DDP rebuilds its buckets after the first
step, PowerSGD compresses from step 2 on). Then ``--rounds`` rounds each time
``--steps`` steps (default 1) of every configuration, between two barriers,
every other round in reverse order. Interleaving this finely matters on a
shared machine: the load of others changes within seconds, and then touches
all configurations alike. The table shows the median over rounds of
samples/s (samples of both ranks), the median over rounds of the ratio to
DDP's samples/s in the same round, and the middle half of the rounds
(25th-75th percentile of samples/s).

Each process uses one torch thread (``torch.set_num_threads(1)``): 2 processes
on 2 cores. Communication runs on the frameworks' own threads (gloo's for DDP,
the engine's comm threads, one per lane, for Bagua).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import _launch  # benchmarks/_launch.py: the script is its own driver
from _training import (  # benchmarks/_training.py
    Trainer,
    finish,
    parse_configs,
    quartiles,
    start_worker,
    timed_async_window,
    timed_steps,
)

CONFIGS = (
    "DDP",
    "DDP+fp16",
    "DDP+PowerSGD",
    "Bagua GradientAllReduce",
    "Bagua GradientAllReduce 25MiB",
    "Bagua ByteGrad",
    "Bagua ByteGrad+EF",
    "Bagua Decentralized",
    "Bagua LowPrecisionDecentralized",
    "Bagua QAdam",
    "Bagua LowRank",
    "Bagua LocalSteps",
    "Bagua LocalSteps+8bit",
    "Bagua Async",
    "no communication",
)
BASELINE = "DDP"
COLLECTIVE_TIMEOUT_S = 120


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step (default 16)")
    p.add_argument("--steps", type=int, default=1, help="timed steps per configuration per round (default 1)")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps of each configuration first (default 4)")
    p.add_argument("--rounds", type=int, default=120, help="rounds (default 120)")
    p.add_argument("--channels", default="32,64,128,256", help="conv widths, one 2x2 pooling after each")
    p.add_argument("--hidden", type=int, default=2048, help="width of the two hidden dense layers")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 warm-up step, 2 rounds of 1 timed step")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--nproc", type=int, default=2, help="processes (driver mode only; default 2)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before the driver stops the run")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_size, args.steps, args.warmup, args.rounds = 4, 1, 1, 2
        args.channels, args.hidden = "8,16", 32
    args.channels = tuple(int(c) for c in args.channels.split(","))
    args.configs = parse_configs(p, args.configs, CONFIGS, BASELINE)
    if min(args.batch_size, args.steps, args.rounds, args.hidden, *args.channels) < 1 or args.warmup < 0:
        p.error("sizes and counts must be positive (warm-up >= 0)")
    if 32 >> len(args.channels) < 1:
        p.error("at most 5 conv layers (32x32 inputs, one pooling after each)")
    return args


# ---------------------------------------------------------------- worker ---


def build_model(channels, hidden, classes=10):
    import torch.nn as nn

    layers, c_in = [], 3
    for c in channels:
        layers += [
            nn.Conv2d(c_in, c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        ]
        c_in = c
    side = 32 >> len(channels)
    layers += [
        nn.Flatten(),
        nn.Linear(c_in * side * side, hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, classes),
    ]
    return nn.Sequential(*layers)


def make_batches(rank, batch_size, n=16, classes=10):
    """A few fixed synthetic batches per rank (cycled): the same data for every configuration."""
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    return [
        (torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, classes, (batch_size,), generator=g))
        for _ in range(n)
    ]


def format_table(results, configs):
    rows = [
        "| configuration | samples/s | ratio to DDP | middle half of rounds (samples/s) | last loss |",
        "|---|---:|---:|---|---:|",
    ]
    for name in configs:
        r = results[name]
        q1, _, q3 = quartiles(r["rounds"])
        rows.append(
            f"| {name} | {r['samples_per_s']:.1f} | {r['ratio_to_ddp']:.2f}x | {q1:.0f}-{q3:.0f} | {r['loss']:.3f} |"
        )
    return "\n".join(rows)


def work(argv) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    rank, world, say = start_worker(COLLECTIVE_TIMEOUT_S, bagua=any(c.startswith("Bagua") for c in args.configs))
    samples = args.steps * args.batch_size * world

    n_params = sum(p.numel() for p in build_model(args.channels, args.hidden).parameters())
    say(
        f"model: VGG-like, channels {list(args.channels)}, hidden {args.hidden}: {n_params / 1e6:.2f} M parameters "
        f"({n_params * 4 / 2**20:.1f} MiB of float32 gradients); world size {world}, batch {args.batch_size} per rank; "
        f"{args.warmup} warm-up steps, then {args.rounds} round(s) of {args.steps} timed steps per configuration; "
        f"1 torch thread per process"
    )
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    batches = make_batches(rank, args.batch_size)
    trainers = []
    try:
        for name in args.configs:
            trainers.append(Trainer(name, lambda: build_model(args.channels, args.hidden), batches, args.warmup))
            trainers[-1].steps(args.warmup)
            if name == "Bagua Async":
                trainers[-1].net.bagua_ddp.impl.abort()  # its loop runs in its own windows only

        def all_agree(flag):
            t = torch.tensor([int(flag)])
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            return bool(t.item())

        per_round = {name: [] for name in args.configs}
        async_window_steps = []
        for r in range(args.rounds):
            order = trainers if r % 2 == 0 else trainers[::-1]
            for t in order:
                if t.name == "Bagua Async":
                    n, seconds = timed_async_window(t, args.steps, dist.barrier, all_agree)
                    per_round[t.name].append(n * args.batch_size * world / seconds)
                    async_window_steps.append(n)
                else:
                    per_round[t.name].append(samples / timed_steps(t, args.steps, dist.barrier))
            if (r + 1) % max(1, args.rounds // 10) == 0 or r + 1 == args.rounds:
                say(
                    f"round {r + 1}/{args.rounds}, median samples/s so far: "
                    + ", ".join(f"{n} {statistics.median(v):.0f}" for n, v in per_round.items())
                    + f" (load {os.getloadavg()[0]:.2f})"
                )
        if async_window_steps:
            say(
                f"Bagua Async: {statistics.mean(async_window_steps):.1f} steps per timed window, each holding one "
                f"averaging round or more"
            )
        from bagua_core import _C

        packing = _C.wire_packing_totals()  # BAGUA_WIRE_PACKING: allreduces that left Gloo's ring
        say(
            f"wire packing (rank 0, whole run): {packing['packed_messages']} messages packed, "
            f"{packing['raw_messages']} raw"
        )
    finally:
        for t in trainers:
            t.close()
    total_s = time.perf_counter() - t_start
    load_after = os.getloadavg()

    results = {
        t.name: {"samples_per_s": statistics.median(per_round[t.name]), "rounds": per_round[t.name], "loss": t.loss}
        for t in trainers
    }
    if async_window_steps:
        results["Bagua Async"]["steps_per_window"] = async_window_steps
    base = results[BASELINE]
    for r in results.values():
        # Paired: each round's steps ran within about a second of each other, under the same load.
        r["ratio_to_ddp"] = statistics.median(x / y for x, y in zip(r["rounds"], base["rounds"]))
        r["ratio_of_medians"] = r["samples_per_s"] / base["samples_per_s"]
    if rank == 0:
        print()
        print(format_table(results, args.configs))
        print(
            f"\n(samples/s of both ranks, median over {args.rounds} rounds of {args.steps} step(s); ratio: median of "
            f"the per-round ratios; {total_s:.0f} s in all; "
            f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f})",
            flush=True,
        )
    doc = {
        "results": results,
        "configs": list(args.configs),
        "world_size": world,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "channels": list(args.channels),
        "hidden": args.hidden,
        "parameters": n_params,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "seconds": total_s,
    }
    return finish(rank, args.json, doc)


if __name__ == "__main__":
    sys.exit(_launch.main(__file__, work, parse_args))
