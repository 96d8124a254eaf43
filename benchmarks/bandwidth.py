"""Throughput under shaped bandwidth: torch DDP and its hooks against Bagua's algorithms on two
emulated hosts, at a list of link rates (Bagua's headline figure, at this machine's scale).

    sudo PYTHONPATH=$PWD .venv/bin/python benchmarks/bandwidth.py [--rates 10gbit,1gbit,100mbit]
        [--nproc-per-host 1|2] [--steps 3] [--out-dir bandwidth_results] [--time-to-loss]

The driver (this script run without RANK) creates two hosts: two network namespaces joined by a
veth pair, each direction shaped with ``tc tbf`` (see benchmarks/_hosts.py). That needs root
(CAP_NET_ADMIN); without it the script stops and says so, unless ``--no-shaping`` or ``--smoke``
is given: then shaping is skipped (with that message) and one run goes over loopback. For each
rate it shapes the link, starts ``bagua-run --nnodes 2`` in each namespace (``--nproc-per-host``
workers each) and collects rank 0's results. Whatever happens (failure, timeout, Ctrl-C,
SIGTERM), the namespaces and their veth pair are removed at the end; a run killed with SIGKILL
leaves them behind, and the next run (or ``--cleanup``) removes them.

Every configuration trains the same MLP (1024 -> 2048 -> 2048 -> 10, 6.3 M parameters, the
model of benchmarks/jax_transform.py) from the same initial weights on the same batches (32 per
rank), side by side in the same processes (benchmarks/_training.py):

    DDP, DDP+fp16, DDP+PowerSGD    torch DistributedDataParallel over gloo, with no hook, the fp16
                                   compress hook, the PowerSGD hook (rank 1, from step 2; one bucket)
    Bagua GradientAllReduce, Bagua ByteGrad, Bagua ByteGrad+EF, Bagua Decentralized, Bagua
    LowPrecisionDecentralized, Bagua QAdam, Bagua LowRank, Bagua LocalSteps, Bagua LocalSteps+8bit
                                   ``model.with_bagua([opt], Algorithm())``, defaults (10 MiB buckets;
                                   +EF: error_feedback=True; LowRank: rank 1 from step 2, as the hook;
                                   LocalSteps: synchronises every 8 steps, outer Nesterov SGD 0.7/0.9;
                                   +8bit: compression="minmax_uint8", error_feedback=True)
    JAX Bagua GradientAllReduce    Flax, ``optax.chain(bagua_jax.transform(GradientAllReduceAlgorithm()),
                                   optax.sgd(0.01, momentum=0.9))`` under jax.jit

A Bagua configuration followed by " 1 lane" (e.g. ``Bagua ByteGrad 1 lane``) runs with one engine lane
(``BAGUA_ENGINE_LANES=1``: consecutive buckets one after the other) beside the default two. A Bagua
gradient configuration followed by " overlap" (``Bagua ByteGrad overlap`` is in the default list) wraps
with ``overlap_optimizer=True``: backward does not wait for the exchange, and ``optimizer.step()``
updates each bucket's parameters as that bucket's exchange finishes. ``no communication`` (not in the
default list) runs the same steps without communicating: the compute a step cannot go below here.

SGD with momentum (lr 0.01, 0.9) except QAdam (lr 1e-3, eps 1e-3, warming up during the untimed
steps, so the timed steps communicate compressed momentum). One torch thread and single-threaded
XLA per process.

Throughput mode (default): ``--warmup`` untimed steps of each configuration, then ``--steps``
rounds of one step of every configuration between two barriers, every other round in reverse
order (the load of others on a shared machine then touches all alike). Reported: median step
time, samples/s of all ranks, and the median of the per-round ratios to DDP.

``--time-to-loss``: each configuration in turn trains from the initial weights until the mean
loss over ranks reaches ``--target-loss`` (or ``--max-steps`` / ``--max-seconds``); loss against
wall-clock time from the first step (one-off costs such as JIT compilation included).

Outputs in ``--out-dir``: bandwidth.json, bandwidth.png (samples/s against bandwidth, one line per
configuration) and bandwidth.md (the table, also printed); time_to_loss.{json,png,md} in that mode.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import statistics
import sys
import tempfile
import time

import _hosts  # benchmarks/_hosts.py: namespaces, veth, tc
import _launch  # benchmarks/_launch.py: launchers, signals, timeouts
import _report  # benchmarks/_report.py: load, JSON, table, plots
import _training  # benchmarks/_training.py: models, trainers, timing

CONFIGS = (
    "DDP",
    "DDP+fp16",
    "DDP+PowerSGD",
    "Bagua GradientAllReduce",
    "Bagua ByteGrad",
    "Bagua ByteGrad overlap",
    "Bagua ByteGrad+EF",
    "Bagua Decentralized",
    "Bagua LowPrecisionDecentralized",
    "Bagua QAdam",
    "Bagua LowRank",
    "Bagua LocalSteps",
    "Bagua LocalSteps+8bit",
    "JAX Bagua GradientAllReduce",
)
# Not run by default: the same steps without communication (the compute a step cannot go below).
EXTRA_CONFIGS = ("no communication",)
BASELINE = "DDP"
JAX_CONFIG = "JAX Bagua GradientAllReduce"
DEFAULT_RATES = "10gbit,1gbit,100mbit"
UNSHAPED = "loopback (unshaped)"
MASTER_PORT = 29500  # inside a fresh namespace every port is free
COLLECTIVE_TIMEOUT_S = 300


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default=DEFAULT_RATES, help=f"comma-separated tc rates (default {DEFAULT_RATES})")
    p.add_argument("--nproc-per-host", type=int, default=1, choices=(1, 2), help="workers per host (default 1)")
    p.add_argument(
        "--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS + EXTRA_CONFIGS)
    )
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of each configuration first (default 2)")
    p.add_argument("--steps", type=int, default=3, help="timed steps (rounds) per configuration (default 3)")
    p.add_argument("--time-to-loss", action="store_true", help="train each configuration to --target-loss")
    p.add_argument("--target-loss", type=float, default=0.5, help="mean loss over ranks to reach (default 0.5)")
    p.add_argument("--max-steps", type=int, default=300, help="time-to-loss: steps at most per configuration")
    p.add_argument("--max-seconds", type=float, default=300.0, help="time-to-loss: seconds at most per configuration")
    p.add_argument("--out-dir", default="bandwidth_results", help="where the JSON, PNG and table go")
    p.add_argument("--no-shaping", action="store_true", help="skip namespaces and tc: one run over loopback")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny model, 1 warm-up and 2 timed steps; runs unshaped when shaping is not possible",
    )
    p.add_argument("--cleanup", action="store_true", help="only remove namespaces left by killed runs, then exit")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per rate before the run is stopped")
    p.add_argument("--result", help=argparse.SUPPRESS)  # worker: where rank 0 writes its results
    p.add_argument("--link", default=UNSHAPED, help=argparse.SUPPRESS)  # worker: the rate it runs under
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_size, args.features, args.hidden, args.warmup, args.steps = 4, 16, 32, 1, 2
        args.max_steps, args.max_seconds = min(args.max_steps, 5), min(args.max_seconds, 30.0)
    args.configs = _training.parse_configs(p, args.configs, CONFIGS + EXTRA_CONFIGS, BASELINE)
    args.rates = tuple(r.strip().lower() for r in args.rates.split(",") if r.strip())
    try:
        if not args.rates:
            raise ValueError("--rates is empty")
        for r in args.rates:
            _hosts.rate_bits(r)
    except ValueError as e:
        p.error(str(e))
    if (
        min(args.batch_size, args.features, args.hidden, args.classes, args.steps, args.max_steps) < 1
        or args.warmup < 0
        or args.max_seconds <= 0
    ):
        p.error("sizes and counts must be positive (warm-up >= 0)")
    return args


# ---------------------------------------------------------------- driver ---


def drive(args, argv) -> int:
    rc, reason = _hosts.prepare(args, "bandwidth.py", "one run over loopback")
    if rc is not None:
        return rc
    os.makedirs(args.out_dir, exist_ok=True)
    _launch.raise_on_stop_signals()
    load_before, uptime_before = os.getloadavg(), _report.uptime()
    t0 = time.perf_counter()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bagua-bw-") as tmp:
        rc = _run_unshaped(args, argv, tmp, runs) if reason is not None else _run_shaped(args, argv, tmp, runs)
    if rc != 0:
        return rc
    doc = {
        "mode": "time_to_loss" if args.time_to_loss else "throughput",
        "links": list(runs),
        "configs": list(args.configs),
        "runs": runs,
        "nproc_per_host": args.nproc_per_host,
        "batch_size": args.batch_size,
        "warmup": args.warmup,
        "steps": args.steps,
        "model": {
            "features": args.features,
            "hidden": args.hidden,
            "classes": args.classes,
            "parameters": _training.mlp_parameters(args.features, args.hidden, args.classes),
        },
        "shaping": reason is None,
        "shaping_skipped_because": reason,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "uptime_before": uptime_before,
        "uptime_after": _report.uptime(),
        "cpus": os.cpu_count(),
        "seconds": time.perf_counter() - t0,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }
    if args.time_to_loss:
        doc["target_loss"] = args.target_loss
        write_outputs(doc, args.out_dir, "time_to_loss", format_time_to_loss_table(doc), plot_time_to_loss)
    else:
        write_outputs(doc, args.out_dir, "bandwidth", format_throughput_table(doc), plot_throughput)
    return 0


def _worker_argv(argv, link, result):
    return [*argv, "--link", link, "--result", result]


def _collect(link, result, rc, runs) -> int:
    if rc != 0:
        print(f"bandwidth.py: the run at {link} failed (exit code {rc})", file=sys.stderr, flush=True)
        return rc
    with open(result) as f:
        runs[link] = json.load(f)
    return 0


def _run_unshaped(args, argv, tmp, runs) -> int:
    result = os.path.join(tmp, "unshaped.json")
    cmd = _launch.launcher_cmd(__file__, _worker_argv(argv, UNSHAPED, result), 2 * args.nproc_per_host)
    rc = _launch.wait_all([_launch.start(cmd, _launch.worker_env())], args.timeout, "bandwidth.py")
    return _collect(UNSHAPED, result, rc, runs)


def _run_shaped(args, argv, tmp, runs) -> int:
    secret = secrets.token_hex(32)  # the same on both hosts: the store admits only this job's workers
    with _hosts.EmulatedHosts() as hosts:
        print(
            f"emulated hosts: namespaces {hosts.netns[0]} ({_hosts.ADDRESSES[0]}) and {hosts.netns[1]} "
            f"({_hosts.ADDRESSES[1]}), veth {hosts.ifaces[0]} <-> {hosts.ifaces[1]}",
            flush=True,
        )
        for link in args.rates:
            hosts.shape(link)
            print(f"--- {link} each way, {args.nproc_per_host} process(es) per host", flush=True)
            result = os.path.join(tmp, f"{link}.json")
            procs = []
            for host in (0, 1):
                env = _launch.worker_env({"GLOO_SOCKET_IFNAME": hosts.ifaces[host], "BAGUA_STORE_SECRET": secret})
                cmd = hosts.exec_prefix(host) + _launch.launcher_cmd(
                    __file__,
                    _worker_argv(argv, link, result),
                    args.nproc_per_host,
                    nnodes=2,
                    node_rank=host,
                    master_addr=_hosts.ADDRESSES[0],
                    master_port=MASTER_PORT,
                )
                procs.append(_launch.start(cmd, env))
            rc = _collect(link, result, _launch.wait_all(procs, args.timeout, "bandwidth.py"), runs)
            if rc != 0:
                return rc
    return 0


# ---------------------------------------------------------------- worker ---


def work(argv) -> int:
    args = parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    import torch.distributed as dist

    rank, world, say = _training.start_worker(COLLECTIVE_TIMEOUT_S)
    n_params = _training.mlp_parameters(args.features, args.hidden, args.classes)
    say(
        f"[{args.link}] MLP {args.features}-{args.hidden}-{args.hidden}-{args.classes}: {n_params / 1e6:.2f} M "
        f"parameters ({n_params * 4 / 2**20:.1f} MiB of float32 gradients); world size {world}, "
        f"batch {args.batch_size} per rank"
    )
    batches = _training.mlp_batches(rank, args.batch_size, args.features, args.classes)
    load_before = os.getloadavg()
    if args.time_to_loss:
        results = time_to_loss(args, batches, say)
    else:
        results = throughput(args, batches, world, say)
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump(
                {
                    "link": args.link,
                    "world_size": world,
                    "results": results,
                    "load_average_before": load_before,
                    "load_average_after": os.getloadavg(),
                },
                f,
                indent=2,
            )
    dist.barrier()
    dist.destroy_process_group()
    return 0


def make_trainer(name, args, batches):
    if name == JAX_CONFIG:
        import optax

        import bagua_jax

        tx = optax.chain(bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm()), optax.sgd(0.01, momentum=0.9))
        return _training.JaxTrainer(name, args.features, args.hidden, args.classes, batches, tx)
    return _training.Trainer(
        name,
        lambda: _training.torch_mlp(args.features, args.hidden, args.classes),
        _training.torch_batches(batches),
        args.warmup,
    )


def throughput(args, batches, world, say):
    import torch.distributed as dist

    from bagua_core import _C

    trainers = []
    try:
        for name in args.configs:
            trainers.append(make_trainer(name, args, batches))
            trainers[-1].steps(args.warmup)
        seconds = {name: [] for name in args.configs}
        packing = {name: {} for name in args.configs}  # BAGUA_WIRE_PACKING: this rank's packed-path messages
        for r in range(args.steps):
            for t in trainers if r % 2 == 0 else trainers[::-1]:
                before = _C.wire_packing_totals()
                seconds[t.name].append(_training.timed_steps(t, 1, dist.barrier))
                for k, v in _C.wire_packing_totals().items():
                    packing[t.name][k] = packing[t.name].get(k, 0) + v - before[k]
            say(
                f"[{args.link}] round {r + 1}/{args.steps}: ms/step "
                + ", ".join(f"{n} {1e3 * s[-1]:.0f}" for n, s in seconds.items())
                + f" (load {os.getloadavg()[0]:.2f})"
            )
        for name, p in packing.items():
            if p.get("packed_messages") or p.get("raw_messages"):
                say(
                    f"[{args.link}] wire packing, {name}: {p['packed_messages']} messages packed, "
                    f"{p['raw_messages']} raw; sent {p['wire_bytes'] / 2**20:.1f} MiB for "
                    f"{p['raw_bytes'] / 2**20:.1f} MiB of float32 (rank 0, timed steps)"
                )
    finally:
        for t in trainers:
            t.close()
    samples = args.batch_size * world
    base = seconds[BASELINE]
    return {
        t.name: {
            "ms_per_step": 1e3 * statistics.median(seconds[t.name]),
            "samples_per_s": samples / statistics.median(seconds[t.name]),
            "ratio_to_ddp": statistics.median(b / s for s, b in zip(seconds[t.name], base)),
            "step_seconds": seconds[t.name],
            "loss": t.loss,
            "wire_packing": packing[t.name],
        }
        for t in trainers
    }


def time_to_loss(args, batches, say):
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    results = {}
    for name in args.configs:
        dist.barrier()
        t = make_trainer(name, args, batches)
        curve, reached = [], None
        try:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.max_steps):
                t.steps(1)
                # mean loss over ranks, and the ranks' mean elapsed time: every rank takes the same decision
                v = torch.tensor([t.loss, time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(v)
                loss, elapsed = (v / world).tolist()
                curve.append((elapsed, loss))
                if loss <= args.target_loss:
                    reached = elapsed
                    break
                if elapsed >= args.max_seconds:
                    break
        finally:
            t.close()
        results[name] = {
            "curve": curve,
            "seconds_to_target": reached,
            "steps": len(curve),
            "final_loss": curve[-1][1] if curve else float("nan"),
        }
        say(
            f"[{args.link}] {name}: "
            + (
                f"loss {args.target_loss} after {reached:.1f} s, {len(curve)} steps"
                if reached is not None
                else f"not reached in {len(curve)} steps ({curve[-1][0]:.1f} s), loss {curve[-1][1]:.3f}"
            )
        )
    return results


# ---------------------------------------------------------------- output ---


def _links_by_bandwidth(links):
    """Fastest first (as the seed's figure reads: bandwidth shrinking to the right)."""
    return sorted(links, key=lambda link: -_hosts.rate_bits(link) if link != UNSHAPED else float("-inf"))


def format_throughput_table(doc):
    links = _links_by_bandwidth(doc["links"])
    head = "| configuration | " + " | ".join(f"{link}: samples/s | ms/step | x DDP" for link in links) + " |"
    rows = [head, "|---|" + "---:|---:|---:|" * len(links)]
    for name in doc["configs"]:
        cells = []
        for link in links:
            r = doc["runs"][link]["results"][name]
            cells.append(f"{r['samples_per_s']:.1f} | {r['ms_per_step']:.0f} | {r['ratio_to_ddp']:.2f}x")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    world = next(iter(doc["runs"].values()))["world_size"]
    rows.append("")
    where = (
        f"2 hosts x {doc['nproc_per_host']} process(es)"
        if doc["shaping"]
        else f"one host, {world} processes over loopback"
    )
    rows.append(
        f"({where}, world size {world}, batch {doc['batch_size']} per "
        f"rank, {doc['model']['parameters'] / 1e6:.2f} M parameters; median of {doc['steps']} timed steps "
        f"after {doc['warmup']} warm-up steps; x DDP: median of per-round ratios; "
        f"{'shaped with tc tbf' if doc['shaping'] else 'unshaped: ' + str(doc['shaping_skipped_because'])}; "
        f"{doc['seconds']:.0f} s in all; before: {doc['uptime_before']}; after: {doc['uptime_after']})"
    )
    return "\n".join(rows)


def format_time_to_loss_table(doc):
    links = _links_by_bandwidth(doc["links"])
    rows = [
        "| configuration | "
        + " | ".join(f"{link}: s to loss {doc['target_loss']} | steps | final loss" for link in links)
        + " |",
        "|---|" + "---:|---:|---:|" * len(links),
    ]
    for name in doc["configs"]:
        cells = []
        for link in links:
            r = doc["runs"][link]["results"][name]
            reached = "not reached" if r["seconds_to_target"] is None else f"{r['seconds_to_target']:.1f}"
            cells.append(f"{reached} | {r['steps']} | {r['final_loss']:.3f}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append(f"({doc['seconds']:.0f} s in all; before: {doc['uptime_before']}; after: {doc['uptime_after']})")
    return "\n".join(rows)


def plot_throughput(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = _links_by_bandwidth(doc["links"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in doc["configs"]:
        ys = [doc["runs"][link]["results"][name]["samples_per_s"] for link in links]
        ax.plot(range(len(links)), ys, marker="o", label=name, linestyle="--" if name.startswith("DDP") else "-")
    ax.set_xticks(range(len(links)), links)
    ax.set_xlabel("link bandwidth (each direction)")
    ax.set_ylabel("samples/s (all ranks)")
    ax.set_yscale("log")
    ax.set_title(
        f"MLP {doc['model']['parameters'] / 1e6:.1f} M params, 2 hosts x {doc['nproc_per_host']}, "
        f"batch {doc['batch_size']}/rank"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_time_to_loss(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = _links_by_bandwidth(doc["links"])
    fig, axes = plt.subplots(1, len(links), figsize=(6 * len(links), 4.5), squeeze=False)
    for ax, link in zip(axes[0], links):
        for name in doc["configs"]:
            curve = doc["runs"][link]["results"][name]["curve"]
            ax.plot(
                [c[0] for c in curve],
                [c[1] for c in curve],
                label=name,
                linestyle="--" if name.startswith("DDP") else "-",
            )
        ax.axhline(doc["target_loss"], color="grey", linewidth=0.8)
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("training loss (mean over ranks)")
        ax.set_title(link)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(doc, out_dir, stem, table, plot):
    _report.write_outputs(doc, out_dir, stem, table, {stem + ".png": plot})


def main() -> int:
    return _launch.main_driver("bandwidth.py", work, lambda argv: drive(parse_args(argv), argv))


if __name__ == "__main__":
    sys.exit(main())
