"""Collective bandwidth: Bagua against torch.distributed (gloo) and JAX's own CPU collectives.

    PYTHONPATH=$PWD python benchmarks/collectives.py [--world-size 2 4] [--sizes 1K 64M]
        [--ops allreduce allgather alltoall] [--iters 10] [--json results.json]

For each world size the script launches that many processes with ``bagua-run``
(``python -m bagua_core.run``). Every process joins all three systems at once:
torch.distributed (gloo) on ``MASTER_PORT``, Bagua's store on ``MASTER_PORT + 1``
and JAX's coordinator (``jax.distributed.initialize`` with the CPU backend's
gloo collectives, one CPU device per process, a jitted ``shard_map`` over the
global mesh) on a third free port. Per operation and size the systems take
turns, sample by sample, in a rotating order, so machine-load drift hits them
alike.

Sizes follow nccl-tests: the per-rank buffer for allreduce, the per-rank
*output* for allgather (each rank contributes size / world), the per-rank send
buffer (= receive buffer) for alltoall; float32 elements. Bandwidth is
algorithmic: size / time. A sample is the wall time of ``reps`` back-to-back
calls (reps = 1 MiB / size, between 1 and 20) divided by reps, taken after a
barrier; a sample's time is the slowest rank's, and the table shows the median
of ``--iters`` samples after ``--warmup`` untimed calls. Each system's result
is checked against the expected values once per operation and size before it
is timed.

Bagua calls ``allreduce_inplace``, ``allgather`` and ``alltoall`` on numpy
arrays; torch ``all_reduce``, ``all_gather_single`` (``all_gather_into_tensor``
before torch 2.13) and ``all_to_all_single`` on CPU tensors; JAX ``psum``
(input donated), ``all_gather`` (tiled) and ``all_to_all`` (tiled, input
donated) inside ``jax.jit(shard_map(...))``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMS = ("bagua", "torch", "jax")
OPS = ("allreduce", "allgather", "alltoall")
DEFAULT_SIZES = ("1K", "16K", "256K", "4M", "64M", "256M")
ELEM_BYTES = 4  # float32
REPS_TARGET_BYTES = 1 << 20
MAX_REPS = 20
# Buffers per process at the largest size, counted generously (inputs, outputs,
# JAX's fresh outputs and staging), plus the interpreter with torch and jax.
BUFFERS_PER_PROCESS = 8
BASE_BYTES_PER_PROCESS = 1 << 30


# --- sizes and formatting ----------------------------------------------------

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}


def parse_size(text: str) -> int:
    """'1K' -> 1024, '64M' -> 64 MiB, '4096' -> 4096 (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (use e.g. 1K, 64M, 1G or bytes)")
    n = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if n < ELEM_BYTES:
        raise argparse.ArgumentTypeError(f"size {text!r} is below one float32 element")
    return n


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def elements(size: int, world: int) -> int:
    """float32 elements of a size-byte buffer, rounded down to a multiple of world (>= world)."""
    return max(world, size // ELEM_BYTES // world * world)


def reps_for(size: int) -> int:
    return max(1, min(MAX_REPS, REPS_TARGET_BYTES // size))


# --- worker: the three systems ----------------------------------------------


def _input(op: str, n: int, world: int, rank: int):
    """This rank's input (numpy float32); n is the size in elements (see the module doc)."""
    import numpy as np

    chunk = n // world
    if op == "allreduce":
        return np.full(n, rank + 1, np.float32)
    if op == "allgather":
        return np.full(chunk, rank + 1, np.float32)
    # alltoall: chunk j of rank r holds r * world + j
    return np.repeat(np.arange(world, dtype=np.float32) + rank * world, chunk)


def _check(fn: str, op: str, got, world: int, rank: int) -> None:
    """Raises unless ``got`` (the output, n elements) is what every rank's _input gives."""
    import numpy as np

    ranks = np.arange(world, dtype=np.float32)
    if op == "allreduce":
        want = np.full(1, world * (world + 1) / 2, np.float32)
    elif op == "allgather":
        want = ranks + 1  # chunk j comes from rank j
    else:
        want = ranks * world + rank  # chunk j is chunk `rank` of rank j
    rows = got.reshape(len(want), -1)  # compared row by row: no full-size expected array
    if not (rows == want[:, None]).all():
        raise AssertionError(f"{fn}: wrong result: first values {got.ravel()[:4]}, want chunks of {want}")


class BaguaCase:
    def __init__(self, op, n, world, rank):
        import numpy as np

        import bagua_core as bc

        self.bc, self.op = bc, op
        self.send = _input(op, n, world, rank)
        self.recv = self.send if op == "allreduce" else np.empty(n, np.float32)
        self.run(1)
        _check(f"bagua {op}", op, self.recv, world, rank)
        self.send.fill(0)  # repeated in-place sums must not overflow

    def run(self, reps):
        bc, send, recv = self.bc, self.send, self.recv
        fn = {
            "allreduce": lambda: bc.allreduce_inplace(send),
            "allgather": lambda: bc.allgather(send, recv),
            "alltoall": lambda: bc.alltoall(send, recv),
        }[self.op]
        for _ in range(reps):
            fn()

    def close(self):
        self.send = self.recv = None


class TorchCase:
    def __init__(self, op, n, world, rank):
        import torch
        import torch.distributed as dist

        self.dist, self.op = dist, op
        self.send = torch.from_numpy(_input(op, n, world, rank))
        self.recv = self.send if op == "allreduce" else torch.empty(n, dtype=torch.float32)
        self.run(1)
        _check(f"torch {op}", op, self.recv.numpy(), world, rank)
        self.send.zero_()

    def run(self, reps):
        dist, send, recv = self.dist, self.send, self.recv
        # all_gather_single is all_gather_into_tensor's new name (torch >= 2.13)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        fn = {
            "allreduce": lambda: dist.all_reduce(send),
            "allgather": lambda: gather(recv, send),
            "alltoall": lambda: dist.all_to_all_single(recv, send),
        }[self.op]
        for _ in range(reps):
            fn()

    def close(self):
        self.send = self.recv = None


class JaxSystem:
    """JAX's multi-process CPU collectives: one CPU device per process, a global mesh."""

    def __init__(self, port: int, rank: int, world: int, timeout: int):
        import jax

        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=world,
            process_id=rank,
            initialization_timeout=timeout,
        )
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        try:
            from jax import shard_map
        except ImportError:  # older jax
            from jax.experimental.shard_map import shard_map

        if len(jax.devices()) != world:
            raise RuntimeError(f"JAX sees {len(jax.devices())} devices, expected one per process ({world})")
        self.jax = jax
        mesh = Mesh(np.array(jax.devices()), ("x",))
        self.sharding = NamedSharding(mesh, P("x"))

        def sharded(body, donate):
            f = shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
            return jax.jit(f, donate_argnums=(0,) if donate else ())

        self.fns = {
            "allreduce": sharded(lambda x: jax.lax.psum(x, "x"), donate=True),
            "allgather": sharded(lambda x: jax.lax.all_gather(x, "x", tiled=True), donate=False),
            "alltoall": sharded(lambda x: jax.lax.all_to_all(x, "x", 0, 0, tiled=True), donate=True),
        }

    def put(self, local):
        return self.jax.make_array_from_process_local_data(self.sharding, local)

    def shutdown(self):
        self.jax.distributed.shutdown()


class JaxCase:
    def __init__(self, system: JaxSystem, op, n, world, rank):
        import numpy as np

        self.fn = system.fns[op]
        self.chain = op != "allgather"  # donated: the output is the next input
        send = _input(op, n, world, rank)
        self.x, shape = system.put(send), send.shape
        del send
        out = self.fn(self.x)
        _check(f"jax {op}", op, np.asarray(out.addressable_data(0)), world, rank)
        if self.chain:
            out.delete()
            self.x = system.put(np.zeros(shape, np.float32))
        self.out = out

    def run(self, reps):
        fn = self.fn
        if self.chain:
            x = self.x
            for _ in range(reps):
                x = fn(x)
            x.block_until_ready()
            self.x = x
        else:
            for _ in range(reps):
                self.out = None  # one output alive at a time
                self.out = fn(self.x)
            self.out.block_until_ready()

    def close(self):
        for a in (self.x, self.out):
            if not a.is_deleted():
                a.delete()
        self.x = self.out = None


def worker(args) -> None:
    import datetime
    import resource

    import numpy as np

    import bagua_core as bc

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    bc.init_process_group()
    unavailable: Dict[str, str] = {}
    if "torch" in args.systems:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=args.op_timeout)
        )
    jax_system = None
    if "jax" in args.systems:
        try:
            jax_system = JaxSystem(args.jax_port, rank, world, args.op_timeout)
        except Exception as e:  # noqa: BLE001 - reported in the table rather than failing the run
            unavailable["jax"] = f"{type(e).__name__}: {e}"
    # Every rank must agree on which systems run.
    flags = np.array([jax_system is not None], np.uint8)
    everyone = bc.allgather(flags, np.empty(world, np.uint8))
    if jax_system is not None and not everyone.all():
        unavailable["jax"] = "JAX failed to start on another rank"
    systems = [s for s in args.systems if s not in unavailable]

    def make(name, op, n):
        if name == "bagua":
            return BaguaCase(op, n, world, rank)
        if name == "torch":
            return TorchCase(op, n, world, rank)
        return JaxCase(jax_system, op, n, world, rank)

    results = []
    for op in args.ops:
        for size in args.sizes:
            n = elements(size, world)
            nbytes, reps = n * ELEM_BYTES, reps_for(size)
            cases = {s: make(s, op, n) for s in systems}
            for case in cases.values():
                case.run(args.warmup)
            times = np.zeros((len(systems), args.iters))
            for i in range(args.iters):
                k = i % len(systems)
                for name in systems[k:] + systems[:k]:
                    bc.barrier()
                    t0 = time.perf_counter()
                    cases[name].run(reps)
                    times[systems.index(name), i] = (time.perf_counter() - t0) / reps
            for case in cases.values():
                case.close()
            del cases
            # A sample lasts as long as its slowest rank.
            slowest = bc.allgather(times, np.empty((world,) + times.shape)).max(axis=0)
            row = {"op": op, "world_size": world, "size_bytes": nbytes, "reps": reps, "iters": args.iters}
            for j, s in enumerate(systems):
                med = statistics.median(slowest[j])
                row[f"{s}_s"] = med
                row[f"{s}_gbps"] = nbytes / med / 1e9
            results.append(row)
            if rank == 0:
                speeds = "  ".join(f"{s} {row[f'{s}_gbps']:.3f}" for s in systems)
                print(f"world {world} {op:9s} {format_size(nbytes):>8s}  GB/s: {speeds}", flush=True)

    peak = np.array([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], np.int64)
    peaks = bc.allgather(peak, np.empty(world, np.int64))
    bc.barrier()
    if jax_system is not None:
        jax_system.shutdown()
    if "torch" in args.systems:
        dist.destroy_process_group()
    if rank == 0:
        versions = {m: sys.modules[m].__version__ for m in ("numpy", "torch", "jax", "bagua_core") if m in sys.modules}
        with open(args.result_file, "w") as f:
            json.dump(
                {
                    "results": results,
                    "unavailable": unavailable,
                    "versions": versions,
                    "peak_rss_bytes": [int(p) for p in peaks],
                },
                f,
            )
    bc.destroy_process_group()


# --- launcher side -------------------------------------------------------------


def _free_port(avoid) -> int:
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p not in avoid:
            return p
    raise RuntimeError("no free port")


def _mem_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _pump(stream, keep: deque, echo: bool) -> None:
    for line in iter(stream.readline, ""):
        keep.append(line)
        if echo:
            sys.stderr.write(line)
            sys.stderr.flush()


def run_world(args, world: int) -> dict:
    """Launches `world` processes; returns rank 0's results."""
    sys.path.insert(0, REPO)
    from bagua_core.launcher.ports import free_master_ports

    master_port = free_master_ports()
    jax_port = _free_port({master_port, master_port + 1})
    with tempfile.TemporaryDirectory(prefix="bagua-bench-") as tmp:
        result_file = os.path.join(tmp, "result.json")
        cmd = [
            sys.executable,
            "-m",
            "bagua_core.run",
            "--nproc-per-node",
            str(world),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(master_port),
            os.path.abspath(__file__),
            "--worker",
            "--result-file",
            result_file,
            "--jax-port",
            str(jax_port),
            "--iters",
            str(args.iters),
            "--warmup",
            str(args.warmup),
            "--op-timeout",
            str(args.op_timeout),
            "--ops",
            *args.ops,
            "--systems",
            *args.systems,
            "--sizes",
            *map(str, args.sizes),
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        env["BAGUA_TIMEOUT"] = str(args.op_timeout)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA's start-up chatter
        env.pop("BAGUA_STORE_PORT", None)  # the store goes on MASTER_PORT + 1
        tail: deque = deque(maxlen=200)
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        reader = threading.Thread(target=_pump, args=(proc.stdout, tail, not args.quiet), daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None:  # timed out or interrupted: bagua-run stops its workers on SIGTERM
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)  # workers die with it (parent-death signal)
                    proc.wait()
            reader.join(timeout=5)
        if rc != 0 or not os.path.exists(result_file):
            why = f"timed out after {args.timeout} s" if rc is None else f"exit code {rc}"
            raise RuntimeError(f"benchmark at world size {world} failed ({why}); last output:\n" + "".join(tail))
        with open(result_file) as f:
            return json.load(f)


def _cell(value: Optional[float], fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def markdown_table(rows: List[dict]) -> str:
    head = ["procs", "op", "size", "bagua GB/s", "torch GB/s", "jax GB/s", "bagua/torch", "bagua/jax"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if i > 1 else "---" for i in range(len(head))) + "|"]
    for r in rows:
        b, t, j = (r.get(f"{s}_gbps") for s in SYSTEMS)
        cells = [
            str(r["world_size"]),
            r["op"],
            format_size(r["size_bytes"]),
            _cell(b, ".3g"),
            _cell(t, ".3g"),
            _cell(j, ".3g"),
            _cell(b / t if b and t else None, ".2f"),
            _cell(b / j if b and j else None, ".2f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--world-size", type=int, nargs="+", default=[2], help="process counts (default: 2)")
    p.add_argument(
        "--sizes",
        type=parse_size,
        nargs="+",
        default=[parse_size(s) for s in DEFAULT_SIZES],
        help=f"buffer sizes, binary units (default: {' '.join(DEFAULT_SIZES)})",
    )
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument(
        "--systems",
        nargs="+",
        choices=SYSTEMS,
        default=list(SYSTEMS),
        help="bagua always runs (its store carries the barriers)",
    )
    p.add_argument("--iters", type=int, default=10, help="timed samples per system, op and size (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls before timing (default 2)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--timeout", type=float, default=900, help="seconds per world size before everything is killed")
    p.add_argument("--op-timeout", type=int, default=120, help="seconds any one blocking call may take")
    p.add_argument("--quiet", action="store_true", help="do not echo the workers' progress to stderr")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    p.add_argument("--jax-port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if any(w < 2 for w in args.world_size):
        p.error("--world-size values must be >= 2")
    if "bagua" not in args.systems:
        args.systems = ["bagua"] + args.systems
    args.systems = [s for s in SYSTEMS if s in args.systems]  # fixed column order
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    need = max(args.world_size) * (BUFFERS_PER_PROCESS * max(args.sizes) + BASE_BYTES_PER_PROCESS)
    avail = _mem_available()
    if avail is not None and need > avail:
        print(
            f"error: up to {need / 2**30:.1f} GiB may be needed but only {avail / 2**30:.1f} GiB "
            "are available: use smaller --sizes or --world-size",
            file=sys.stderr,
        )
        return 2
    started = time.time()
    load_before = os.getloadavg()
    rows, unavailable, peak_rss = [], {}, {}
    for world in args.world_size:
        try:
            out = run_world(args, world)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        rows += out["results"]
        unavailable.update(out["unavailable"])
        versions = out["versions"]
        peak_rss[world] = max(out["peak_rss_bytes"])
    load_after = os.getloadavg()
    elapsed = time.time() - started
    for s in SYSTEMS:
        if s not in args.systems:
            unavailable.setdefault(s, "not selected (--systems)")
    print(markdown_table(rows))
    print()
    print(
        f"float32, median of {args.iters} samples after {args.warmup} warm-up calls; "
        f"GB/s = size / time (10^9 bytes/s); {os.cpu_count()} CPUs, 1-minute load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (with this run's own processes); "
        f"{elapsed:.0f} s; peak RSS per process "
        + ", ".join(f"{peak_rss[w] / 2**20:.0f} MiB at {w} procs" for w in args.world_size)
        + "."
    )
    for s, why in unavailable.items():
        print(f"{s}: n/a: {why}")
    if args.json:
        import platform

        doc = {
            "command": [os.path.basename(sys.executable)] + sys.argv,
            "rows": rows,
            "unavailable": unavailable,
            "iters": args.iters,
            "warmup": args.warmup,
            "dtype": "float32",
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "elapsed_s": elapsed,
            "versions": versions,
            "peak_rss_bytes": {str(w): b for w, b in peak_rss.items()},
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
