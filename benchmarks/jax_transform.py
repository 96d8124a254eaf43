"""Data-parallel training in JAX: bagua_jax.transform against JAX's own
multi-process CPU data parallelism and against the torch frontend, on 2 processes.

    PYTHONPATH=$PWD python benchmarks/jax_transform.py [--json results.json] [--smoke]

(The script is its own driver: it starts its workers through
``python -m bagua_core.run --no-prefix``; see benchmarks/_launch.py.)

Every configuration trains the same MLP (features -> hidden -> hidden ->
classes, 6.3 M parameters by default) on the same batches, with plain SGD, in
the same processes, interleaved round by round:

    JAX bagua_jax.transform     Flax model, optax.chain(bagua_jax.transform(
                                GradientAllReduceAlgorithm()), optax.sgd(lr)) under jax.jit
    JAX jax.distributed (gloo)  the same Flax model, data parallel with JAX's own
                                collectives: jax.distributed.initialize with
                                jax_cpu_collectives_implementation=gloo, params
                                replicated and the batch sharded over a mesh of one CPU
                                device per process; XLA inserts the gradient all-reduce
    torch with_bagua            the equivalent torch model, model.with_bagua([opt],
                                GradientAllReduceAlgorithm())
    JAX no communication        the Flax step alone: the compute-only bound
    torch no communication      the torch step alone (the frameworks' compute differs)

Then the transform's own cost: a jitted ``tx.update`` of the model's gradient
pytree (bucketing, FFI calls) against a jitted ``bagua_jax.allreduce`` of
one buffer of the same bytes.

Each process runs single-threaded XLA and one torch thread: 2 processes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import _launch  # benchmarks/_launch.py: the script is its own driver
import _training  # benchmarks/_training.py
from _training import mlp_batches, mlp_initial_weights, torch_batches, torch_mlp

CONFIGS = (
    "JAX bagua_jax.transform",
    "JAX jax.distributed (gloo)",
    "torch with_bagua",
    "JAX no communication",
    "torch no communication",
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--steps", type=int, default=2, help="timed steps per configuration per round (default 2)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each configuration first")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 warm-up step, 2 rounds of 1 timed step")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--nproc", type=int, default=2, help="processes (driver mode only; default 2)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before the driver stops the run")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_size, args.features, args.hidden, args.steps, args.warmup, args.rounds = 4, 16, 32, 1, 1, 2
    if min(args.batch_size, args.features, args.hidden, args.classes, args.steps, args.rounds) < 1 or args.warmup < 0:
        p.error("sizes and counts must be positive (warm-up >= 0)")
    return args


# ---------------------------------------------------------------- worker ---


def initial_weights(args):
    """[w0, b0, w1, b1, w2, b2], torch's (out, in) layout, the same in every configuration."""
    return mlp_initial_weights(args.features, args.hidden, args.classes)


def JaxTrainer(name, args, batches, tx, mesh=None):
    return _training.JaxTrainer(name, args.features, args.hidden, args.classes, batches, tx, mesh)


def TorchTrainer(name, args, batches, communicate=True):
    """The torch model with plain SGD, wrapped with GradientAllReduce unless ``communicate`` is False."""
    t = _training.Trainer(
        "Bagua GradientAllReduce" if communicate else "no communication",
        lambda: torch_mlp(args.features, args.hidden, args.classes),
        torch_batches(batches),
        warmup=args.warmup,
        momentum=0.0,
    )
    t.name = name
    return t


def barrier():
    import bagua_core

    bagua_core.barrier()


def timed(fn, rounds):
    """Median seconds of ``fn()`` between barriers."""
    times = []
    for _ in range(rounds):
        barrier()
        t0 = time.perf_counter()
        fn()
        barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def transform_overhead(args, rounds):
    """(seconds of a jitted tx.update of the model's gradients, seconds of a
    jitted allreduce of one buffer of the same bytes)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import bagua_jax

    grads = [jnp.asarray(w) for w in initial_weights(args)]
    tx = bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm())
    state = tx.init(grads)
    update = jax.jit(lambda g, s: tx.update(g, s)[0])
    flat = jnp.zeros(sum(int(np.prod(g.shape)) for g in grads), jnp.float32)
    raw = jax.jit(lambda v: bagua_jax.allreduce(v, op="avg"))
    for _ in range(2):
        jax.block_until_ready(update(grads, state))
        jax.block_until_ready(raw(flat))
    t_update = timed(lambda: jax.block_until_ready(update(grads, state)), rounds)
    t_raw = timed(lambda: jax.block_until_ready(raw(flat)), rounds)
    return t_update, t_raw


def work(argv) -> int:
    args = parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    import jax

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's coordinator takes MASTER_PORT (there is no torch store); Bagua's store is on MASTER_PORT + 1.
    jax.distributed.initialize(f"127.0.0.1:{os.environ['MASTER_PORT']}", world, rank, initialization_timeout=60)
    import optax
    import torch

    torch.set_num_threads(1)
    import bagua_jax

    bagua_jax.init_process_group()
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    n_params = sum(w.size for w in initial_weights(args))
    say(
        f"model: MLP {args.features}-{args.hidden}-{args.hidden}-{args.classes}, {n_params / 1e6:.2f} M parameters "
        f"({n_params * 4 / 2**20:.1f} MiB of float32 gradients); world size {world}, batch {args.batch_size} per rank; "
        f"{args.warmup} warm-up steps, then {args.rounds} rounds of {args.steps} timed steps per configuration"
    )
    batches = mlp_batches(rank, args.batch_size, args.features, args.classes)
    mesh = jax.make_mesh((world,), ("dp",), devices=jax.devices())
    sgd = optax.sgd(0.01)
    trainers = [
        JaxTrainer(
            CONFIGS[0], args, batches, optax.chain(bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm()), sgd)
        ),
        JaxTrainer(CONFIGS[1], args, batches, sgd, mesh=mesh),
        TorchTrainer(CONFIGS[2], args, batches),
        JaxTrainer(CONFIGS[3], args, batches, sgd),
        TorchTrainer(CONFIGS[4], args, batches, communicate=False),
    ]
    samples = args.steps * args.batch_size * world
    try:
        per_round = _training.interleaved_rounds(trainers, args.warmup, args.rounds, args.steps, samples, barrier)
        t_update, t_raw = transform_overhead(args, max(5, args.rounds // 2))
    finally:
        for t in trainers:
            t.close()

    base = per_round[CONFIGS[1]]
    results = {
        t.name: {
            "samples_per_s": statistics.median(per_round[t.name]),
            "rounds": per_round[t.name],
            "ratio_to_jax_distributed": statistics.median(a / b for a, b in zip(per_round[t.name], base)),
            "loss": t.loss,
        }
        for t in trainers
    }
    transform_vs_torch = statistics.median(
        a / b for a, b in zip(per_round[CONFIGS[2]], per_round[CONFIGS[0]])
    )  # torch samples/s over JAX's
    overhead = {"update_ms": t_update * 1e3, "raw_allreduce_ms": t_raw * 1e3, "overhead_ms": (t_update - t_raw) * 1e3}
    if rank == 0:
        print()
        print("| configuration | samples/s | ratio to jax.distributed (gloo) | last loss |")
        print("|---|---:|---:|---:|")
        for name in CONFIGS:
            r = results[name]
            print(f"| {name} | {r['samples_per_s']:.1f} | {r['ratio_to_jax_distributed']:.2f}x | {r['loss']:.3f} |")
        print(
            f"\nJAX transform step time / torch with_bagua step time: {transform_vs_torch:.2f} "
            "(median of per-round ratios)"
        )
        print(
            f"transform overhead: tx.update of the gradient pytree {overhead['update_ms']:.2f} ms, one allreduce of "
            f"the same bytes {overhead['raw_allreduce_ms']:.2f} ms: {overhead['overhead_ms']:+.2f} ms per step"
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "results": results,
                        "configs": list(CONFIGS),
                        "world_size": world,
                        "jax_step_time_over_torch": transform_vs_torch,
                        "transform_overhead": overhead,
                        "parameters": int(n_params),
                        "batch_size": args.batch_size,
                    },
                    f,
                    indent=2,
                )
    barrier()
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(_launch.main(__file__, work, parse_args))
