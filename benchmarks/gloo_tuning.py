"""Allreduce bandwidth of Bagua's Gloo communicator per lanes / segment setting, against torch's gloo.

For choosing the defaults of ``GlooCommunicatorOptions`` (lanes,
lane_threshold_bytes, segment_bytes); ``benchmarks/collectives.py`` measures the
defaults across operations and sizes.

    PYTHONPATH=$PWD python benchmarks/gloo_tuning.py [--mib 64] [--iters 10] [--nproc 2]
    BENCH_CONFIGS="1:1,2:4,4:4" ...     # lanes:segment_MiB,... replaces the list below

One communicator per setting, all in the same processes (launched by
``bagua-run``), taking turns per sample in a rotating order so that machine
noise hits them alike. torch uses MASTER_PORT, Bagua's store MASTER_PORT + 1.
Prints the median algorithmic bandwidth (buffer bytes / time, slowest rank).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, lanes, lane_threshold_bytes, segment_bytes (None: the communicator's defaults)
CONFIGS_DEFAULT = [
    ("1 lane, 1 MiB segments", 1, 1 << 62, 1 << 20),
    ("1 lane, 4 MiB segments", 1, 1 << 62, 4 << 20),
    ("2 lanes, 1 MiB segments", 2, 0, 1 << 20),
    ("2 lanes, 4 MiB segments", 2, 0, 4 << 20),
    ("default", None, None, None),
]


def configs():
    spec = os.environ.get("BENCH_CONFIGS")
    if not spec:
        return CONFIGS_DEFAULT
    out = []
    for item in spec.split(","):
        lanes, seg_mib = item.split(":")
        out.append((f"{lanes} lane(s), {seg_mib} MiB segments", int(lanes), 0, int(float(seg_mib) * (1 << 20))))
    return out


def worker(args) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    from bagua_core import _C

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    port = int(os.environ["MASTER_PORT"]) + 1
    server = _C.TcpStoreServer("127.0.0.1", port) if rank == 0 else None
    store = _C.TcpStore("127.0.0.1", port, rank, 60.0)
    ops = {}
    for i, (name, lanes, thr, seg) in enumerate(configs()):
        if lanes is None:
            c = _C.create_gloo_communicator(store, f"tuning{i}", rank, world, 60.0, "127.0.0.1")
        else:
            c = _C._create_gloo_communicator_tuned(store, f"tuning{i}", rank, world, 60.0,
                                                   "127.0.0.1", lanes, thr, seg)
        ops[f"bagua {name}"] = c
    n = args.mib * (1 << 20) // 4
    a = np.zeros(n, np.float32)
    t = torch.zeros(n)
    runs = {"torch.distributed gloo": lambda: dist.all_reduce(t)}
    for name, c in ops.items():
        runs[name] = lambda c=c: c.allreduce(a.ctypes.data, a.ctypes.data, n, 0, 0)  # float32, SUM
    names = list(runs)
    for name in names:  # warm-up
        runs[name]()
    times = np.zeros((len(names), args.iters))
    for i in range(args.iters):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            dist.barrier()
            start = time.perf_counter()
            runs[name]()
            times[names.index(name), i] = time.perf_counter() - start
    every = [torch.zeros_like(torch.from_numpy(times)) for _ in range(world)]
    dist.all_gather(every, torch.from_numpy(times))
    slowest = torch.stack(every).amax(dim=0).numpy()
    if rank == 0:
        print(f"allreduce float32 {args.mib} MiB, {world} processes, median of {args.iters}:")
        for j, name in enumerate(names):
            med = statistics.median(slowest[j])
            print(f"  {name:34s} {med * 1e3:8.1f} ms  {n * 4 / med / 1e9:6.2f} GB/s", flush=True)
    dist.barrier()
    store.close()
    if server is not None:
        server.close()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (REPO, env.get("PYTHONPATH")) if x)
    cmd = [sys.executable, "-m", "bagua_core.run", "--nproc-per-node", str(args.nproc), "--no-prefix",
           os.path.abspath(__file__), "--worker", "--mib", str(args.mib), "--iters", str(args.iters)]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"timed out after {args.timeout} s", file=sys.stderr)
        return 1
    finally:
        if proc.poll() is None:  # bagua-run stops its workers on SIGTERM; they die with it on SIGKILL
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())
