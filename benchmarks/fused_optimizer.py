"""Optimizer step time, fused (``fuse_optimizer(opt).fuse_step()``) against
unfused (``opt.step()``), on a model with many small parameters.

    PYTHONPATH=$PWD python benchmarks/fused_optimizer.py [--layers 200] [--width 32]
        [--optimizers SGD Adam AdamW RMSprop Adadelta] [--iters 50] [--threads 1]

The model is ``--layers`` Linear(width, width) layers (2 tensors each). Both
copies get the same gradients; per optimizer the two step kinds take turns,
sample by sample, so machine-load drift hits them alike; the table shows the
median step time of ``--iters`` samples after a warm-up and the ratio
unfused / fused (above 1: fusing is faster). Before timing, one step of each
is checked to give bitwise the same weights.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bagua_torch.contrib import fuse_optimizer

DEFAULT_KW = {
    "SGD": dict(lr=0.01, momentum=0.9),
    "Adam": dict(lr=1e-3),
    "AdamW": dict(lr=1e-3),
    "RMSprop": dict(lr=1e-3),
    "Adadelta": dict(lr=1.0),
    "Adamax": dict(lr=1e-3),
    "Rprop": dict(lr=1e-3),
    "ASGD": dict(lr=1e-3),
}


def model(layers, width):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def with_grads(m):
    g = torch.Generator().manual_seed(1)
    for p in m.parameters():
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    return m


def bench(name, layers, width, iters, device):
    ref, fused = with_grads(model(layers, width).to(device)), model(layers, width).to(device)
    ref_opt = getattr(torch.optim, name)(ref.parameters(), **DEFAULT_KW[name])
    opt = fuse_optimizer(getattr(torch.optim, name)(fused.parameters(), **DEFAULT_KW[name]))
    with torch.no_grad():  # same gradients, now living in the flat buffer fuse_step prepared
        for a, b in zip(ref.parameters(), fused.parameters()):
            b.grad = a.grad.clone()
    ref_opt.step()
    opt.fuse_step()
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), fused.parameters())), "results differ"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = {"unfused": [], "fused": []}
    for _ in range(5):
        ref_opt.step()
        opt.fuse_step()
    for i in range(iters):
        order = (("unfused", ref_opt.step), ("fused", opt.fuse_step))
        for kind, step in order if i % 2 == 0 else order[::-1]:
            sync()
            t = time.perf_counter()
            step()
            sync()
            times[kind].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}, opt._bagua_fused_count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument(
        "--optimizers", nargs="+", default=["SGD", "Adam", "AdamW", "RMSprop", "Adadelta"], choices=sorted(DEFAULT_KW)
    )
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    n = a.layers * 2
    print(
        f"torch {torch.__version__}, {a.device}, {n} parameter tensors "
        f"({a.layers} x Linear({a.width}, {a.width})), {a.threads} thread(s), median of {a.iters}"
    )
    print(f"{'optimizer':<10} {'unfused ms':>11} {'fused ms':>9} {'ratio':>7}")
    for name in a.optimizers:
        t, count = bench(name, a.layers, a.width, a.iters, a.device)
        assert count > 0, "fuse_step did not fuse"
        print(f"{name:<10} {t['unfused'] * 1e3:>11.3f} {t['fused'] * 1e3:>9.3f} {t['unfused'] / t['fused']:>6.2f}x")


if __name__ == "__main__":
    main()
