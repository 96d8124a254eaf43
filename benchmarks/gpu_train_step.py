"""One training step on one GPU (world size 1): Bagua against torch DDP on
NCCL, and the JAX transform against the torch frontend.

    PYTHONPATH=$PWD python benchmarks/gpu_train_step.py [--json results.json] [--smoke]

Every configuration trains the MLP of benchmarks/_training.py (features ->
hidden -> hidden -> classes, 21 M parameters by default) on the same batches
with plain SGD, in this one process, interleaved round by round:

    torch no communication   the step alone: the compute-only bound
    torch DDP (NCCL)         torch.nn.parallel.DistributedDataParallel, world size 1
    torch with_bagua         model.with_bagua([opt], GradientAllReduceAlgorithm())
    JAX no communication     a jitted step with optax.sgd alone
    JAX bagua_jax.transform  optax.chain(bagua_jax.transform(GradientAllReduceAlgorithm()), optax.sgd)

At world size 1 every allreduce is a copy: the ratios measure each framework
glue's overhead around the step (hooks, buckets, stream ordering, FFI calls).
Targets: with_bagua <= 1.05x DDP; the JAX transform step <= 1.1x the torch
with_bagua step. Needs a CUDA device, torch with CUDA and NCCL; the JAX rows
need jax with its CUDA plugin and are left out (with the reason) otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._training import mlp_batches, mlp_initial_weights, mlp_parameters, torch_mlp


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="steps per configuration and round")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--smoke", action="store_true", help="a tiny model and few steps")
    a = p.parse_args(argv)
    if a.smoke:
        a.features, a.hidden, a.batch, a.rounds, a.steps = 64, 128, 32, 2, 3
    return a


class TorchStep:
    def __init__(self, name, args, batches, wrap):
        import torch

        self.name, self.torch = name, torch
        model = torch_mlp(args.features, args.hidden, args.classes).cuda()
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01)
        self.model = wrap(model, self.opt)
        self.batches = [(torch.from_numpy(x).cuda(), torch.from_numpy(y).long().cuda()) for x, y in batches]
        self.i = 0

    def steps(self, n):
        torch = self.torch
        for _ in range(n):
            x, y = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.opt.zero_grad()
            torch.nn.functional.cross_entropy(self.model(x), y).backward()
            self.opt.step()
        torch.cuda.synchronize()


class JaxStep:
    def __init__(self, name, args, batches, tx):
        import jax
        import jax.numpy as jnp
        import optax

        self.name = name
        w = [jnp.asarray(a) for a in mlp_initial_weights(args.features, args.hidden, args.classes)]
        params = [(w[2 * k].T, w[2 * k + 1]) for k in range(3)]

        def loss_fn(p, x, y):
            for k, (kernel, bias) in enumerate(p):
                x = x @ kernel + bias
                if k < 2:
                    x = jax.nn.relu(x)
            return optax.softmax_cross_entropy_with_integer_labels(x, y).mean()

        def step(p, s, x, y):
            grads = jax.grad(loss_fn)(p, x, y)
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s

        gpu = jax.devices("gpu")[0]
        self.params = jax.device_put(params, gpu)
        self.state = tx.init(self.params)
        self.batches = [(jax.device_put(x, gpu), jax.device_put(y, gpu)) for x, y in batches]
        self.step = jax.jit(step)
        self.i = 0

    def steps(self, n):
        import jax

        for _ in range(n):
            x, y = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.params, self.state = self.step(self.params, self.state, x, y)
        jax.block_until_ready(self.params)


def torch_configs(args, batches):
    import torch
    import torch.distributed as dist

    import bagua_torch
    from bagua_torch.algorithms.gradient_allreduce import GradientAllReduceAlgorithm

    bagua_torch.init_process_group()
    dist.init_process_group("nccl", rank=0, world_size=1)

    def ddp(model, _opt):
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])

    return [
        TorchStep("torch no communication", args, batches, lambda m, _o: m),
        TorchStep("torch DDP (NCCL)", args, batches, ddp),
        TorchStep("torch with_bagua", args, batches, lambda m, o: m.with_bagua([o], GradientAllReduceAlgorithm())),
    ]


def jax_configs(args, batches):
    try:
        import jax
        import optax

        jax.devices("gpu")
    except Exception as e:  # noqa: BLE001 - no JAX, no CUDA plugin: the JAX rows are left out
        print(f"JAX rows left out: {type(e).__name__}: {e}")
        return []
    import bagua_jax

    return [
        JaxStep("JAX no communication", args, batches, optax.sgd(0.01)),
        JaxStep(
            "JAX bagua_jax.transform",
            args,
            batches,
            optax.chain(bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm()), optax.sgd(0.01)),
        ),
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA device (torch.cuda.is_available() is False)")
        return 2
    batches = mlp_batches(0, args.batch, args.features, args.classes)
    configs = torch_configs(args, batches) + jax_configs(args, batches)
    for c in configs:  # warm-up: compile, allocate, autotune cuBLAS
        c.steps(3)
    times = {c.name: [] for c in configs}
    for _ in range(args.rounds):
        for c in configs:
            t0 = time.perf_counter()
            c.steps(args.steps)
            times[c.name].append((time.perf_counter() - t0) / args.steps)
    median = {n: statistics.median(ts) for n, ts in times.items()}
    device = torch.cuda.get_device_name(0)
    print(
        f"{device}: MLP {mlp_parameters(args.features, args.hidden, args.classes) / 1e6:.1f} M parameters, "
        f"batch {args.batch}, median of {args.rounds} rounds x {args.steps} steps"
    )
    for n, t in median.items():
        print(f"  {n:26s} {t * 1e3:8.3f} ms/step")
    ratios = {}
    if "torch DDP (NCCL)" in median:
        ratios["with_bagua / DDP"] = median["torch with_bagua"] / median["torch DDP (NCCL)"]
    if "JAX bagua_jax.transform" in median:
        ratios["JAX transform / torch with_bagua"] = median["JAX bagua_jax.transform"] / median["torch with_bagua"]
    for n, r in ratios.items():
        print(f"  {n:34s} {r:.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": device,
                    "ms_per_step": {n: t * 1e3 for n, t in median.items()},
                    "ratios": ratios,
                    "args": vars(args),
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
