"""Command line of ``bagua-compare`` (see :mod:`bagua_core.compare`)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import List, Optional, Sequence

from bagua_core.compare import report
from bagua_core.compare.problem import Problem, configurations

FRONTENDS = {"torch": "bagua_torch.compare_worker", "jax": "bagua_jax.compare_worker"}


def parse_args(argv: Optional[Sequence[str]] = None):
    p = argparse.ArgumentParser(prog="bagua-compare", description=__doc__.splitlines()[0])
    p.add_argument(
        "--algorithm",
        default="all",
        help=f"algorithms by their original names, or variants, comma-separated "
        f"({', '.join(configurations())}), or all of them",
    )
    p.add_argument("--nproc", type=int, default=2, help="processes per run")
    p.add_argument("--out", default="bagua-compare", help="directory for compare.json and compare.png")
    p.add_argument("--print-every", type=int, default=10, help="loss rows shown per algorithm")
    p.add_argument(
        "--timeout", type=float, default=600, help="seconds per algorithm and frontend before a run is stopped"
    )
    Problem.add_args(p)
    args = p.parse_args(argv)
    args.algorithm = configurations() if args.algorithm == "all" else args.algorithm.split(",")
    unknown = [a for a in args.algorithm if a not in configurations()]
    if unknown:
        p.error(f"unknown algorithm(s) {unknown}; choose from {configurations()} or all")
    try:
        Problem.from_args(args)
    except ValueError as e:
        p.error(str(e))
    if args.nproc < 1:
        p.error("--nproc must be >= 1")
    if args.steps <= report.WARMUP_STEPS:
        p.error(f"--steps must be > {report.WARMUP_STEPS}")
    return args


def run_workers(frontend: str, algorithms: List[str], problem: Problem, nproc: int, timeout: float) -> dict:
    """Runs one frontend's worker on ``nproc`` processes, which train each of
    ``algorithms`` in turn (one launch: starting the processes and importing
    the framework cost more than training); returns rank 0's results by
    algorithm. ``timeout``: seconds per algorithm."""
    timeout *= len(algorithms)
    names = ",".join(algorithms)
    with tempfile.TemporaryDirectory(prefix="bagua-compare-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [
            sys.executable,
            "-m",
            "bagua_core.run",
            "--nproc-per-node",
            str(nproc),
            "-m",
            FRONTENDS[frontend],
            f"--algorithm={names}",
            f"--out={out}",
            *problem.to_args(),
        ]
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"bagua-compare: the {frontend} run of {names} took over {timeout:.0f} s") from None
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(
                f"bagua-compare: the {frontend} run of {names} failed (exit {proc.returncode}):\n" + proc.stdout[-4000:]
            )
        with open(out) as f:
            return json.load(f)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    problem = Problem.from_args(args)
    names = ", ".join(args.algorithm)
    print(f"bagua-compare: {names}: torch, then jax, on {args.nproc} processes, {problem.dtype}", flush=True)
    runs = {fe: run_workers(fe, args.algorithm, problem, args.nproc, args.timeout) for fe in FRONTENDS}
    results = {}
    for name in args.algorithm:
        r = {fe: runs[fe][name] for fe in FRONTENDS}
        results[name] = {**r, "summary": {**report.summarise(r["torch"], r["jax"]), "dtype": problem.dtype}}
    report.print_report(results, max(1, args.print_every), problem)
    for path in report.write(results, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
