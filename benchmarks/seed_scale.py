"""The seed's own benchmark at the seed's scale: VGG16 (138 M parameters) and BERT-large (334 M)
trained on emulated hosts through every Bagua algorithm and beside torch DDP, its fp16 and PowerSGD
hooks, Horovod, and the JAX frontend, as the link between the hosts shrinks; and the slow-link race:
GPT-2 small and medium (124 M, 355 M) through streaming local steps with FP4 and top-k 2-bit
pseudo-gradients beside torchft's DiLoCo and Streaming DiLoCo (benchmarks/_seed_torchft.py).

    sudo PYTHONPATH=$PWD .venv/bin/python benchmarks/seed_scale.py [--models vgg16,bert-large]
        [--mode device-time|real] [--profile a100] [--hosts 4] [--nproc-per-host 1|2]
        [--links 1gbit,10gbit] [--configs ...] [--steps 3] [--out-dir seed_scale_results] [--quick]
        [--sync-interval 100 --fragments 4 --overlap-steps 5 --mixing 0.5]   (local steps, streaming)

Compute modes (communication is real in both: the real engine, buckets and algorithm, over real
sockets between network namespaces shaped with ``tc``, see benchmarks/_hosts.py):

    real          a CPU forward and backward per step (small batches: --batch-size)
    device-time   a GPU node's compute replayed (benchmarks/_replay.py): one real backward per rank
                  records the gradients and their order; each step then makes them ready on the
                  per-layer timeline of a GPU profile (benchmarks/gpu_profiles/: a published peak and
                  an assumed utilisation), so that compute is fast and the link is the bottleneck.
                  The recorded gradients are rank 0's, in shared memory mapped by every rank.
                  The optimizer step waits the GPU's time for it (memory-bound, at the profile's
                  bandwidth) and leaves the weights as they are; ``--optimizer-on cpu`` runs it for
                  real on this CPU instead (its CPU time is reported either way).

Each host is a namespace with ``--nproc-per-host`` processes (2: "GPUs" of one node joined by
loopback, for the hierarchical algorithm); every configuration runs in the same processes, one after
the other, from the same initial weights: ``--warmup`` untimed steps, then ``--steps`` timed steps
between barriers (local steps: a whole number of outer rounds, after a whole warm-up round; Async: a window holding at least one
averaging round). Reported per configuration: ms per step (mean), samples/s of all ranks, the ratio
to DDP, bytes each host sent per step (its link's ``tx_bytes``), the CPU cost of the compression
kernels a GPU would run (measured single-threaded on the whole gradient, times the passes the
algorithm makes per step), the optimizer step alone, the peak RSS of each rank while it ran, and the
compute utilisation (compute time over the step's; also against the step without communication).

Configurations that would not fit this machine's memory (``--memory-gib``, default 90% of it) are
refused before the run starts, with the estimate (benchmarks/_seed_models.py); they appear in the
results as refused. ``--quick``: tiny stand-ins of both models (same code), 2 hosts, one link,
1 timed step: the smoke run of the test suite (over loopback with ``--no-shaping``).

Outputs in ``--out-dir``: seed_scale.json, seed_scale.md (throughput per model and link),
memory.md (estimate and peak RSS against DDP's) and <model>.png (throughput against bandwidth, one
line per configuration).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time

import _hosts  # benchmarks/_hosts.py: namespaces, veth, tc
import _launch  # benchmarks/_launch.py: launchers, signals, timeouts
import _report  # benchmarks/_report.py: JSON, table, plots
import _seed_models  # benchmarks/_seed_models.py: the models, memory estimates

CONFIGS = (
    "DDP",
    "DDP+fp16",
    "DDP+PowerSGD",
    "Horovod",
    "Horovod+fp16",
    "Bagua GradientAllReduce",
    "Bagua GradientAllReduce hierarchical",
    "Bagua ByteGrad",
    "Bagua ByteGrad+EF",
    "Bagua HalfGrad",
    "Bagua Decentralized",
    "Bagua LowPrecisionDecentralized",
    "Bagua QAdam",
    "Bagua LowRank",
    "Bagua LocalSteps",
    "Bagua LocalSteps+8bit",
    "Bagua Async",
    "Bagua Streaming+fp4",
    "Bagua Streaming+topk2",
    "torchft DiLoCo",
    "torchft Streaming DiLoCo",
    "JAX Bagua GradientAllReduce",
    "no communication",
)
BASELINE = "DDP"
MODELS = ("vgg16", "bert-large")
QUICK_MODELS = ("tiny-vgg", "tiny-bert")
# Local steps: the timed window holds whole rounds of --sync-interval steps, after a warm-up round.
LOCAL_STEP_CONFIGS = (
    "Bagua LocalSteps",
    "Bagua LocalSteps+8bit",
    "Bagua Streaming+fp4",
    "Bagua Streaming+topk2",
    "torchft DiLoCo",
    "torchft Streaming DiLoCo",
)
STREAMING_CONFIGS = ("Bagua Streaming+fp4", "Bagua Streaming+topk2", "torchft Streaming DiLoCo")
DEFAULT_LINKS = "100mbit,1gbit,10gbit,25gbit,10gbit+5ms"
UNSHAPED = "loopback (unshaped)"
MASTER_PORT = 29500
COLLECTIVE_TIMEOUT_S = 900
# Passes of the MinMaxUInt8 kernels over the whole gradient per step (compress + decompress each).
CODEC_PASSES = {
    "Bagua ByteGrad": 2.0,  # the scatter-reduce's and the gather's quantisation
    "Bagua ByteGrad+EF": 2.0,
    "Bagua LowPrecisionDecentralized": 1.0,
    "Bagua QAdam": 2.0,
    "Bagua LocalSteps+8bit": 2.0,  # per round: divided by --sync-interval
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {MODELS + QUICK_MODELS}")
    p.add_argument("--mode", default="device-time", choices=("device-time", "real"))
    p.add_argument("--profile", default="a100", help="GPU profile of device-time: a name in gpu_profiles/ or a path")
    p.add_argument("--mfu", type=float, help="override the profile's model-FLOP utilisation")
    p.add_argument("--hosts", type=int, default=4, help="emulated hosts (default 4)")
    p.add_argument("--nproc-per-host", type=int, default=1, choices=(1, 2))
    p.add_argument("--links", default=DEFAULT_LINKS, help=f"comma-separated rates, +Nms for a delay ({DEFAULT_LINKS})")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--batch-size", type=int, help="per rank (default: the seed's, VGG16 32, BERT-large 6)")
    p.add_argument("--seq-len", type=int, default=384, help="BERT's sequence length (SQuAD's 384)")
    p.add_argument("--record-batch", type=int, default=1, help="device-time: the batch of the recorded backward")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD's momentum (0: no optimizer state)")
    p.add_argument(
        "--optimizer-on",
        choices=("gpu-time", "cpu"),
        default="gpu-time",
        help="device-time: the optimizer step waits the GPU's time (default) or runs on this CPU",
    )
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--sync-interval", type=int, default=8, help="local steps: inner steps per round, H (8)")
    p.add_argument("--fragments", type=int, default=4, help="streaming: fragments, P (4; divides H)")
    p.add_argument("--overlap-steps", type=int, default=1, help="streaming: steps an exchange overlaps, tau (1)")
    p.add_argument("--mixing", type=float, default=0.5, help="streaming: local share when a fragment lands, alpha")
    p.add_argument("--topk-density", type=float, default=0.02, help="Streaming+topk2: the share of each block kept")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per configuration (default 2)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per configuration (default 3)")
    p.add_argument("--memory-gib", type=float, help="memory all ranks may use (default: 90%% of this machine's)")
    p.add_argument("--out-dir", default="seed_scale_results")
    p.add_argument("--no-shaping", action="store_true", help="skip namespaces and tc: one run over loopback")
    p.add_argument("--quick", action="store_true", help="tiny stand-ins, 2 hosts, 1gbit, 1 warm-up and 1 timed step")
    p.add_argument("--cleanup", action="store_true", help="only remove namespaces left by killed runs, then exit")
    p.add_argument("--timeout", type=float, default=5400.0, help="seconds per link before the run is stopped")
    p.add_argument("--result", help=argparse.SUPPRESS)  # worker: where rank 0 writes its results
    p.add_argument("--link", default=UNSHAPED, help=argparse.SUPPRESS)  # worker: the link it runs under
    args = p.parse_args(argv)
    if args.quick:
        args.models = ",".join(QUICK_MODELS) if args.models == ",".join(MODELS) else args.models
        args.hosts, args.warmup, args.steps = 2, 1, 1
        args.links = "1gbit" if args.links == DEFAULT_LINKS else args.links
    args.smoke = args.quick  # _hosts.prepare: a quick run goes on over loopback when it cannot shape
    args.models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    unknown = [m for m in args.models if m not in _seed_models.PARAMETERS]
    if unknown or not args.models:
        p.error(f"unknown model(s) {unknown}; choose from {list(_seed_models.PARAMETERS)}")
    args.configs = tuple(c.strip() for c in args.configs.split(",") if c.strip())
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")
    if BASELINE not in args.configs:
        p.error(f"{BASELINE!r} is the baseline of the ratios and must be measured")
    try:
        args.links = tuple(_hosts.parse_link(s) and s.strip().lower() for s in args.links.split(",") if s.strip())
        if not args.links:
            raise ValueError("--links is empty")
        if args.mode == "device-time":
            _load_profile(args)
    except ValueError as e:
        p.error(str(e))
    if not 2 <= args.hosts <= _hosts.MAX_HOSTS:
        p.error(f"--hosts: 2 to {_hosts.MAX_HOSTS}")
    if min(args.steps, args.record_batch, args.seq_len) < 1 or args.warmup < 0 or args.momentum < 0:
        p.error("--steps, --record-batch and --seq-len must be >= 1, --warmup and --momentum >= 0")
    if args.batch_size is not None and args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    if args.sync_interval < 1 or args.fragments < 1 or args.sync_interval % args.fragments:
        p.error("--sync-interval and --fragments must be >= 1, and --fragments must divide --sync-interval")
    if not 0 <= args.overlap_steps < args.sync_interval // args.fragments:
        p.error(
            "--overlap-steps must be in [0, --sync-interval / --fragments): an exchange lands before the next starts"
        )
    if not 0 <= args.mixing <= 1 or not 0 < args.topk_density <= 1:
        p.error("--mixing must be in [0, 1] and --topk-density in (0, 1]")
    if args.memory_gib is None:
        args.memory_gib = 0.9 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / _seed_models.GIB
    return args


def _load_profile(args):
    import _replay  # benchmarks/_replay.py (imports torch only when a step is replayed)

    return _replay.load_profile(args.profile, args.mfu)


def batch_size(args, model):
    return args.batch_size or _seed_models.model_spec(model, args.seq_len).batch_size


def refusals(args):
    """{(model, configuration): why it cannot run here}, decided before anything starts."""
    ranks = args.hosts * args.nproc_per_host
    out = {}
    for model in args.models:
        for config in args.configs:
            why = _seed_models.refusal(
                model,
                config,
                args.mode,
                batch_size(args, model),
                args.record_batch,
                args.momentum,
                ranks,
                args.memory_gib * _seed_models.GIB,
                args.seq_len,
                args.optimizer_on,
            )
            if config == "Bagua GradientAllReduce hierarchical" and args.nproc_per_host < 2:
                why = "needs --nproc-per-host 2 (with one process per host there is nothing inside a node)"
            elif config.startswith("JAX") and "vgg" not in model:
                why = "the JAX configuration trains the Flax VGG16 only"
            elif config.startswith("Horovod") and _horovod_missing():
                why = _horovod_missing()
            elif config.startswith("torchft") and _missing("torchft"):
                why = "torchft is not installed (the bench extra: pip install -e '.[bench]')"

            if why:
                out[(model, config)] = why
    return out


def _missing(module):
    import importlib.util

    return importlib.util.find_spec(module) is None


def _horovod_missing():
    if _missing("horovod"):
        return "horovod is not installed (make bench-seed builds it; docs/benchmarks-seed.md says what happened)"
    return None


# ---------------------------------------------------------------- driver ---


def drive(args, argv) -> int:
    rc, reason = _hosts.prepare(args, "seed_scale.py", "one run over loopback")
    if rc is not None:
        return rc
    refused = refusals(args)
    for (model, config), why in refused.items():
        print(f"refused: {model}, {config}: {why}", flush=True)
    if all((m, c) in refused for m in args.models for c in args.configs if c != "no communication"):
        print("seed_scale.py: every configuration was refused: nothing to run", file=sys.stderr)
        return 2
    os.makedirs(args.out_dir, exist_ok=True)
    _launch.raise_on_stop_signals()
    uptime_before, t0 = _report.uptime(), time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bagua-seed-") as tmp:
        links = (UNSHAPED,) if reason is not None else args.links
        rc = _launch_all(args, argv, tmp, links, runs, shaped=reason is None)
    if rc != 0:
        return rc
    doc = {
        "benchmark": "seed_scale",
        "mode": args.mode,
        "profile": _load_profile(args) if args.mode == "device-time" else None,
        "runs": runs,
        "configs": list(args.configs),
        "refused": [{"model": m, "config": c, "why": w} for (m, c), w in refused.items()],
        "hosts": args.hosts,
        "nproc_per_host": args.nproc_per_host,
        "shaping": reason is None,
        "shaping_skipped_because": reason,
        "warmup": args.warmup,
        "steps": args.steps,
        "memory_gib": args.memory_gib,
        "uptime_before": uptime_before,
        "uptime_after": _report.uptime(),
        "seconds": time.perf_counter() - t0,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }
    write(doc, args.out_dir)
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_all(args, argv, tmp, links, runs, shaped) -> int:
    secret = secrets.token_hex(32)  # the same on every host: the store admits only this job's workers
    hosts_cm = _hosts.EmulatedHosts(args.hosts) if shaped else None
    try:
        hosts = hosts_cm.__enter__() if hosts_cm else None
        for link in links:
            if hosts:
                rate, delay = _hosts.parse_link(link)
                hosts.shape(rate, delay)
            print(f"--- {link}: {args.hosts} hosts x {args.nproc_per_host} process(es)", flush=True)
            result = os.path.join(tmp, f"{len(runs)}.json")
            port = MASTER_PORT if hosts else _free_port()
            procs = []
            for host in range(args.hosts):
                extra = {"BAGUA_STORE_SECRET": secret, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
                if hosts:
                    extra.update({"GLOO_SOCKET_IFNAME": hosts.ifaces[host], "SEED_TX_BYTES": hosts.tx_bytes_path(host)})
                cmd = (hosts.exec_prefix(host) if hosts else []) + _launch.launcher_cmd(
                    __file__,
                    [*argv, "--link", link, "--result", result],
                    args.nproc_per_host,
                    nnodes=args.hosts,
                    node_rank=host,
                    master_addr=_hosts.ADDRESSES[0] if hosts else "127.0.0.1",
                    master_port=port,
                )
                procs.append(_launch.start(cmd, _launch.worker_env(extra)))
            rc = _launch.wait_all(procs, args.timeout, "seed_scale.py")
            if rc != 0:
                print(f"seed_scale.py: the run at {link} failed (exit code {rc})", file=sys.stderr, flush=True)
                return rc
            with open(result) as f:
                done = json.load(f)
            for run in done:  # netem, or the user-space delay line whose own throughput may bound the link
                run["delay_method"] = hosts.delay_method() if hosts and _hosts.parse_link(link)[1] else None
            runs.extend(done)
    finally:
        if hosts_cm:
            hosts_cm.__exit__(None, None, None)
    return 0


# ---------------------------------------------------------------- worker ---


def work(argv) -> int:
    args = parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    import _training  # benchmarks/_training.py: wrap, start_worker

    rank, world, say = _training.start_worker(COLLECTIVE_TIMEOUT_S)
    refused = refusals(args)
    runs = []
    try:
        for model in args.models:
            runs.append(run_model(args, model, refused, rank, world, say))
    finally:
        if any(c.startswith("torchft") for c in args.configs):
            import _seed_torchft

            _seed_torchft.stop()
    return _training.finish(rank, args.result, runs)


def _rank_link_bytes(path):
    if path is None:
        return 0
    with open(path) as f:
        return int(f.read())


def _reset_peak_rss():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS (Linux >= 4.0)


def _rss_mib(field="VmHWM"):
    """This process's peak (VmHWM) or current (VmRSS) resident memory, MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def _release_memory():
    import ctypes

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


class Step:
    """One configuration's model, optimizer and step. device-time: the model is a ReplayNet of the
    recorded step; real: a module whose forward is the loss of this rank's batch."""

    def __init__(self, config, spec, args, rank, replay, optimizer_on=None):
        import _training
        import torch

        torch.manual_seed(0)  # the same initial weights in every configuration
        model = spec.build()
        if replay is not None:
            import _replay

            rec, times = replay
            net = _replay.ReplayNet(model, rec, times)
        else:
            net = _LossNet(model, spec, spec.make_batch(rank, batch_size(args, spec.name)))
        if config == "Bagua QAdam":
            from bagua_torch.algorithms import QAdamOptimizer

            self.opt = QAdamOptimizer(net.parameters(), lr=1e-3, warmup_steps=max(1, args.warmup), eps=1e-3)
        else:
            self.opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
        self.opt_gpu_seconds = None
        if replay is not None and (optimizer_on or args.optimizer_on) == "gpu-time":
            import _replay

            kind = "adam" if config == "Bagua QAdam" else "sgd-momentum" if args.momentum else "sgd"
            self.opt_gpu_seconds = _replay.optimizer_gpu_seconds(
                _load_profile(args), _seed_models.PARAMETERS[spec.name], kind
            )
            _replay.gpu_timed_step(self.opt, self.opt_gpu_seconds)
        if config.startswith("Horovod"):
            import _seed_horovod

            self.opt, self.close = _seed_horovod.wrap(config, net, self.opt, self.opt_gpu_seconds)
            self.net = net
        elif config.startswith("torchft"):
            import _seed_torchft

            self.close = _seed_torchft.wrap(
                config, model, self.opt, args.sync_interval, args.fragments, args.overlap_steps, args.mixing,
                COLLECTIVE_TIMEOUT_S,
            )  # fmt: skip
            self.net = net
        else:
            self.net, self.close = _training.wrap(config, net, self.opt, _options(config, args))
        self.name = config
        self.compute_seconds = getattr(net, "compute_seconds", None)

    def steps(self, n):
        for _ in range(n):
            loss = self.net()
            loss.backward()
            self.opt.step()
            self.net.zero_grad(set_to_none=False)  # gradients stay (bucket views): no page faults per step


def _options(config, args):
    """wrap()'s options of a configuration: DDP's buckets as the gradients' storage, local steps' H and
    the streaming settings."""
    if config.startswith("DDP"):
        return {"gradient_as_bucket_view": True}
    if config not in LOCAL_STEP_CONFIGS:
        return None
    options = {"sync_interval": args.sync_interval}
    if config in STREAMING_CONFIGS:
        options.update(num_fragments=args.fragments, overlap_steps=args.overlap_steps, mixing=args.mixing)
    if config == "Bagua Streaming+topk2":
        options["topk_density"] = args.topk_density
    return options


def _LossNet(model, spec, inputs):
    import torch

    class LossNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *_ignored):
            return spec.loss(self.model, inputs)

    return LossNet()


def _shared_grads_path(args, model):
    import hashlib

    return f"/dev/shm/bagua-seed-{hashlib.sha1(args.result.encode()).hexdigest()[:12]}-{model}"


def _record(args, spec, rank):
    """device-time: the recorded step and its timeline on the profile. Rank 0 records; its gradients
    go to one shared-memory file that every rank maps (the emulated hosts share this machine's
    memory: one copy for all ranks instead of one each), then the file is unlinked."""
    import _replay
    import torch
    import torch.distributed as dist

    path, box = _shared_grads_path(args, spec.name), [None]
    if rank == 0:
        torch.manual_seed(0)
        model = spec.build()
        inputs = spec.make_batch(rank, args.record_batch)
        rec = _replay.record(model, lambda m: spec.loss(m, inputs), batch_size(args, spec.name) / args.record_batch)
        del model
        numel = sum(g.numel() for g in rec.grads.values())
        flat = torch.from_file(path, shared=True, size=numel, dtype=torch.float32)
        torch.cat([g.reshape(-1) for g in rec.grads.values()], out=flat)
        shapes = {n: tuple(g.shape) for n, g in rec.grads.items()}
        rec.grads = None
        box = [(rec, shapes, numel)]
    try:
        dist.broadcast_object_list(box, src=0)
        rec, shapes, numel = box[0]
        flat = torch.from_file(path, shared=True, size=numel, dtype=torch.float32)
        dist.barrier()  # every rank has mapped it
    finally:
        if rank == 0 and os.path.exists(path):
            os.unlink(path)
    rec.grads, offset = {}, 0
    for name, shape in shapes.items():
        n = int(torch.Size(shape).numel())
        rec.grads[name] = flat[offset : offset + n].view(shape)
        offset += n
    _release_memory()
    return rec, _replay.timeline(rec, _load_profile(args))


def _codec_passes(args, config):
    return CODEC_PASSES[config] / (args.sync_interval if config in LOCAL_STEP_CONFIGS else 1)


def _codec_ms(grads_numel):
    """Single-threaded compress + decompress of the whole gradient (MinMaxUInt8, 4 chunks), ms."""
    import numpy as np

    from bagua_core import compression

    n = grads_numel - grads_numel % 4  # whole chunks
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    c = compression.compress(x, 4)
    out = np.empty_like(x)
    best = float("inf")
    for _ in range(2):
        t0 = time.process_time()
        compression.compress(x, 4, out=c)
        compression.decompress(c, n, "float32", 4, out=out)
        best = min(best, time.process_time() - t0)
    return 1e3 * best


def _local_step_ms(args, spec, replay, rank):
    """(forward+backward ms, optimizer ms) of a step on this CPU without communication (the second of
    two: the first faults pages in), the optimizer run for real."""
    step = Step("no communication", spec, args, rank, replay, optimizer_on="cpu")
    step.steps(1)
    t0 = time.perf_counter()
    step.net().backward()
    t1 = time.perf_counter()
    step.opt.step()
    t2 = time.perf_counter()
    del step
    _release_memory()
    return 1e3 * (t1 - t0), 1e3 * (t2 - t1)


def run_model(args, model, refused, rank, world, say):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    spec = _seed_models.model_spec(model, args.seq_len)
    batch = batch_size(args, model)
    t0 = time.perf_counter()
    replay = _record(args, spec, rank) if args.mode == "device-time" else None
    record_s = time.perf_counter() - t0
    params = _seed_models.PARAMETERS[model]
    cpu_step_ms, opt_ms = _local_step_ms(args, spec, replay, rank)
    compute_ms = 1e3 * sum(f + b for f, b in replay[1]) if replay else cpu_step_ms
    backward_fraction = sum(b for _, b in replay[1]) / sum(f + b for f, b in replay[1]) if replay else 2 / 3
    codec_ms = _codec_ms(params)
    say(
        f"[{args.link}] {model}: {params / 1e6:.1f} M parameters ({4 * params / 2**20:.0f} MiB of float32 gradient), "
        f"batch {batch} per rank, world {world}; "
        + (f"recorded in {record_s:.1f} s, replayed compute {compute_ms:.1f} ms/step; " if replay else "")
        + f"forward+backward on this CPU {cpu_step_ms:.0f} ms, "
        + f"optimizer step on this CPU {opt_ms:.0f} ms, MinMaxUInt8 compress+decompress of it all {codec_ms:.0f} ms (this CPU)"
    )
    tx_path = os.environ.get("SEED_TX_BYTES") if int(os.environ.get("LOCAL_RANK", "0")) == 0 else None
    hosts = world // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    results = {}
    todo = [c for c in args.configs if (model, c) not in refused]
    bar = _progress(rank, len(todo), f"{model} @ {args.link}")
    for config in args.configs:
        if (model, config) in refused:
            results[config] = {"refused": refused[(model, config)]}
            continue
        dist.barrier()
        r = run_config(args, config, spec, replay, rank, tx_path, hosts)
        r.update(
            optimizer_ms=r.pop("optimizer_gpu_ms") or opt_ms,
            optimizer_cpu_ms=opt_ms,
            compression_cpu_ms=_codec_passes(args, config) * codec_ms if config in CODEC_PASSES else None,
            estimate_mib=_seed_models.per_rank_bytes(
                model, config, args.mode, batch, args.record_batch, args.momentum, args.seq_len, args.optimizer_on
            )
            / 2**20,
        )
        if r.get("compute_ms") is None:
            r["compute_ms"] = compute_ms
        r["samples_per_s"] = batch * world / (r["ms_per_step"] / 1e3)
        results[config] = r
        bar.update(config, r["ms_per_step"])
    bar.close()
    add_ratios(results)
    return {
        "model": model,
        "link": args.link,
        "rate_bits": None if args.link == UNSHAPED else _hosts.rate_bits(_hosts.parse_link(args.link)[0]),
        "delay_ms": None if args.link == UNSHAPED else _hosts.parse_link(args.link)[1],
        "hosts": hosts,
        "nproc_per_host": world // hosts,
        "world_size": world,
        "batch_size": batch,
        "unit": spec.unit,
        "parameters": params,
        "grad_bytes": 4 * params,
        "replayed_compute_ms": compute_ms if replay else None,
        "compute_ms": compute_ms,
        "backward_fraction": backward_fraction,
        "record_seconds": record_s,
        "optimizer_ms": opt_ms,
        "codec_ms": codec_ms,
        "results": results,
    }


def add_ratios(results):
    """Each measured configuration's ratios: to DDP's step time and bytes, and its compute
    utilisation (as INTELLECT-1 reports it: compute time over wall time), with the compute either the
    replayed GPU time or the step of the same processes without communication ("no communication":
    it also holds this machine's own work per step, such as adding the replayed gradients)."""
    base = results.get(BASELINE, {}).get("ms_per_step")
    base_sent = results.get(BASELINE, {}).get("wire_bytes_per_step")
    alone = results.get("no communication", {}).get("ms_per_step")
    for r in results.values():
        if "ms_per_step" not in r:
            continue
        if base:
            r["ratio_to_ddp"] = base / r["ms_per_step"]
        r["utilization"] = min(1.0, (r["compute_ms"] + r["optimizer_ms"]) / r["ms_per_step"])
        if alone:
            r["utilization_vs_no_communication"] = min(1.0, alone / r["ms_per_step"])
        if base_sent and r.get("wire_bytes_per_step"):
            r["fewer_bytes_than_ddp"] = base_sent / r["wire_bytes_per_step"]


def run_config(args, config, spec, replay, rank, tx_path, hosts):
    """One configuration's warm-up and timed steps; its record in the results."""
    import _training
    import torch
    import torch.distributed as dist

    before = torch.tensor([_rss_mib("VmRSS")], dtype=torch.float64)  # what earlier configurations left
    dist.all_reduce(before, op=dist.ReduceOp.MAX)
    if config.startswith("JAX"):
        import _seed_jax

        step = _seed_jax.JaxReplayTrainer(
            config,
            "GradientAllReduceAlgorithm",
            args.mode,
            _load_profile(args) if args.mode == "device-time" else None,
            batch_size(args, spec.name),
            args.record_batch,
            rank,
            tiny=spec.name.startswith("tiny"),
            lr=args.lr,
            momentum=args.momentum,
        )
    else:
        step = Step(config, spec, args, rank, replay)
    try:
        if config == "Bagua Async":
            step.net.bagua_ddp.impl.abort()  # its loop runs in the timed window only
        warmup = max(args.warmup, 1)
        if config in LOCAL_STEP_CONFIGS:  # a whole round: every fragment's first exchange is behind
            warmup = args.sync_interval * -(-warmup // args.sync_interval)
        step.steps(warmup)
        _reset_peak_rss()
        steps = args.steps
        if config in LOCAL_STEP_CONFIGS:  # whole rounds: each fragment synchronises once in each
            steps = args.sync_interval * -(-steps // args.sync_interval)
        dist.barrier()
        tx0 = _rank_link_bytes(tx_path)
        if config == "Bagua Async":

            def all_agree(flag):
                t = torch.tensor([1 if flag else 0])
                dist.all_reduce(t, op=dist.ReduceOp.MIN)
                return bool(t.item())

            steps, seconds = _training.timed_async_window(step, args.steps, dist.barrier, all_agree)
            per_step = [seconds / steps] * steps
        else:
            per_step = [_training.timed_steps(step, 1, dist.barrier) for _ in range(steps)]
        sent = torch.tensor([float(_rank_link_bytes(tx_path) - tx0)], dtype=torch.float64)
        peak = torch.tensor([_rss_mib()], dtype=torch.float64)
        dist.all_reduce(sent)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    finally:
        step.close()
        compute = getattr(step, "compute_seconds", None)
        step_opt_gpu = getattr(step, "opt_gpu_seconds", None)
        del step
        _release_memory()
    return {
        "optimizer_gpu_ms": 1e3 * step_opt_gpu if step_opt_gpu else None,
        "ms_per_step": 1e3 * statistics.fmean(per_step),
        "step_seconds": per_step,
        "timed_steps": len(per_step),
        "wire_bytes_per_step": float(sent[0]) / hosts / len(per_step) if "SEED_TX_BYTES" in os.environ else None,
        "peak_rss_mib": float(peak[0]),
        "rss_before_mib": float(before[0]),
        "compute_ms": 1e3 * compute if compute else None,
    }


class _progress:
    """A progress bar on rank 0 (tqdm on stderr), one tick per configuration."""

    def __init__(self, rank, total, what):
        self.bar = None
        if rank == 0:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=what, unit="config", file=sys.stderr, dynamic_ncols=True)

    def update(self, config, ms):
        if self.bar is not None:
            self.bar.set_postfix_str(f"{config}: {ms:.0f} ms/step")
            self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------- output ---


def _links_by_bandwidth(links):
    def key(link):
        if link == UNSHAPED:
            return (float("-inf"), 0)
        rate, delay = _hosts.parse_link(link)
        return (-_hosts.rate_bits(rate), delay or 0)

    return sorted(set(links), key=key)


def format_tables(doc):
    rows = []
    for model in dict.fromkeys(r["model"] for r in doc["runs"]):
        runs = {r["link"]: r for r in doc["runs"] if r["model"] == model}
        links = _links_by_bandwidth(runs)
        first = runs[links[0]]
        rows += [
            f"### {model}: {first['parameters'] / 1e6:.1f} M parameters, batch {first['batch_size']} per rank, "
            f"{first['hosts']} hosts x {first['nproc_per_host']}",
            "",
            "| configuration | "
            + " | ".join(f"{link}: {first['unit']}/s, x DDP, MiB sent/step, utilisation" for link in links)
            + " |",
            "|---|" + "---:|" * len(links),
        ]
        for config in doc["configs"]:
            cells = []
            for link in links:
                r = runs[link]["results"].get(config, {})
                if "refused" in r:
                    cells.append("refused")
                    continue
                sent = r.get("wire_bytes_per_step")
                cells.append(
                    f"{r['samples_per_s']:.1f}, {r.get('ratio_to_ddp', float('nan')):.2f}x, "
                    + ("-" if sent is None else f"{sent / 2**20:.3g}")
                    + (f", {100 * r['utilization']:.0f}%" if "utilization" in r else "")
                    + (
                        f" ({100 * r['utilization_vs_no_communication']:.0f}%)"
                        if "utilization_vs_no_communication" in r
                        else ""
                    )
                )
            rows.append(f"| {config} | " + " | ".join(cells) + " |")
        rows += [
            "",
            f"(compute {first['compute_ms']:.1f} ms/step"
            + (" replayed" if first["replayed_compute_ms"] else " on this CPU")
            + f"; optimizer step on this CPU "
            f"{first['optimizer_ms']:.0f} ms; MinMaxUInt8 compress+decompress of the whole gradient on this CPU "
            f"{first['codec_ms']:.0f} ms; utilisation: the compute's share of the step, in brackets the "
            "share of the step without communication)",
            "",
        ]
    rows.append(
        f"(mode {doc['mode']}"
        + (f", profile {doc['profile']['name']} at mfu {doc['profile']['mfu']}" if doc["profile"] else "")
        + f"; {doc['steps']} timed steps after {doc['warmup']} warm-up steps; "
        + ("shaped with tc" if doc["shaping"] else f"unshaped: {doc['shaping_skipped_because']}")
        + f"; {doc['seconds']:.0f} s in all)"
    )
    return "\n".join(rows)


def format_memory(doc):
    rows = [
        "| model | configuration | estimate MiB/rank | peak RSS MiB/rank | x DDP's peak | RSS before it, MiB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for model in dict.fromkeys(r["model"] for r in doc["runs"]):
        run = next(r for r in doc["runs"] if r["model"] == model)
        ddp = run["results"].get(BASELINE, {}).get("peak_rss_mib")
        for config, r in run["results"].items():
            if "refused" in r:
                rows.append(f"| {model} | {config} | refused: {r['refused']} | | | |")
            else:
                ratio = f"{r['peak_rss_mib'] / ddp:.2f}" if ddp else "-"
                rows.append(
                    f"| {model} | {config} | {r['estimate_mib']:.0f} | {r['peak_rss_mib']:.0f} | {ratio} | "
                    f"{r.get('rss_before_mib', float('nan')):.0f} |"
                )
    return "\n".join(rows)


def plot_model(model):
    """The seed's two figures: images/s against bandwidth, a line per configuration (VGG16), and the
    time of one epoch of SQuAD v1.1 per network condition, bars per configuration (BERT)."""

    def plot(doc, path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        runs = {r["link"]: r for r in doc["runs"] if r["model"] == model}
        links = _links_by_bandwidth(runs)
        first = runs[links[0]]
        configs = [c for c in doc["configs"] if any("samples_per_s" in runs[k]["results"].get(c, {}) for k in links)]
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        if first["unit"] == "sequences":
            width = 0.8 / max(1, len(configs))
            for i, config in enumerate(configs):
                ys = [runs[k]["results"].get(config, {}).get("samples_per_s") for k in links]
                hours = [_seed_models.SQUAD_TRAIN_SAMPLES / y / 3600 if y else float("nan") for y in ys]
                xs = [x - 0.4 + width * (i + 0.5) for x in range(len(links))]
                ax.bar(xs, hours, width, label=config, color=plt.cm.tab20(i % 20))
            ax.set_ylabel("hours per epoch of SQuAD v1.1 (88,641 sequences)")
        else:
            for i, config in enumerate(configs):
                ys = [runs[k]["results"].get(config, {}).get("samples_per_s") for k in links]
                ax.plot(
                    range(len(links)),
                    [y or float("nan") for y in ys],
                    marker="os^vD<>p"[i % 8],
                    color=plt.cm.tab20(i % 20),
                    label=config,
                    linestyle="--" if config.startswith(("DDP", "Horovod")) else "-",
                )
            ax.set_ylabel(f"{first['unit']}/s (all ranks)")
        ax.set_xticks(range(len(links)), links)
        ax.set_xlabel("link bandwidth between hosts (each direction)")
        ax.set_yscale("log")
        ax.set_title(f"{model}, {first['hosts']} hosts x {first['nproc_per_host']}, {doc['mode']}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    return plot


def write(doc, out_dir):
    models = dict.fromkeys(r["model"] for r in doc["runs"])
    _report.write_outputs(doc, out_dir, "seed_scale", format_tables(doc), {f"{m}.png": plot_model(m) for m in models})
    memory = format_memory(doc)
    with open(os.path.join(out_dir, "memory.md"), "w") as f:
        f.write(memory + "\n")
    print("\n" + memory, flush=True)


def main() -> int:
    return _launch.main_driver("seed_scale.py", work, lambda argv: drive(parse_args(argv), argv))


if __name__ == "__main__":
    sys.exit(main())
