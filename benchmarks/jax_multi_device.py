"""JAX with several devices per process: Bagua's algorithms between the
processes (``bagua_jax.transform(algo, mesh=local_mesh)``) against XLA's own
psum across every process's devices, on emulated hosts.

    PYTHONPATH=$PWD python benchmarks/jax_multi_device.py --hosts 2 --link 1gbit   # as root
    PYTHONPATH=$PWD python benchmarks/jax_multi_device.py --no-shaping --nproc 1  # inside one host

One process per host, each splitting its CPU into ``--devices`` XLA devices
(``--xla_force_host_platform_device_count``); ``jax.distributed.initialize()``
is called without arguments (Bagua's launch contract gives it the rank, the
world size and the coordinator). Every configuration trains the same Flax MLP
on the same batches, each host's batch sharded over its devices, with plain
SGD, interleaved round by round:

    XLA psum across hosts        a mesh over every process's devices: XLA averages the gradient
                                 over all of them (JAX's CPU collectives over Gloo)
    Bagua <algorithm> (mesh=)    a mesh over the process's own devices: XLA averages over them,
                                 bagua_jax.transform(algorithm, mesh=...) between the processes
    XLA pmean inside the host    the process's own mesh and no communication between processes:
                                 the bound (with one process, the plain lax.pmean layout)

Ratios are to "XLA psum across hosts". With ``--nproc 1`` (one host, no
link), "Bagua GradientAllReduce (mesh=)" against "XLA pmean inside the host" is
the transform's own cost in this layout. Each process runs single-threaded XLA.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys

import _hosts  # benchmarks/_hosts.py: namespaces, veth, tc
import _launch  # benchmarks/_launch.py: the script is its own driver
import _training  # benchmarks/_training.py
from _training import mlp_batches

GLOBAL = "XLA psum across hosts"
LOCAL_ONLY = "XLA pmean inside the host"
ALGORITHMS = {
    "GradientAllReduce": ("gradient_allreduce", {}),
    "ByteGrad": ("bytegrad", {}),
    "LowRank": ("low_rank", {"rank": 4, "start_iter": 2, "min_compression_rate": 1.0}),
}
MASTER_PORT = 29620


def bagua_config(name: str) -> str:
    return f"Bagua {name} (mesh=)"


CONFIGS = (GLOBAL, *(bagua_config(n) for n in ALGORITHMS), LOCAL_ONLY)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts, one process each (default 2)")
    p.add_argument("--devices", type=int, default=4, help="XLA devices per process (default 4)")
    p.add_argument("--link", default="1gbit", help="each host's link, each way (tc rate; default 1gbit)")
    p.add_argument("--no-shaping", action="store_true", help="no namespaces: processes on loopback")
    p.add_argument("--nproc", type=int, default=None, help="with --no-shaping: processes (default --hosts)")
    p.add_argument("--batch-per-device", type=int, default=8)
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--steps", type=int, default=2, help="timed steps per configuration per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 warm-up step, 2 rounds of 1 step")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--cleanup", action="store_true", help="remove namespaces left by killed runs, then exit")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_per_device, args.features, args.hidden, args.steps, args.warmup, args.rounds = 2, 16, 32, 1, 3, 2
    if min(args.hosts, args.devices, args.batch_per_device, args.steps, args.rounds) < 1 or args.warmup < 3:
        p.error("sizes and counts must be positive, and --warmup >= 3 (LowRank compresses from step 2)")
    if args.nproc is None:
        args.nproc = args.hosts
    return args


# ---------------------------------------------------------------- driver ---


def drive(argv) -> int:
    args = parse_args(argv)
    _launch.raise_on_stop_signals()
    rc, reason = _hosts.prepare(args, "jax_multi_device.py", "one run over loopback")
    if rc is not None:
        return rc
    if reason is not None:  # --no-shaping, or --smoke without root: over loopback
        return _launch.drive(__file__, argv, args.nproc, args.timeout)
    secret = secrets.token_hex(32)
    with _hosts.EmulatedHosts(args.hosts) as hosts:
        hosts.shape(args.link)
        print(f"{args.hosts} emulated hosts, {args.link} each way, {args.devices} XLA devices each", flush=True)
        procs = []
        for host in range(args.hosts):
            env = _launch.worker_env({"GLOO_SOCKET_IFNAME": hosts.ifaces[host], "BAGUA_STORE_SECRET": secret})
            cmd = hosts.exec_prefix(host) + _launch.launcher_cmd(
                __file__,
                argv,
                1,
                nnodes=args.hosts,
                node_rank=host,
                master_addr=_hosts.ADDRESSES[0],
                master_port=MASTER_PORT,
            )
            procs.append(_launch.start(cmd, env))
        return _launch.wait_all(procs, args.timeout, "jax_multi_device.py")


# ---------------------------------------------------------------- worker ---


def work(argv) -> int:
    args = parse_args(argv)
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={args.devices} --xla_cpu_multi_thread_eigen=false"
    )
    import jax
    import numpy as np
    import optax
    from jax.sharding import Mesh

    import bagua_core
    import bagua_jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize()  # Bagua's cluster environment: rank, world size, coordinator
    group = bagua_jax.init_process_group()
    rank, world = group.rank, group.size
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    everyone = jax.make_mesh((world * args.devices,), ("dp",), devices=jax.devices())
    mine = Mesh(np.array(jax.local_devices()), ("dp",))
    rows = args.batch_per_device * args.devices
    batches = mlp_batches(rank, rows, args.features, args.classes)
    n_params = _training.mlp_parameters(args.features, args.hidden, args.classes)
    say(
        f"MLP {args.features}-{args.hidden}-{args.hidden}-{args.classes}: {n_params / 1e6:.2f} M parameters; "
        f"{world} process(es) x {args.devices} devices, batch {rows} per process"
    )

    def trainer(name, tx, mesh):
        return _training.JaxTrainer(name, args.features, args.hidden, args.classes, batches, tx, mesh)

    sgd = optax.sgd(0.01)
    trainers = [trainer(GLOBAL, sgd, everyone)]
    for name, (registered, options) in ALGORITHMS.items():
        algo = bagua_jax.algorithms.Algorithm.init(registered, **options)
        trainers.append(trainer(bagua_config(name), optax.chain(bagua_jax.transform(algo, mesh=mine), sgd), mine))
    trainers.append(trainer(LOCAL_ONLY, sgd, mine))
    samples = args.steps * rows * world
    per_round = _training.interleaved_rounds(
        trainers, args.warmup, args.rounds, args.steps, samples, bagua_core.barrier
    )
    base = per_round[GLOBAL]
    results = {
        name: {
            "samples_per_s": statistics.median(per_round[name]),
            "rounds": per_round[name],
            "ratio_to_xla_psum": statistics.median(a / b for a, b in zip(per_round[name], base)),
            "loss": t.loss,
        }
        for name, t in zip(CONFIGS, trainers)
    }
    bound = per_round[LOCAL_ONLY]
    overhead = statistics.median(b / a for a, b in zip(per_round[bagua_config("GradientAllReduce")], bound)) - 1
    if rank == 0:
        print("\n| configuration | samples/s | ratio to XLA psum across hosts | last loss |")
        print("|---|---:|---:|---:|")
        for name in CONFIGS:
            r = results[name]
            print(f"| {name} | {r['samples_per_s']:.1f} | {r['ratio_to_xla_psum']:.2f}x | {r['loss']:.3f} |")
        print(f"\nBagua GradientAllReduce (mesh=) step time over XLA pmean inside the host: {overhead:+.1%}")
        if args.json:
            with open(args.json, "w") as f:
                doc = {
                    "results": results,
                    "configs": list(CONFIGS),
                    "processes": world,
                    "devices_per_process": args.devices,
                    "link": None if args.no_shaping else args.link,
                    "parameters": int(n_params),
                    "batch_per_process": rows,
                    "gradient_allreduce_over_local_bound": overhead,
                }
                json.dump(doc, f, indent=2)
    bagua_core.barrier()
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(_launch.main_driver("jax_multi_device.py", work, drive))
