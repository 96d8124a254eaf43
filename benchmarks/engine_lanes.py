"""Consecutive buckets with one engine lane against two, on a shaped link.

Two emulated hosts (benchmarks/_hosts.py: network namespaces, veth, ``tc tbf``
at ``--rate`` each way; needs root, else ``--no-shaping`` runs over loopback),
one process each. Each process builds two engines over the same group, one
with one lane (buckets one after the other) and one with two (bucket i on
lane i % 2: one bucket computes while the other's bytes travel), each holding
``--buckets`` buckets of ``--bucket-mib`` MiB of float32 running ``--step``.
Every round marks all buckets of one engine ready at once, as a backward pass
that ended before the first bucket left would, and times ``wait()`` (the
slower rank's time), the two engines taking turns in alternating order. Both
engines compute the same values (checked bitwise every round). Prints the
median ms per step of each and their ratio.

    sudo PYTHONPATH=$PWD .venv/bin/python benchmarks/engine_lanes.py --rate 1gbit --step bytegrad
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys

import _hosts  # benchmarks/_hosts.py
import _launch  # benchmarks/_launch.py

STEPS = ("bytegrad", "centralized_allreduce")
MASTER_PORT = 29500  # inside a fresh namespace every port is free


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="1gbit", help="tc rate each way (default 1gbit)")
    p.add_argument("--step", default="bytegrad", choices=STEPS, help="the buckets' step (default bytegrad)")
    p.add_argument("--buckets", type=int, default=8, help="buckets per engine (default 8)")
    p.add_argument("--bucket-mib", type=float, default=8.0, help="MiB of float32 per bucket (default 8)")
    p.add_argument("--rounds", type=int, default=20, help="timed steps of each engine (default 20)")
    p.add_argument("--no-shaping", action="store_true", help="skip namespaces and tc: run over loopback")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the run is stopped")
    args = p.parse_args(argv)
    if args.buckets < 2 or args.rounds < 1 or args.bucket_mib <= 0:
        p.error("--buckets must be >= 2, --rounds >= 1, --bucket-mib > 0")
    if args.no_shaping:
        args.rate = "loopback"
    else:
        try:
            _hosts.rate_bits(args.rate)
        except ValueError as e:
            p.error(str(e))
    return args


def drive(argv) -> int:
    args = parse_args(argv)
    _launch.raise_on_stop_signals()
    reason = "--no-shaping given" if args.no_shaping else _hosts.unavailable_reason()
    if reason is not None:
        if not args.no_shaping:
            print(
                f"engine_lanes.py: cannot shape the network: {reason}.\n(--no-shaping runs over loopback instead.)",
                file=sys.stderr,
            )
            return 2
        cmd = _launch.launcher_cmd(__file__, [*argv, "--no-shaping"], 2)
        return _launch.wait_all([_launch.start(cmd, _launch.worker_env())], args.timeout, "engine_lanes.py")
    secret = secrets.token_hex(32)
    with _hosts.EmulatedHosts() as hosts:
        hosts.shape(args.rate)
        procs = []
        for host in (0, 1):
            env = _launch.worker_env({"GLOO_SOCKET_IFNAME": hosts.ifaces[host], "BAGUA_STORE_SECRET": secret})
            cmd = hosts.exec_prefix(host) + _launch.launcher_cmd(
                __file__, argv, 1, nnodes=2, node_rank=host, master_addr=_hosts.ADDRESSES[0], master_port=MASTER_PORT
            )
            procs.append(_launch.start(cmd, env))
        return _launch.wait_all(procs, args.timeout, "engine_lanes.py")


def work(argv) -> int:
    args = parse_args(argv)
    import time

    import numpy as np

    import bagua_core
    from bagua_core.engine import Engine

    group = bagua_core.init_process_group()
    rank, world = group.rank, group.size
    numel = int(args.bucket_mib * (1 << 20)) // 4 // world * world  # ByteGrad: a multiple of the group size
    engines = {}
    for lanes in (1, 2):
        e = Engine.for_group(group, lanes=lanes)
        for i in range(args.buckets):
            e.add_bucket(f"b{i}", [(f"t{i}", (numel,))], "float32").append_op(args.step, average=True)
        engines[lanes] = e
    rng = np.random.default_rng(rank)
    data = [rng.normal(size=numel).astype(np.float32) for _ in range(args.buckets)]
    times = {lanes: [] for lanes in engines}

    def step(e):
        for i, b in enumerate(e.buckets):
            np.asarray(b.view(f"t{i}"))[...] = data[i]
        bagua_core.barrier(group)
        start = time.perf_counter()
        e.mark_all_ready()
        e.wait()
        elapsed = np.array([time.perf_counter() - start])
        bagua_core.allreduce_inplace(elapsed, op=bagua_core.ReduceOp.MAX, group=group)
        return float(elapsed[0])

    for e in engines.values():  # warm-up: connections, shared memory, wire packing's vote
        for _ in range(5):
            step(e)
    for r in range(args.rounds):
        for lanes in (1, 2) if r % 2 == 0 else (2, 1):
            times[lanes].append(step(engines[lanes]))
        for i in range(args.buckets):
            one, two = (np.asarray(engines[n].buckets[i].view(f"t{i}")) for n in (1, 2))
            assert np.array_equal(one.view(np.uint32), two.view(np.uint32)), f"bucket {i} differs between engines"
    if rank == 0:
        ms = {lanes: 1e3 * statistics.median(t) for lanes, t in times.items()}
        print(
            f"{args.step}, {args.buckets} buckets of {numel * 4 / 2**20:.1f} MiB, {world} ranks, link "
            f"{args.rate}, median of {args.rounds} steps (slower rank), load {os.getloadavg()[0]:.2f}:"
        )
        print(f"  1 lane : {ms[1]:8.1f} ms/step")
        print(f"  2 lanes: {ms[2]:8.1f} ms/step  ({ms[1] / ms[2]:.2f}x the one-lane speed)", flush=True)
    for e in engines.values():
        e.close()
    bagua_core.destroy_process_group()
    return 0


if __name__ == "__main__":
    if "RANK" in os.environ:
        sys.exit(work(sys.argv[1:]))
    sys.exit(drive(sys.argv[1:]))
