"""Allreduce bandwidth of Bagua's Gloo communicator per transport setting, against torch's gloo.

For choosing the defaults of ``GlooCommunicatorOptions`` (lanes,
lane_threshold_bytes, segment_bytes over TCP; shm_window_bytes and
shm_threshold_bytes of the shared-memory allreduce); ``benchmarks/collectives.py``
measures the defaults across operations and sizes.

    PYTHONPATH=$PWD python benchmarks/gloo_tuning.py [--mib 64] [--iters 10] [--nproc 2]
    BENCH_CONFIGS="1:1,2:4,shm:256" ... # TCP lanes:segment_MiB or shm:window_KiB,... replaces the list below

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


def tcp(lanes, segment_mib):
    thr = 1 << 62 if lanes == 1 else 0
    return (
        f"TCP {lanes} lane(s), {segment_mib:g} MiB segments",
        dict(shm=False, lanes=lanes, lane_threshold_bytes=thr, segment_bytes=int(segment_mib * (1 << 20))),
    )


def shm(window_kib):
    return f"shm, {window_kib:g} KiB window", dict(
        shm=True, shm_threshold_bytes=0, shm_window_bytes=int(window_kib * 1024)
    )


# name, options of _create_gloo_communicator_tuned (None: create_gloo_communicator's defaults)
CONFIGS_DEFAULT = [
    tcp(1, 1),
    tcp(1, 4),
    tcp(2, 1),
    tcp(2, 4),
    ("TCP default", dict(shm=False)),
    shm(256),
    shm(1024),
    shm(4096),
    ("default", None),
]


def configs():
    spec = os.environ.get("BENCH_CONFIGS")
    if not spec:
        return CONFIGS_DEFAULT
    out = []
    for item in spec.split(","):
        a, b = item.split(":")
        out.append(shm(float(b)) if a == "shm" else tcp(int(a), float(b)))
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
    for i, (name, options) in enumerate(configs()):
        if options is None:
            c = _C.create_gloo_communicator(store, f"tuning{i}", rank, world, 60.0, "127.0.0.1")
        else:
            c = _C._create_gloo_communicator_tuned(store, f"tuning{i}", rank, world, 60.0, "127.0.0.1", **options)
        ops[f"bagua {name}"] = c
    n = int(args.mib * (1 << 20)) // 4
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
        print(f"allreduce float32 {args.mib:g} MiB, {world} processes, median of {args.iters}:")
        for j, name in enumerate(names):
            med = statistics.median(slowest[j])
            print(f"  {name:40s} {med * 1e3:8.2f} ms  {n * 4 / med / 1e9:6.2f} GB/s", flush=True)
    dist.barrier()
    store.close()
    if server is not None:
        server.close()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, default=64)
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
    cmd = [
        sys.executable,
        "-m",
        "bagua_core.run",
        "--nproc-per-node",
        str(args.nproc),
        "--no-prefix",
        os.path.abspath(__file__),
        "--worker",
        "--mib",
        str(args.mib),
        "--iters",
        str(args.iters),
    ]
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
