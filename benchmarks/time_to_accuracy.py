"""Time to accuracy on emulated slow links: how long each data-parallel method takes to reach a
held-out validation target, every method tuned with the same budget, with the bytes it put on the
wire counted.

    sudo PYTHONPATH=$PWD .venv/bin/python benchmarks/time_to_accuracy.py            # the full matrix
    sudo PYTHONPATH=$PWD .venv/bin/python benchmarks/time_to_accuracy.py --quick    # what make bench runs
    PYTHONPATH=$PWD .venv/bin/python benchmarks/time_to_accuracy.py --smoke --no-shaping   # CI, no root
    options: --workloads mlp,cnn,lm --tracks sgd,adamw --hosts 2,4 --links 100mbit,1gbit,10gbit,100mbit+5ms
             --methods ... --seeds 3 --time-budget 60 --tune-trials 12 --tune-seconds 10 --out-dir tta_results

Matrix. Workloads (benchmarks/_workloads.py, CPU-sized, one torch thread per process): ``mlp``
(128 -> 1024 -> 1024 -> 10, 1.2 M parameters, labels of a random teacher network), ``cnn`` (two
conv layers, 0.15 M parameters, noisy shifted class templates, 3x16x16), ``lm`` (a 2-layer causal
transformer, 0.28 M parameters, an order-2 Markov corpus; the metric is next-token accuracy on
held-out sequences). Two tracks:

    sgd    SGD with momentum 0.9: DDP, DDP+fp16, DDP+PowerSGD (torch's hooks over gloo), Bagua
           GradientAllReduce, HalfGrad, ByteGrad, ByteGrad+EF (error feedback), Decentralized,
           LowPrecisionDecentralized, LowRank, LocalSteps, LocalSteps+8bit, LocalAvg+8bit
    adamw  AdamW (weight decay --weight-decay): DDP, DDP+PowerSGD, Bagua GradientAllReduce, HalfGrad,
           ByteGrad+EF, QAdam (QAdamOptimizer: Adam with frozen second moments, no weight decay),
           LowRank, LocalSteps, LocalSteps+8bit and LocalAvg+8bit (AdamW inside)

Bagua LocalSteps is LocalStepsAlgorithm(sync_interval=H, outer_lr=0.7, outer_momentum=0.9,
nesterov=True, warmup_steps=0) (DiLoCo's outer optimizer); LocalSteps+8bit adds
compression="minmax_uint8", error_feedback=True (the pseudo-gradient averaged in 8 bits, its residual
fed back); LocalAvg+8bit is LocalSteps+8bit with plain averaging (outer_lr=1, outer_momentum=0:
post-local SGD). A method whose algorithm (or argument) this checkout lacks, such as
ByteGradAlgorithm(error_feedback=True) or LowRankAlgorithm before they are merged, is skipped with a
one-line notice, printed and in the JSON. Hosts: 2 and 4 emulated hosts, one process each (network
namespaces; 4 hosts hang off a bridge, see benchmarks/_hosts.py), each link shaped with tc tbf to
100 Mbit/s, 1 Gbit/s, 10 Gbit/s each way, and 100 Mbit/s with a 5 ms one-way delay: netem where
the kernel has it; where it has not (this machine's: CONFIG_NET_SCH_NETEM is not set), the user-space
delay line of benchmarks/_delay_line.py (TUN devices, MTU 9000; measured here: 10.5-10.8 ms round
trip, 105 Mbit/s of TCP). The JSON says which.

Fairness. Every method trains the same model from the same initial weights (set by the seed) on
the same global batch (split over the ranks) in the same order (a permutation per epoch, drawn
from the seed), with the same schedule: a linear learning-rate warm-up over --lr-warmup-steps, then
constant. Tuning, per method, workload, track, host count and link, with seed 0 (the measured seeds
are 1, 2, 3): exactly --tune-trials trials of --tune-seconds each (at most --tune-max-steps steps),
scored by the validation metric at their end:
  1. the track's learning-rate grid (--lr-grid-sgd / --lr-grid-adamw), the method's other settings
     at the middle of their grid;
  2. at the best learning rate, the method's own grid: DDP+PowerSGD and Bagua LowRank rank
     (--powersgd-ranks, --lowrank-ranks) x start iteration (--powersgd-starts), LocalSteps H
     (--local-steps-h), QAdam warm-up steps (--qadam-warmups); an evenly spaced part of it when it is
     larger than the trials left;
  3. the trials left: learning rates between the grid's, around the best so far (bisecting in log
     space). A method with nothing but a learning rate to tune spends its whole budget on it.
The chosen settings are in the table and the JSON (with every trial's score).

Measured runs: each tuned method, each seed, until --time-budget seconds of training (or
--max-steps). Seeds are the outer loop and the methods' order alternates from seed to seed, so the
machine's changing load touches all alike. The clock starts before the model is wrapped (so the
wrapper's setup, the first steps and any warm-up phase count) and stops only while evaluating:
every --eval-every steps the ranks meet (inside the clock: the slowest rank's time counts), the
clock stops, each rank evaluates its own replica on its share of the validation set, the counts are
summed over ranks, and the clock starts again.

What is reported, per workload, track, host count and link:
  target        --target-fraction (0.99) of tuned DDP's best validation metric (the median over the
                seeds of each run's best), on that link;
  time to target the median over the seeds of the first evaluation at or above the target (a seed
                that never gets there counts as infinitely slow: with 2 of 3 such, "not reached");
                resolution: one evaluation interval;
  x DDP+PowerSGD, x DDP   their median time to target over this method's (> 1: faster than them);
  metric at T   the median over the seeds of the last validation metric at or before --time-budget;
  bytes/step    counted, not estimated: each host reads its veth's tx_bytes
                (/sys/class/net/<veth>/statistics/tx_bytes inside its namespace) whenever the clock
                starts and stops; the bytes sent while the clock ran, summed over hosts, divided by
                the steps (so the one-off broadcast, the warm-up phases and the ranks' meeting before
                each evaluation are in; evaluation traffic is not). Over loopback (--no-shaping)
                they are not counted, and the table and JSON say so.

Presets (times on this 2-core machine, estimated from the budgets: the script prints its own
estimate first; evaluations and process starts add about a third):
  default  3 workloads x 2 tracks (15 methods) x 2 and 4 hosts x 4 links, 3 seeds, 12 tuning
           trials of 10 s, 60 s budget: about 5 h per host count and link, so about 40 h
  --quick  the mlp workload, both tracks, 2 hosts, 100 Mbit/s, 3 seeds, 5 trials of 4 s (3
           learning rates, 2 further settings), 20 s budget: about 27 minutes (what make bench runs)
  --smoke  tiny models, 2 hosts, at most 8 steps per run, 3 trials (2 learning rates and one more)
           and 3 seeds: under a minute; unshaped (over loopback) when shaping is not possible
Every option can be given beside a preset and overrides it.

Outputs in --out-dir: time_to_accuracy.json (the plan, every trial, every run's curve of (seconds,
steps, metric, loss), bytes, notices, the machine's load), time_to_accuracy.md (the summary table,
also printed), time_to_accuracy_sgd.png and time_to_accuracy_adamw.png (validation metric against
wall-clock seconds, one line per method and seed, one panel per workload, host count and link).
The namespaces are removed whatever happens (see benchmarks/bandwidth.py; --cleanup removes what a
SIGKILLed run left).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import secrets
import statistics
import sys
import time

import _hosts  # benchmarks/_hosts.py: namespaces, bridge, veth, tc
import _launch  # benchmarks/_launch.py: launchers, signals, timeouts
import _report  # benchmarks/_report.py: load, JSON, table, plots
import _training  # benchmarks/_training.py: wrap() and the configurations
import _workloads  # benchmarks/_workloads.py: the tasks

TRACKS = {
    "sgd": (
        "DDP",
        "DDP+fp16",
        "DDP+PowerSGD",
        "Bagua GradientAllReduce",
        "Bagua HalfGrad",
        "Bagua ByteGrad",
        "Bagua ByteGrad+EF",
        "Bagua Decentralized",
        "Bagua LowPrecisionDecentralized",
        "Bagua LowRank",
        "Bagua LocalSteps",
        "Bagua LocalSteps+8bit",
        "Bagua LocalAvg+8bit",
    ),
    "adamw": (
        "DDP",
        "DDP+PowerSGD",
        "Bagua GradientAllReduce",
        "Bagua HalfGrad",
        "Bagua ByteGrad+EF",
        "Bagua QAdam",
        "Bagua LowRank",
        "Bagua LocalSteps",
        "Bagua LocalSteps+8bit",
        "Bagua LocalAvg+8bit",
    ),
}
METHODS = tuple(dict.fromkeys(m for ms in TRACKS.values() for m in ms))
BASELINE, POWERSGD = "DDP", "DDP+PowerSGD"
LOCAL_STEPS_FIXED = {"warmup_steps": 0}  # the outer optimizer: _training.FIXED_OPTIONS
DEFAULT_LINKS = "100mbit,1gbit,10gbit,100mbit+5ms"
UNSHAPED = "loopback (unshaped)"
PARTIAL_PREFIX = "partial-"  # a launch's results while it runs (removed once time_to_accuracy.json is written)
NOT_COUNTED = "not counted: unshaped run over loopback (no veth of its own to count on)"
TUNING_SEED = 0
MASTER_PORT = 29500  # inside a fresh namespace every port is free
COLLECTIVE_TIMEOUT_S = 300
OVERHEAD = 1.35  # evaluations, wrapping and process starts on top of the budgets, for the estimate

PRESETS = {
    "quick": dict(
        workloads="mlp",
        hosts="2",
        links="100mbit",
        tune_trials=5,
        tune_seconds=4.0,
        time_budget=20.0,
        lr_grid_sgd="0.1,0.03,0.01",
        lr_grid_adamw="3e-3,1e-3,3e-4",
        eval_every=10,
    ),
    "smoke": dict(
        workloads="mlp",
        hosts="2",
        links="100mbit",
        seeds=3,
        tune_trials=3,
        tune_seconds=10.0,
        tune_max_steps=4,
        time_budget=20.0,
        max_steps=8,
        eval_every=2,
        lr_warmup_steps=2,
        lr_grid_sgd="0.1,0.03",
        lr_grid_adamw="3e-3,1e-3",
        powersgd_starts="2",
        qadam_warmups="2,4",
        local_steps_h="2,4",
    ),
}
DEFAULTS = dict(
    workloads=",".join(_workloads.WORKLOADS),
    tracks="sgd,adamw",
    hosts="2,4",
    links=DEFAULT_LINKS,
    methods=",".join(METHODS),
    seeds=3,
    tune_trials=12,
    tune_seconds=10.0,
    tune_max_steps=100000,
    time_budget=60.0,
    max_steps=100000,
    eval_every=20,
    target_fraction=0.99,
    lr_warmup_steps=20,
    weight_decay=0.01,
    lr_grid_sgd="0.3,0.1,0.03,0.01",
    lr_grid_adamw="3e-3,1e-3,3e-4,1e-4",
    powersgd_ranks="1,2,4,8",
    powersgd_starts="10,100",
    lowrank_ranks="1,2,4,8",
    local_steps_h="4,8,16,32",
    qadam_warmups="20,100,400",
)


def _floats(text):
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text):
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a reduced matrix (see the docstring); make bench runs it")
    p.add_argument("--smoke", action="store_true", help="tiny models and runs; unshaped when shaping is not possible")
    p.add_argument("--workloads", help="comma-separated subset of " + ", ".join(_workloads.WORKLOADS))
    p.add_argument("--tracks", help="comma-separated subset of " + ", ".join(TRACKS))
    p.add_argument("--hosts", help="comma-separated host counts (default 2,4)")
    p.add_argument("--links", help=f"comma-separated tc rates, each optionally +<delay>ms (default {DEFAULT_LINKS})")
    p.add_argument("--methods", help="comma-separated subset of: " + ", ".join(METHODS) + " (DDP required)")
    p.add_argument("--seeds", type=int, help="measured seeds (1..n; default 3)")
    p.add_argument("--tune-trials", type=int, help="tuning trials per method (the equal budget; default 12)")
    p.add_argument("--tune-seconds", type=float, help="seconds of training per tuning trial (default 10)")
    p.add_argument("--tune-max-steps", type=int, help="steps at most per tuning trial")
    p.add_argument("--time-budget", type=float, help="seconds of training per measured run (default 60)")
    p.add_argument("--max-steps", type=int, help="steps at most per measured run")
    p.add_argument("--eval-every", type=int, help="steps between evaluations (default 20)")
    p.add_argument("--target-fraction", type=float, help="target: this fraction of tuned DDP's best (default 0.99)")
    p.add_argument("--lr-warmup-steps", type=int, help="linear learning-rate warm-up, every method (default 20)")
    p.add_argument("--weight-decay", type=float, help="AdamW's decoupled weight decay (default 0.01)")
    for flag, what in (
        ("lr-grid-sgd", "learning rates, sgd track"),
        ("lr-grid-adamw", "learning rates, adamw track"),
        ("powersgd-ranks", "DDP+PowerSGD ranks"),
        ("powersgd-starts", "DDP+PowerSGD / Bagua LowRank start iterations"),
        ("lowrank-ranks", "Bagua LowRank ranks"),
        ("local-steps-h", "Bagua LocalSteps H"),
        ("qadam-warmups", "Bagua QAdam warm-up steps"),
    ):
        p.add_argument("--" + flag, help=f"comma-separated {what} to tune over")
    p.add_argument("--out-dir", default="tta_results", help="where the JSON, PNGs and table go")
    p.add_argument("--no-shaping", action="store_true", help="skip namespaces and tc: runs over loopback")
    p.add_argument("--cleanup", action="store_true", help="only remove namespaces left by killed runs, then exit")
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds per host count and link before the run is stopped "
        "(default: three times the estimate, plus 5 minutes)",
    )
    p.add_argument("--result", help=argparse.SUPPRESS)  # worker: where rank 0 writes its results
    p.add_argument("--link", default=UNSHAPED, help=argparse.SUPPRESS)  # worker: the link it runs under
    args = p.parse_args(argv)
    preset = PRESETS["smoke"] if args.smoke else PRESETS["quick"] if args.quick else {}
    for key, value in {**DEFAULTS, **preset}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.size = "tiny" if args.smoke else "full"
    try:
        _check(args)
    except ValueError as e:
        p.error(str(e))
    return args


def _check(args):
    """Parses the comma-separated options in place; ValueError says what is wrong."""
    args.workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    args.tracks = tuple(t.strip() for t in args.tracks.split(",") if t.strip())
    args.methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    args.links = tuple(link.strip().lower() for link in args.links.split(",") if link.strip())
    for name, got, known in (
        ("workload", args.workloads, _workloads.WORKLOADS),
        ("track", args.tracks, TRACKS),
        ("method", args.methods, METHODS),
    ):
        unknown = [g for g in got if g not in known]
        if unknown or not got:
            raise ValueError(f"unknown or no {name}(s) {unknown}; choose from {list(known)}")
    if BASELINE not in args.methods:
        raise ValueError(f"{BASELINE!r} sets the target and must be measured")
    for link in args.links:
        _hosts.parse_link(link)
    if not args.links:
        raise ValueError("--links is empty")
    args.hosts = _ints(args.hosts)
    if not args.hosts or any(not 2 <= n <= _hosts.MAX_HOSTS for n in args.hosts):
        raise ValueError(f"--hosts: host counts from 2 to {_hosts.MAX_HOSTS}")
    args.lr_grid = {"sgd": _floats(args.lr_grid_sgd), "adamw": _floats(args.lr_grid_adamw)}
    for key in ("powersgd_ranks", "powersgd_starts", "lowrank_ranks", "local_steps_h", "qadam_warmups"):
        setattr(args, key, _ints(getattr(args, key)))
        if not getattr(args, key) or min(getattr(args, key)) < 1:
            raise ValueError(f"--{key.replace('_', '-')}: positive integers")
    if min(args.powersgd_starts) < 2:
        raise ValueError("--powersgd-starts: torch's PowerSGD needs a start iteration of at least 2")
    if any(not g or min(g) <= 0 for g in args.lr_grid.values()):
        raise ValueError("learning-rate grids: positive numbers")
    if max(len(args.lr_grid[t]) for t in args.tracks) > args.tune_trials:
        raise ValueError("--tune-trials must cover the learning-rate grid")
    for name in ("seeds", "tune_trials", "tune_max_steps", "max_steps", "eval_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if (
        min(args.tune_seconds, args.time_budget) <= 0
        or not 0 < args.target_fraction <= 1
        or args.lr_warmup_steps < 0
        or args.weight_decay < 0
    ):
        raise ValueError("budgets must be positive, --target-fraction in (0, 1], warm-up and weight decay >= 0")
    for n in args.hosts:
        for w in args.workloads:
            if _workloads.SIZES[args.size][w]["batch"] % n:
                raise ValueError(
                    f"{w}'s global batch {_workloads.SIZES[args.size][w]['batch']} is not divisible by {n} hosts"
                )


# ---------------------------------------------------------------- tuning ---


def is_local_steps(method):
    return _training.BAGUA_ALGORITHMS.get(method) == "LocalStepsAlgorithm"


def knob_grid(method, args):
    """The settings a method tunes beside its learning rate (dicts of wrap() / optimizer options)."""
    if method == POWERSGD:
        return [{"rank": r, "start_iter": s} for r in args.powersgd_ranks for s in args.powersgd_starts]
    if method == "Bagua LowRank":
        return [{"rank": r, "start_iter": s} for r in args.lowrank_ranks for s in args.powersgd_starts]
    if is_local_steps(method):
        return [{"sync_interval": h} for h in args.local_steps_h]
    if method == "Bagua QAdam":
        return [{"warmup_steps": w} for w in args.qadam_warmups]
    return []


def default_knobs(grid):
    """The middle of a method's grid: its settings while the learning rate is tuned."""
    return dict(grid[len(grid) // 2]) if grid else {}


def evenly_spaced(items, n):
    """``n`` of ``items``, spread over them (all when there are no more than ``n``)."""
    if n >= len(items):
        return list(items)
    if n <= 0:
        return []
    if n == 1:
        return [items[len(items) // 2]]
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def lr_refinements(grid, best, tried):
    """Learning rates between the grid's around ``best``, nearest first (bisection in log space:
    best * r^(+-1/2), then +-1/4, +-3/4, +-1/8, ...; r the grid's mean ratio), none already tried."""
    lo, hi = math.log(min(grid)), math.log(max(grid))
    step = (hi - lo) / (len(grid) - 1) if len(grid) > 1 else math.log(3.0)
    out, seen = [], {round(math.log(x), 9) for x in tried}
    for level in range(1, 8):
        den = 2**level
        for num in range(1, den, 2):
            for sign in (-1, 1):
                x = math.log(best) + sign * step * num / den
                if round(x, 9) not in seen:
                    seen.add(round(x, 9))
                    out.append(math.exp(x))
    return out


class Tuner:
    """The trials of one method, in order (see the docstring's three stages); ``next()`` gives the
    next settings ({"lr": ..., knobs}) or None when the budget is spent, ``record(hp, score)`` its
    result. The same on every rank: the scores are summed over ranks first."""

    def __init__(self, lr_grid, grid, budget):
        self.lr_grid, self.grid, self.budget = list(lr_grid), list(grid), budget
        self.trials = []  # (hp, score)
        base = default_knobs(grid)
        self.queue = [{"lr": lr, **base} for lr in self.lr_grid]
        self.stage = 1

    def best(self):
        """The best settings so far (the first of equal scores)."""
        return max(self.trials, key=lambda t: t[1])[0] if self.trials else None

    def next(self):
        if len(self.trials) >= self.budget:
            return None
        if not self.queue and self.stage == 1:
            self.stage = 2
            best = self.best()
            others = [k for k in self.grid if k != default_knobs(self.grid)]
            self.queue = [{"lr": best["lr"], **k} for k in evenly_spaced(others, self.budget - len(self.trials))]
        if not self.queue and self.stage == 2:
            self.stage = 3
            best = self.best()
            knobs = {k: v for k, v in best.items() if k != "lr"}
            tried = [hp["lr"] for hp, _ in self.trials if {k: v for k, v in hp.items() if k != "lr"} == knobs]
            lrs = lr_refinements(self.lr_grid, best["lr"], tried)[: self.budget - len(self.trials)]
            self.queue = [{"lr": lr, **knobs} for lr in lrs]
        return self.queue.pop(0) if self.queue else None

    def record(self, hp, score):
        self.trials.append((hp, score))


# ------------------------------------------------------------ summaries ---


def time_to_target(curve, target):
    """Seconds of the first evaluation whose metric is at least ``target`` (None: never)."""
    return next((c[0] for c in curve if c[2] >= target), None)


def metric_at(curve, seconds):
    """The last validation metric evaluated at or before ``seconds`` (None: none yet)."""
    done = [c[2] for c in curve if c[0] <= seconds]
    return done[-1] if done else None


def median_time(times):
    """Median over seeds, a seed that never reached the target counting as infinitely slow
    (None: the median is such a seed)."""
    t = statistics.median([math.inf if x is None else x for x in times])
    return None if math.isinf(t) else t


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(cases, methods, fraction, budget):
    """The per-method summary of one workload, track, host count and link. ``cases``: {method:
    {"runs": [...]} or {"skipped": why} or {"error": what}}."""
    ddp = cases.get(BASELINE, {})
    if "runs" not in ddp:
        return {"target": None, "why_no_target": f"{BASELINE} has no runs", "methods": {}}
    best = statistics.median(max((c[2] for c in r["curve"]), default=0.0) for r in ddp["runs"])
    target = fraction * best
    out = {}
    for m in methods:
        case = cases.get(m)
        if case is None or "runs" not in case:
            case = case or {}
            out[m] = (
                {"skipped": case["skipped"]}
                if "skipped" in case
                else {"error": case.get("error") or "; ".join(case.get("errors", [])) or "not run"}
            )
            continue
        runs = case["runs"]
        times = [time_to_target(r["curve"], target) for r in runs]
        bytes_counted = all(r["bytes"] is not None for r in runs)
        out[m] = {
            "tuned": case["tuned"],
            "seconds_to_target": times,
            "median_seconds_to_target": median_time(times),
            "reached": sum(t is not None for t in times),
            "seeds": len(runs),
            "metric_at_budget": _median([metric_at(r["curve"], budget) for r in runs]),
            "best_metric": _median([max((c[2] for c in r["curve"]), default=None) for r in runs]),
            "steps_in_budget": _median([max((c[1] for c in r["curve"] if c[0] <= budget), default=0) for r in runs]),
            "bytes_per_step": _median([r["bytes_per_step"] for r in runs]) if bytes_counted else None,
            "bytes_counted": bytes_counted,
        }
    for s in out.values():
        for ref, key in ((POWERSGD, "speedup_vs_powersgd"), (BASELINE, "speedup_vs_ddp")):
            mine, theirs = s.get("median_seconds_to_target"), out.get(ref, {}).get("median_seconds_to_target")
            if "tuned" in s:
                s[key] = theirs / mine if mine and theirs else None
    return {"target": target, "ddp_best": best, "methods": out}


# ---------------------------------------------------------------- driver ---


def plan(args):
    """(host count, link) launches, and the estimated seconds of each."""
    per = 0.0
    for track in args.tracks:
        n = sum(m in args.methods for m in TRACKS[track])
        per += n * (args.tune_trials * args.tune_seconds + args.seeds * args.time_budget)
    return len(args.workloads) * per * OVERHEAD


def drive(args, argv) -> int:
    rc, reason = _hosts.prepare(args, "time_to_accuracy.py", "runs over loopback, bytes on the wire not counted")
    if rc is not None:
        return rc
    links = (UNSHAPED,) if reason is not None else args.links
    estimate = plan(args)
    timeout = args.timeout or 3 * estimate + 300
    print(
        f"plan: {len(args.hosts)} host count(s) x {len(links)} link(s), each about {estimate / 60:.0f} min "
        f"(budgets x {OVERHEAD}); about {len(args.hosts) * len(links) * estimate / 3600:.1f} h in all",
        flush=True,
    )
    os.makedirs(args.out_dir, exist_ok=True)
    _launch.raise_on_stop_signals()
    doc = {
        "args": {k: v for k, v in vars(args).items() if k not in ("result", "link")},
        "shaping": reason is None,
        "shaping_skipped_because": reason,
        "notices": [],
        "runs": {},
        "load_average_before": os.getloadavg(),
        "uptime_before": _report.uptime(),
        "cpus": os.cpu_count(),
        "estimated_seconds_per_launch": estimate,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }
    t0 = time.perf_counter()
    rc = 0
    # Each launch's results go straight to the output folder, rewritten after every method: a run
    # that is killed outright (not stopped) still leaves what it measured there.
    for n in args.hosts:
        launch = _launch_unshaped if reason is not None else _launch_shaped
        rc = launch(args, argv, args.out_dir, n, timeout, doc) or rc
        if rc in (124, 130):
            break
    doc.update(seconds=time.perf_counter() - t0, load_average_after=os.getloadavg(), uptime_after=_report.uptime())
    doc["summary"] = {
        key: {
            w: {
                t: summarize(
                    run["cases"][w][t],
                    [m for m in TRACKS[t] if m in args.methods],
                    args.target_fraction,
                    args.time_budget,
                )
                for t in run["cases"][w]
            }
            for w in run["cases"]
        }
        for key, run in doc["runs"].items()
    }
    plots = {f"time_to_accuracy_{t}.png": (lambda d, path, t=t: plot_track(d, path, t)) for t in args.tracks}
    _report.write_outputs(doc, args.out_dir, "time_to_accuracy", format_table(doc), plots)
    for partial in glob.glob(os.path.join(args.out_dir, PARTIAL_PREFIX + "*.json")):
        os.remove(partial)  # all of it is in time_to_accuracy.json now
    return rc


def _run_key(n, link):
    return f"{n} hosts, {link}"


def _collect(doc, key, result, rc):
    """Rank 0's results (written after every method, so a failed or stopped run leaves what it did)."""
    if os.path.exists(result):
        with open(result) as f:
            doc["runs"][key] = json.load(f)
        doc["runs"][key]["complete"] = rc == 0
    if rc != 0:
        print(
            f"time_to_accuracy.py: the run {key} failed (exit code {rc}); its results so far are kept",
            file=sys.stderr,
            flush=True,
        )
    return rc


def _worker_argv(argv, link, result):
    return [*argv, "--link", link, "--result", result]


def _partial_result(out_dir, n, link):
    slug = "".join(c if c.isalnum() or c in "+-." else "-" for c in link)
    return os.path.join(out_dir, f"{PARTIAL_PREFIX}{n}h-{slug}.json")


def _launch_unshaped(args, argv, out_dir, n, timeout, doc):
    key = _run_key(n, UNSHAPED)
    print(f"--- {key}: {n} processes on this host", flush=True)
    result = _partial_result(out_dir, n, UNSHAPED)
    cmd = _launch.launcher_cmd(__file__, _worker_argv(argv, UNSHAPED, result), n)
    return _collect(
        doc, key, result, _launch.wait_all([_launch.start(cmd, _launch.worker_env())], timeout, "time_to_accuracy.py")
    )


def _launch_shaped(args, argv, out_dir, n, timeout, doc):
    secret = secrets.token_hex(32)  # the same on every host: the store admits only this job's workers
    with _hosts.EmulatedHosts(n) as hosts:
        print(
            f"emulated hosts: namespaces {', '.join(hosts.netns)} ({', '.join(_hosts.ADDRESSES[:n])})"
            + (
                f", bridge {hosts.bridge} in {hosts.switch}"
                if hosts.switch
                else f", veth {hosts.ifaces[0]} <-> {hosts.ifaces[1]}"
            ),
            flush=True,
        )
        doc["netem_unavailable_because"] = hosts.netem_unavailable_reason()
        for link in args.links:
            key = _run_key(n, link)
            rate, delay = _hosts.parse_link(link)
            hosts.shape(rate, delay)
            if delay is not None:
                doc.setdefault("delay_method", {})[key] = hosts.delay_method()
            print(
                f"--- {key} each way" + (f", {delay} ms one way ({hosts.delay_method()})" if delay else ""), flush=True
            )
            result = _partial_result(out_dir, n, link)
            procs = []
            for host in range(n):
                env = _launch.worker_env(
                    {
                        "GLOO_SOCKET_IFNAME": hosts.ifaces[host],
                        "BAGUA_STORE_SECRET": secret,
                        "TTA_TX_BYTES": hosts.tx_bytes_path(host),
                    }
                )
                cmd = hosts.exec_prefix(host) + _launch.launcher_cmd(
                    __file__,
                    _worker_argv(argv, link, result),
                    1,
                    nnodes=n,
                    node_rank=host,
                    master_addr=_hosts.ADDRESSES[0],
                    master_port=MASTER_PORT,
                )
                procs.append(_launch.start(cmd, env))
            rc = _collect(doc, key, result, _launch.wait_all(procs, timeout, "time_to_accuracy.py"))
            if rc != 0:
                return rc
    return 0


# ---------------------------------------------------------------- worker ---


class Clock:
    """Training time and bytes sent, counted only between ``start()`` and ``stop()``; both meet the
    other ranks first (``stop``'s meeting counts: the slowest rank's time is the job's)."""

    def __init__(self, tx_bytes_path):
        self.path, self.seconds, self.bytes = tx_bytes_path, 0.0, 0
        self.t = self.b = None

    def _tx(self):
        if self.path is None:
            return 0
        with open(self.path) as f:
            return int(f.read())

    def start(self):
        import torch.distributed as dist

        dist.barrier()
        self.b, self.t = self._tx(), time.perf_counter()

    def stop(self):
        import torch.distributed as dist

        dist.barrier()
        self.seconds += time.perf_counter() - self.t
        self.bytes += self._tx() - self.b


def make_optimizer(track, method, params, hp, weight_decay):
    import torch

    if method == "Bagua QAdam":
        from bagua_torch.algorithms import QAdamOptimizer

        return QAdamOptimizer(params, lr=hp["lr"], warmup_steps=hp["warmup_steps"])
    if track == "adamw":
        return torch.optim.AdamW(params, lr=hp["lr"], weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=hp["lr"], momentum=0.9)


def wrap_options(method, hp):
    """wrap()'s options for settings ``hp`` (QAdam's warm-up and every learning rate go to the optimizer)."""
    if method == "Bagua QAdam":
        return {}
    knobs = {k: v for k, v in hp.items() if k != "lr"}
    return {**LOCAL_STEPS_FIXED, **knobs} if is_local_steps(method) else knobs


def train(args, workload, track, method, hp, seed, max_seconds, max_steps, tx_bytes_path):
    """One run: ``curve`` [(seconds, steps, metric, loss)], steps, seconds, bytes (summed over
    ranks, None when not counted) and bytes per step."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = workload.make_model()
    opt = make_optimizer(track, method, model.parameters(), hp, args.weight_decay)
    clock = Clock(tx_bytes_path)
    clock.start()  # the wrapper's setup (broadcasts, buckets, engine) is part of the time
    net, close = _training.wrap(method, model, opt, wrap_options(method, hp))
    curve, step, diverged = [], 0, False
    try:
        while True:
            scale = min(1.0, (step + 1) / args.lr_warmup_steps) if args.lr_warmup_steps else 1.0
            for g in opt.param_groups:
                g["lr"] = hp["lr"] * scale
            x, y = workload.batch(step, seed, rank, world)
            loss = workload.loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if step % args.eval_every and step < max_steps:
                continue
            clock.stop()
            correct, total = workload.evaluate(model, rank, world)
            v = torch.tensor([correct, total, loss.item(), clock.seconds, clock.bytes], dtype=torch.float64)
            dist.all_reduce(v)
            correct, total, loss_sum, seconds_sum, sent = v.tolist()
            curve.append((seconds_sum / world, step, correct / total, loss_sum / world))
            diverged = not math.isfinite(loss_sum)
            if diverged or step >= max_steps or seconds_sum / world >= max_seconds:
                break
            clock.start()
    finally:
        close()
    counted = tx_bytes_path is not None
    return {
        "curve": curve,
        "steps": step,
        "seconds": curve[-1][0],
        "diverged": diverged,
        "bytes": sent if counted else None,
        "bytes_per_step": sent / step if counted else None,
        **({} if counted else {"bytes_note": NOT_COUNTED}),
    }


def work(argv) -> int:
    args = parse_args(argv)
    import torch.distributed as dist

    rank, world, say = _training.start_worker(COLLECTIVE_TIMEOUT_S)
    tx = os.environ.get("TTA_TX_BYTES")
    doc = {
        "link": args.link,
        "world_size": world,
        "bytes_counted": tx is not None,
        "bytes_note": None if tx else NOT_COUNTED,
        "workloads": {},
        "cases": {},
        "load_average_before": os.getloadavg(),
    }

    def save():
        if rank == 0:
            doc["load_average_after"] = os.getloadavg()
            with open(args.result, "w") as f:
                json.dump(doc, f, indent=2)

    for wname in args.workloads:
        workload = _workloads.make(wname, args.size)
        doc["workloads"][wname] = {
            "metric": workload.metric,
            "parameters": workload.parameters,
            "global_batch": workload.batch_size,
            "size": workload.size,
        }
        say(
            f"[{args.link}] {wname}: {workload.parameters / 1e6:.2f} M parameters, global batch "
            f"{workload.batch_size}, world size {world}; metric: {workload.metric}"
        )
        for track in args.tracks:
            cases = doc["cases"].setdefault(wname, {}).setdefault(track, {})
            methods = [m for m in TRACKS[track] if m in args.methods]
            for m in methods:
                grid = knob_grid(m, args)
                why = _training.unavailable_reason(m, wrap_options(m, {"lr": 0, **default_knobs(grid)}))
                if why is not None:
                    cases[m] = {"skipped": why}
                    say(f"[{args.link}] {wname}/{track}: {m} skipped: {why}")
                    continue
                cases[m] = _guarded(
                    lambda: tune(args, workload, track, m, grid, tx, say), say, f"{wname}/{track}/{m} tuning"
                )
                save()
            ready = [m for m in methods if "tuned" in cases[m]]
            for seed in range(1, args.seeds + 1):
                for m in ready if seed % 2 else ready[::-1]:
                    run = _guarded(
                        lambda: train(
                            args, workload, track, m, cases[m]["tuned"], seed, args.time_budget, args.max_steps, tx
                        ),
                        say,
                        f"{wname}/{track}/{m} seed {seed}",
                    )
                    if "error" in run:
                        cases[m].setdefault("errors", []).append(run["error"])
                        continue
                    cases[m].setdefault("runs", []).append({"seed": seed, **run})
                    last = run["curve"][-1]
                    say(
                        f"[{args.link}] {wname}/{track} seed {seed} {m}: {run['steps']} steps in {last[0]:.1f} s, "
                        f"{workload.metric} {last[2]:.4f}"
                        + (
                            f", {run['bytes_per_step'] / 2**20:.3f} MiB/step on the wire"
                            if run["bytes"] is not None
                            else ""
                        )
                    )
                    save()
    save()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _guarded(fn, say, what):
    """``fn()``, or {"error": ...} when it raises (the same on every rank: they meet again after)."""
    import torch.distributed as dist

    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded, the benchmark goes on with the next case
        say(f"{what} failed: {type(e).__name__}: {e}")
        dist.barrier()
        return {"error": f"{type(e).__name__}: {e}"}


def tune(args, workload, track, method, grid, tx, say):
    tuner = Tuner(args.lr_grid[track], grid, args.tune_trials)
    trials, t0 = [], time.perf_counter()
    while (hp := tuner.next()) is not None:
        run = train(args, workload, track, method, hp, TUNING_SEED, args.tune_seconds, args.tune_max_steps, tx)
        score = -1.0 if run["diverged"] else run["curve"][-1][2]
        tuner.record(hp, score)
        trials.append({"hp": hp, "score": score, "steps": run["steps"], "seconds": run["seconds"]})
    best = tuner.best()
    say(
        f"[{args.link}] {workload.name}/{track} {method}: tuned {best} ({len(trials)} trials, best score "
        f"{max(t['score'] for t in trials):.4f}, {time.perf_counter() - t0:.0f} s)"
    )
    return {"tuned": best, "tuning": trials}


# ---------------------------------------------------------------- output ---


def _fmt_hp(hp):
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in hp.items())


def _fmt(x, spec, none="n/a"):
    return none if x is None else format(x, spec)


def format_table(doc):
    a = doc["args"]
    out = []
    for track in a["tracks"]:
        out += [
            f"### {track} track: time to {a['target_fraction']:.0%} of tuned DDP's best validation metric "
            f"(median of {a['seeds']} seeds), metric at {a['time_budget']:.0f} s",
            "",
            "| workload | hosts, link | method | tuned | s to target (reached) | x DDP+PowerSGD | x DDP "
            f"| metric at {a['time_budget']:.0f} s | MiB/step on the wire | steps in {a['time_budget']:.0f} s |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key, run in doc["runs"].items():
            for w in run["cases"]:
                s = doc["summary"][key][w].get(track)
                if s is None:
                    continue
                for m, r in s["methods"].items():
                    lead = f"| {w} | {key} | {m} |"
                    if "tuned" not in r:
                        out.append(
                            lead
                            + (f" skipped: {r['skipped']}" if "skipped" in r else f" error: {r['error']}")
                            + " | | | | | | |"
                        )
                        continue
                    t = r["median_seconds_to_target"]
                    wire = _fmt(r["bytes_per_step"] / 2**20, ".3f") if r["bytes_counted"] else "not counted"
                    out.append(
                        f"{lead} {_fmt_hp(r['tuned'])} | {_fmt(t, '.1f', 'not reached')} "
                        f"({r['reached']}/{r['seeds']}) | {_fmt(r.get('speedup_vs_powersgd'), '.2f')} "
                        f"| {_fmt(r.get('speedup_vs_ddp'), '.2f')} | {_fmt(r['metric_at_budget'], '.4f')} "
                        f"| {wire} | {_fmt(r['steps_in_budget'], '.0f')} |"
                    )
        out.append("")
    targets = [
        f"{key} {w}/{t}: {_fmt(s.get('target'), '.4f')}"
        for key, ws in doc["summary"].items()
        for w, ts in ws.items()
        for t, s in ts.items()
    ]
    out.append("targets: " + "; ".join(targets))
    out += [f"notice: {n}" for n in doc["notices"]]
    if not doc["shaping"]:
        out.append(f"bytes on the wire {NOT_COUNTED}; shaping skipped: {doc['shaping_skipped_because']}")
    out.append(
        f"x DDP+PowerSGD, x DDP: their median time to target over this one's (> 1: faster). "
        f"{doc['seconds']:.0f} s in all; before: {doc['uptime_before']}; after: {doc['uptime_after']}"
    )
    return "\n".join(out)


def plot_track(doc, path, track):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(key, w) for key, run in doc["runs"].items() for w in run["cases"] if track in run["cases"][w]]
    cols = max(1, min(4, len(panels)))
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, w) in zip(axes.flat, panels):
        cases = doc["runs"][key]["cases"][w][track]
        for i, m in enumerate(TRACKS[track]):
            for j, r in enumerate(cases.get(m, {}).get("runs", [])):
                ax.plot(
                    [c[0] for c in r["curve"]],
                    [c[2] for c in r["curve"]],
                    color=colors[i % len(colors)],
                    linestyle="--" if m.startswith("DDP") else "-",
                    alpha=1.0 if j == 0 else 0.45,
                    label=m if j == 0 else None,
                )
        target = doc["summary"][key][w][track].get("target")
        if target is not None:
            ax.axhline(target, color="grey", linewidth=0.8)
        ax.set_title(f"{w}, {key}", fontsize=9)
        ax.set_xlabel("wall-clock seconds (evaluation excluded)")
        ax.set_ylabel(doc["runs"][key]["workloads"][w]["metric"])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{track} track")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    return _launch.main_driver("time_to_accuracy.py", work, lambda argv: drive(parse_args(argv), argv))


if __name__ == "__main__":
    sys.exit(main())
