"""What the cross-rank call agreement of NCCL groups costs, measured on Gloo.

An NCCL group agrees on every collective over its Gloo control communicator
before NCCL runs it (csrc/comm/agreed_communicator.h): one small host
allgather per call, or one per engine step when the engine promises the
step's calls (expect_calls). This script measures, on ``--nproc`` local
processes (one host, loopback / shared memory):

* ``agreement``: the agreement exchange alone (``_agreement_allgather`` of the
  9 descriptor words on a Gloo communicator): what each unbatched NCCL call pays;
* ``gloo``: a small float32 allreduce on a plain Gloo group (Gloo agrees on its
  own calls: the baseline of a host collective);
* ``gloo+control``: the same allreduce on a Gloo group built like an NCCL group
  (agreement over a separate control communicator, then the data call, which
  agrees once more on its own);
* ``promised``: ``--calls`` allreduces after one expect_calls promise of all of
  them, per call (the first carries the agreement, the others none).

Prints microseconds per call (median over ``--rounds`` rounds of ``--iters``
calls, slowest rank; the modes take turns within each round).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/agreement_cost.py --nproc 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import _launch  # benchmarks/_launch.py


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    p.add_argument("--iters", type=int, default=200, help="calls per round (default 200)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the median is printed (default 5)")
    p.add_argument("--count", type=int, default=256, help="float32 elements per allreduce (default 256)")
    p.add_argument("--calls", type=int, default=16, help="calls per promise, like buckets of a step (default 16)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before the run is stopped")
    args = p.parse_args(argv)
    if args.nproc < 2 or args.iters < 1 or args.rounds < 1 or args.count < 1 or args.calls < 1:
        p.error("--nproc must be >= 2 and the other counts >= 1")
    return args


def work(argv) -> int:
    args = parse_args(argv)
    import numpy as np

    import bagua_core as bc
    from bagua_core import _C, process_group
    from bagua_core.dtypes import DType

    world = bc.init_process_group()
    plain = world.clone()
    process_group._separate_control = True  # groups made from now on: like NCCL groups, on Gloo
    world._ctx.separate_control = True
    controlled = world.clone()
    f32 = int(DType.float32)
    x = np.ones(args.count, np.float32)
    words = np.zeros(9, np.int64)
    out = np.zeros(9 * world.size, np.int64)
    control = controlled.control_group.comm

    def agreement():
        _C._agreement_allgather(control, words.ctypes.data, 9, out.ctypes.data)

    def gloo():
        plain.comm.allreduce(x.ctypes.data, x.ctypes.data, args.count, f32, 0)

    def gloo_control():
        controlled.comm.allreduce(x.ctypes.data, x.ctypes.data, args.count, f32, 0)

    promise = [(1, f32, args.count, -1, 0)] * args.calls
    done = [0]

    def promised():
        if done[0] % args.calls == 0:
            controlled.comm._expect_calls(promise)
        done[0] += 1
        gloo_control()

    slowest = np.zeros(1, np.float64)
    modes = (("agreement", agreement), ("gloo", gloo), ("gloo+control", gloo_control), ("promised", promised))
    # promised: whole promises only, so that every round starts with one
    iters = {
        name: max(args.calls, args.iters - args.iters % args.calls) if name == "promised" else args.iters
        for name, _ in modes
    }
    for name, fn in modes:  # warm up
        for _ in range(args.calls if name == "promised" else 20):
            fn()
    times = {name: [] for name, _ in modes}
    for _ in range(args.rounds):  # the modes take turns, so that load drifts hit them alike
        for name, fn in modes:
            world.comm.barrier()
            t0 = time.perf_counter()
            for _ in range(iters[name]):
                fn()
            slowest[0] = (time.perf_counter() - t0) / iters[name] * 1e6
            bc.allreduce_inplace(slowest, op=bc.ReduceOp.MAX, group=world)
            times[name].append(float(slowest[0]))
    results = {name: statistics.median(t) for name, t in times.items()}
    if world.rank == 0:
        print(f"| procs | count | agreement us | gloo us | gloo+control us | promised us/call ({args.calls} calls) |")
        print("|---|---|---|---|---|---|")
        r = results
        print(
            f"| {world.size} | {args.count} | {r['agreement']:.1f} | {r['gloo']:.1f} | {r['gloo+control']:.1f} | "
            f"{r['promised']:.1f} |"
        )
        sys.stdout.flush()
    plain.close()
    controlled.close()
    bc.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_launch.main(__file__, work, parse_args))
