"""Per-step time of Bagua's LowRankAlgorithm against torch DDP with powerSGD_hook, on 2 processes.

    PYTHONPATH=$PWD python benchmarks/low_rank_step.py [--ranks 1,2,4,8] [--widths 128,1024,1024,10]
        [--json results.json] [--smoke]

Run like this, the script is its own driver (benchmarks/_launch.py): it starts its 2 workers with
``python -m bagua_core.run --nproc-per-node 2 --no-prefix`` over loopback, and stops them on a
timeout or Ctrl-C. Gloo carries both systems' traffic.

Every configuration trains its own copy of the same MLP (Linear layers between consecutive
``--widths``; by default 128 -> 1024 -> 1024 -> 10, the time-to-accuracy benchmark's MLP, whose
1024x1024 and 1024x128 weights are compressed and whose biases and 10x1024 weight travel whole) from
the same initial weights on the same batches, with SGD (momentum 0.9), one torch thread per process:

    DDP+PowerSGD r    torch DDP, one bucket, ``powerSGD_hook`` with matrix_approximation_rank r
                      (error feedback, warm start, min_compression_rate 2: its defaults)
    Bagua LowRank r   ``model.with_bagua([opt], LowRankAlgorithm(rank=r, ...))``, the same settings
    no communication  each rank alone: what forward, backward and the optimizer cost

Both compress from step ``--start-iter`` on; the ``--warmup`` untimed steps go past it, so every
timed step is a compressed one. Then ``--rounds`` rounds each time ``--steps`` steps of every
configuration between two barriers, every other round in reverse order, so that the load of
others on a shared machine touches all configurations alike. The table shows the median ms per step
over rounds, the median over rounds of Bagua's time over the hook's in the same round, its middle
half (25th-75th percentile) over rounds, and each system's ms per step above "no communication"
(what compression and communication add).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import _launch  # benchmarks/_launch.py: the script is its own driver
from _training import Trainer, finish, quartiles, start_worker, timed_steps  # benchmarks/_training.py

COLLECTIVE_TIMEOUT_S = 120
NO_COMM = "no communication"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2,4,8", help="PowerSGD ranks to compare (default 1,2,4,8)")
    p.add_argument("--widths", default="128,1024,1024,10", help="the MLP's layer widths (default 128,1024,1024,10)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--start-iter", type=int, default=2, help="first compressed step (default 2; torch needs >= 2)")
    p.add_argument("--warmup", type=int, default=6, help="untimed steps of each configuration first (default 6)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per configuration per round (default 5)")
    p.add_argument("--rounds", type=int, default=30, help="rounds (default 30)")
    p.add_argument("--smoke", action="store_true", help="tiny MLP, ranks 1 and 2, 2 rounds of 2 steps")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--nproc", type=int, default=2, help="processes (driver mode only; default 2)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before the driver stops the run")
    args = p.parse_args(argv)
    if args.smoke:
        args.ranks, args.widths, args.batch_size = "1,2", "16,32,32,4", 4
        args.warmup, args.steps, args.rounds = 3, 2, 2
    try:
        args.ranks = tuple(int(r) for r in args.ranks.split(","))
        args.widths = tuple(int(w) for w in args.widths.split(","))
    except ValueError:
        p.error("--ranks and --widths are comma-separated integers")
    if len(args.widths) < 2 or min(args.widths + args.ranks) < 1:
        p.error("--widths needs two or more positive widths, --ranks positive ranks")
    if args.start_iter < 2 or args.warmup <= args.start_iter:
        p.error("--start-iter must be >= 2 (torch's hook requires it) and --warmup larger than --start-iter")
    if min(args.batch_size, args.steps, args.rounds) < 1:
        p.error("--batch-size, --steps and --rounds must be positive")
    return args


def names(rank):
    return f"DDP+PowerSGD {rank}", f"Bagua LowRank {rank}"


def build_model(widths):
    import torch.nn as nn

    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i + 2 < len(widths) else [])
    return nn.Sequential(*layers)


def make_batches(rank, batch_size, features, classes, n=8):
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    return [
        (torch.randn(batch_size, features, generator=g), torch.randint(0, classes, (batch_size,), generator=g))
        for _ in range(n)
    ]


def format_table(results, ranks):
    rows = [
        "| rank | DDP+powerSGD_hook ms/step | Bagua LowRank ms/step | Bagua / hook (time) "
        "| middle half of rounds | hook above no comm. | Bagua above no comm. |",
        "|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in ranks:
        torch_name, bagua_name = names(r)
        t, b = results[torch_name], results[bagua_name]
        q1, _, q3 = quartiles(b["ratio_rounds"])
        rows.append(
            f"| {r} | {t['ms_per_step']:.2f} | {b['ms_per_step']:.2f} | {b['ratio_to_hook']:.2f} "
            f"| {q1:.2f}-{q3:.2f} | {t['above_no_comm_ms']:.2f} | {b['above_no_comm_ms']:.2f} |"
        )
    return "\n".join(rows)


def work(argv) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    rank, world, say = start_worker(COLLECTIVE_TIMEOUT_S)
    widths = args.widths
    n_params = sum(p.numel() for p in build_model(widths).parameters())
    say(
        f"MLP {' -> '.join(map(str, widths))}: {n_params / 1e6:.2f} M parameters; world size {world}, batch "
        f"{args.batch_size} per rank; ranks {list(args.ranks)}, compressed from step {args.start_iter}; "
        f"{args.warmup} warm-up steps, then {args.rounds} rounds of {args.steps} timed steps; 1 torch thread per "
        f"process; load average {os.getloadavg()[0]:.2f}"
    )
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    batches = make_batches(rank, args.batch_size, widths[0], widths[-1])
    trainers = []
    try:
        configs = [(NO_COMM, NO_COMM, None)]
        for r in args.ranks:
            options = {"rank": r, "start_iter": args.start_iter}
            configs += [(label, base, options) for label, base in zip(names(r), ("DDP+PowerSGD", "Bagua LowRank"))]
        for label, base, options in configs:
            t = Trainer(base, lambda: build_model(widths), batches, args.warmup, options=options)
            t.label = label
            t.steps(args.warmup)
            trainers.append(t)
        per_round = {t.label: [] for t in trainers}
        for i in range(args.rounds):
            for t in trainers if i % 2 == 0 else trainers[::-1]:
                per_round[t.label].append(1e3 * timed_steps(t, args.steps, dist.barrier) / args.steps)
            if (i + 1) % max(1, args.rounds // 5) == 0 or i + 1 == args.rounds:
                say(
                    f"round {i + 1}/{args.rounds}, median ms/step so far: "
                    + ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in per_round.items())
                    + f" (load {os.getloadavg()[0]:.2f})"
                )
    finally:
        for t in trainers:
            t.close()
    total_s = time.perf_counter() - t_start
    load_after = os.getloadavg()

    results = {label: {"ms_per_step": statistics.median(v), "rounds": v} for label, v in per_round.items()}
    base = per_round[NO_COMM]
    for r in results.values():
        r["above_no_comm_ms"] = statistics.median(x - y for x, y in zip(r["rounds"], base))
    for rk in args.ranks:
        torch_name, bagua_name = names(rk)
        b = results[bagua_name]
        # Paired: each round's steps of both ran within a second of each other, under the same load.
        b["ratio_rounds"] = [x / y for x, y in zip(b["rounds"], results[torch_name]["rounds"])]
        b["ratio_to_hook"] = statistics.median(b["ratio_rounds"])
    if rank == 0:
        print()
        print(format_table(results, args.ranks))
        print(
            f"\n(ms per step: median over {args.rounds} rounds of {args.steps} steps; Bagua / hook: median of the "
            f"per-round ratios of step times, < 1 means Bagua is faster; no communication: "
            f"{results[NO_COMM]['ms_per_step']:.2f} ms/step; {total_s:.0f} s in all; "
            f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f})",
            flush=True,
        )
    doc = {
        "results": results,
        "ranks": list(args.ranks),
        "widths": list(widths),
        "parameters": n_params,
        "world_size": world,
        "batch_size": args.batch_size,
        "start_iter": args.start_iter,
        "warmup": args.warmup,
        "steps": args.steps,
        "rounds": args.rounds,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "seconds": total_s,
    }
    return finish(rank, args.json, doc)


if __name__ == "__main__":
    sys.exit(_launch.main(__file__, work, parse_args))
