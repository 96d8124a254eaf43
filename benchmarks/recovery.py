"""Recovery under kills: Bagua's live jobs (bagua_torch.live) against torchft's
own FT-DDP and DiLoCo, side by side in one run, under the same kill schedule
and the same Lighthouse settings.

Each system trains the same MLP (benchmarks/_recovery_worker.py; a fixed
synthetic batch per replica, one thread each) with one process per replica,
each under its own agent (bagua-run for Bagua, torchrun for torchft). For
each system and algorithm (gradient allreduce = torchft's FT-DDP, local steps
= torchft's DiLoCo, both with 8 inner steps):

* fault-free, ``--workers`` replicas for ``--seconds``;
* the same with one replica's worker SIGKILLed every ``--kill-every`` seconds
  (replicas 1, 2, ... in turn; its agent restarts it);
* with 2 replicas and the same kills, for the recovery times.

Reported: throughput (replica-steps committed per second once every replica
has stepped, as each system counts them: inner steps for local steps), the
fraction of the fault-free throughput kept under kills, the time from a kill
to every survivor's first committed step in a new membership, and from a restarted worker's start
to its first committed step (medians over the kills). Bagua alone: the cost of
``save_checkpoint`` every ``--checkpoint-every`` steps, fault-free.

Needs torchft (``pip install 'bagua[ft]'``); runs on one host over loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import _report
from _launch import kill_tree

from bagua_core.launcher.ports import free_master_ports

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_recovery_worker.py")
SYSTEMS = {"bagua": {"gradient_allreduce": "GradientAllReduce", "local_steps": "LocalSteps"},
           "torchft": {"gradient_allreduce": "FT-DDP", "local_steps": "DiLoCo"}}  # fmt: skip


def _records(path: str) -> list:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def run_job(system, algorithm, workers, seconds, kill_every, args, extra=()):
    """One job; returns each replica's records and the kill times."""
    tmp = tempfile.mkdtemp(prefix="bagua-recovery-")
    port = free_master_ports()
    lighthouse = subprocess.Popen(
        [args.lighthouse, "--min_replicas", "1", "--heartbeat_timeout_ms", str(args.heartbeat_timeout_ms),
         "--join_timeout_ms", str(args.join_timeout_ms), "--bind", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(BAGUA_LIGHTHOUSE=f"127.0.0.1:{port}", TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}")
    env.update(BAGUA_STORE_SECRET="r" * 64, BAGUA_TIMEOUT="30")
    agents, kills = [], []
    try:
        for i in range(workers):
            launcher = [sys.executable, "-m", "bagua.run"] if system == "bagua" else [args.torchrun]
            line = launcher + ["--nnodes", "1", "--nproc-per-node", "1", "--max-restarts", "100"]
            line += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_master_ports()}"]
            line += [WORKER, "--system", system, "--algorithm", algorithm, "--record", f"{tmp}/r{i}.jsonl"]
            line += ["--width", str(args.width), *extra]
            log = open(f"{tmp}/agent{i}.log", "w")
            agents.append(subprocess.Popen(line, cwd=REPO, env=dict(env, REPLICA=str(i)), stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
        began = time.time()
        next_kill, victim = began + kill_every if kill_every else None, 1
        while time.time() < began + seconds:
            if any(a.poll() is not None for a in agents):
                raise RuntimeError(f"an agent ended early; logs in {tmp}")
            if next_kill is not None and time.time() >= next_kill:
                starts = [r for r in _records(f"{tmp}/r{victim}.jsonl") if r["event"] == "start"]
                if starts:
                    os.kill(starts[-1]["pid"], signal.SIGKILL)
                    kills.append({"replica": victim, "t": time.time()})
                victim = victim % (workers - 1) + 1
                next_kill += kill_every
            time.sleep(0.05)
        return [_records(f"{tmp}/r{i}.jsonl") for i in range(workers)], kills
    finally:
        for a in agents:
            kill_tree(a.pid)
            a.wait()
        lighthouse.kill()
        lighthouse.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def throughput(records) -> float:
    """Replica-steps per second from the moment every replica has stepped."""
    steps = [[r["t"] for r in rs if r["event"] == "step"] for rs in records]
    if not all(steps):
        return 0.0
    start, end = max(s[0] for s in steps), max(s[-1] for s in steps)
    return sum(sum(1 for t in s if start <= t <= end) for s in steps) / max(end - start, 1e-9)


def recovery_times(records, kills) -> dict:
    to_survivors, to_first_step = [], []
    for k in kills:  # a survivor has recovered at its first step in a newer membership than at the kill
        nexts = []
        for i, rs in enumerate(records):
            if i != k["replica"]:
                before = [r["quorum"] for r in rs if r["event"] == "step" and r["t"] <= k["t"]]
                after = [r["t"] for r in rs if r["event"] == "step" and r["t"] > k["t"]
                         and before and r["quorum"] != before[-1]]  # fmt: skip
                nexts.append(after[0] if after else None)
        if nexts and None not in nexts:
            to_survivors.append(max(nexts) - k["t"])
        mine = records[k["replica"]]
        start = next((r["t"] for r in mine if r["event"] == "start" and r["t"] > k["t"]), None)
        first = next((r["t"] for r in mine if r["event"] == "step" and start and r["t"] > start), None)
        if first is not None:
            to_first_step.append(first - start)

    def median(xs):
        return round(statistics.median(xs), 3) if xs else None

    return {"kill_to_survivors_next_step_s": median(to_survivors), "restart_to_first_step_s": median(to_first_step),
            "kills": len(kills), "measured": [len(to_survivors), len(to_first_step)]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=40.0, help="per job")
    p.add_argument("--kill-every", type=float, default=10.0)
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between Bagua's checkpoints")
    p.add_argument("--width", type=int, default=1024, help="the MLP's hidden width")
    p.add_argument("--systems", default="bagua,torchft")
    p.add_argument("--algorithms", default="gradient_allreduce,local_steps")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    p.add_argument("--join-timeout-ms", type=int, default=3000)
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 workers, short jobs, one algorithm")
    p.add_argument("--out-dir", default="recovery_results")
    args = p.parse_args()
    if args.quick:
        args.workers, args.seconds, args.kill_every, args.width = 2, 12.0, 5.0, 64
        args.algorithms = "gradient_allreduce"
    bindir = os.path.dirname(sys.executable)
    args.lighthouse = shutil.which("torchft_lighthouse", path=bindir)
    args.torchrun = shutil.which("torchrun", path=bindir)
    if args.lighthouse is None:
        sys.exit("benchmarks/recovery.py needs torchft: pip install 'bagua[ft]'")
    os.makedirs(args.out_dir, exist_ok=True)

    rows, doc = [], {"args": {k: v for k, v in vars(args).items()}, "uptime_before": _report.uptime(), "runs": []}
    for algorithm in args.algorithms.split(","):
        for system in args.systems.split(","):
            name = SYSTEMS[system][algorithm]
            print(f"{system} {name}: fault-free, {args.workers} workers", flush=True)
            clean, _ = run_job(system, algorithm, args.workers, args.seconds, 0, args)
            print(f"{system} {name}: a kill every {args.kill_every:g} s, {args.workers} workers", flush=True)
            faulted, kills = run_job(system, algorithm, args.workers, args.seconds, args.kill_every, args)
            run = {"system": system, "algorithm": algorithm, "name": name, "workers": args.workers,
                   "fault_free_steps_per_s": round(throughput(clean), 2),
                   "faulted_steps_per_s": round(throughput(faulted), 2),
                   f"recovery_{args.workers}_workers": recovery_times(faulted, kills)}  # fmt: skip
            if args.workers != 2:
                print(f"{system} {name}: a kill every {args.kill_every:g} s, 2 workers", flush=True)
                two, two_kills = run_job(system, algorithm, 2, args.seconds, args.kill_every, args)
                run["recovery_2_workers"] = recovery_times(two, two_kills)
            if system == "bagua" and algorithm == "gradient_allreduce" and not args.quick:
                print(f"bagua {name}: fault-free, a checkpoint every {args.checkpoint_every} steps", flush=True)
                with tempfile.TemporaryDirectory() as d:
                    extra = ("--checkpoint-every", str(args.checkpoint_every), "--checkpoint-dir", d)
                    saved, _ = run_job(system, algorithm, args.workers, args.seconds, 0, args, extra)
                run["with_checkpoints_steps_per_s"] = round(throughput(saved), 2)
            run["kept"] = round(run["faulted_steps_per_s"] / max(run["fault_free_steps_per_s"], 1e-9), 3)
            doc["runs"].append(run)
            r = run[f"recovery_{args.workers}_workers"]
            two = run.get("recovery_2_workers", r)
            ckpt = run.get("with_checkpoints_steps_per_s")
            rows.append(
                f"| {system} | {name} | {run['fault_free_steps_per_s']} | {run['faulted_steps_per_s']} | "
                f"{run['kept']:.1%} | {r['kill_to_survivors_next_step_s']} / {two['kill_to_survivors_next_step_s']} | "
                f"{r['restart_to_first_step_s']} / {two['restart_to_first_step_s']} | "
                + (f"{ckpt / run['fault_free_steps_per_s']:.1%}" if ckpt else "")
                + " |"
            )
    doc["uptime_after"] = _report.uptime()
    table = "\n".join(
        [f"{args.workers} workers (2 for the second recovery figure), a kill every {args.kill_every:g} s, "
         f"{args.seconds:g} s per job; steps: replica-steps per second",
         "",
         f"| system | algorithm | fault-free steps/s | under kills | kept | kill -> survivors' next step, s "
         f"({args.workers} / 2 workers) | restart -> first step, s ({args.workers} / 2) | with checkpoints |",
         "|---|---|---|---|---|---|---|---|", *rows]
    )  # fmt: skip
    _report.write_outputs(doc, args.out_dir, "recovery", table, {})


if __name__ == "__main__":
    main()
