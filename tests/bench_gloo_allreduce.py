"""Allreduce throughput: bagua's Gloo communicator vs torch.distributed gloo.

Run on N processes (default 2) in one go, both libraries in the same
processes, measurements interleaved so that machine noise hits both alike:

    PYTHONPATH=$PWD python tests/bench_gloo_allreduce.py [--mib 64] [--iters 5] [--nproc 2] [--dtype float16]

Prints algorithm bandwidth (buffer bytes / time) per configuration, median of
the iterations. torch uses MASTER_PORT, bagua's store MASTER_PORT + 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

CONFIGS_DEFAULT = [
    # name, lanes, lane_threshold_bytes, segment_bytes
    ("bagua 1 lane, 1 MiB segments", 1, 1 << 62, 1 << 20),
    ("bagua 1 lane, 4 MiB segments", 1, 1 << 62, 4 << 20),
    ("bagua 2 lanes, 1 MiB segments", 2, 0, 1 << 20),
    ("bagua 2 lanes, 4 MiB segments", 2, 0, 4 << 20),
    ("bagua default", None, None, None),
]
# BENCH_CONFIGS="lanes:segment_mib,..." replaces the list (exploring settings).
CONFIGS = CONFIGS_DEFAULT
if os.environ.get("BENCH_CONFIGS"):
    CONFIGS = [(f"bagua {l} lane(s), {s} MiB segments", int(l), 0, int(float(s) * (1 << 20)))
               for l, s in (c.split(":") for c in os.environ["BENCH_CONFIGS"].split(","))]


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from bagua_core import _C

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    port = int(os.environ["MASTER_PORT"]) + 1
    server = _C.TcpStoreServer("127.0.0.1", port) if rank == 0 else None
    store = _C.TcpStore("127.0.0.1", port, rank, 60.0)
    comms = {}
    for i, (name, lanes, thr, seg) in enumerate(CONFIGS):
        if lanes is None:
            comms[name] = _C.create_gloo_communicator(store, f"bench{i}", rank, world, 60.0, "127.0.0.1")
        else:
            comms[name] = _C._create_gloo_communicator_tuned(store, f"bench{i}", rank, world, 60.0,
                                                             "127.0.0.1", lanes, thr, seg)
    codes = {"float32": 0, "float16": 2, "bfloat16": 3}
    size = 4 if args.dtype == "float32" else 2
    n = args.mib * (1 << 20) // size
    t = torch.ones(n, dtype=getattr(torch, args.dtype))
    a = t.clone()
    times = {"torch.distributed gloo": []}
    times.update({name: [] for name in comms})

    def timed(fn):
        dist.barrier()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    for it in range(args.iters + 1):  # first round warms up
        d = timed(lambda: dist.all_reduce(t))
        if it:
            times["torch.distributed gloo"].append(d)
        for name, c in comms.items():
            d = timed(lambda: c.allreduce(a.data_ptr(), a.data_ptr(), n, codes[args.dtype], 0))
            if it:
                times[name].append(d)
    if rank == 0:
        nbytes = n * size
        print(f"allreduce {args.dtype} {args.mib} MiB, {world} processes, median of {args.iters}:")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:34s} {med * 1e3:8.1f} ms  {nbytes / med / 1e9:6.2f} GB/s")
    dist.barrier()
    store.close()
    if server is not None:
        server.close()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--worker", action="store_true")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.mp import launch

    run = launch(os.path.abspath(__file__), args.nproc, timeout=300,
                 args=["--worker", "--mib", str(args.mib), "--iters", str(args.iters), "--dtype", args.dtype])
    for w in run.workers:
        sys.stdout.write(w.stdout)
        if w.returncode != 0:
            sys.stdout.write(f"rank {w.rank} rc={w.returncode}\n{w.stderr[-3000:]}\n")


if __name__ == "__main__":
    main()
