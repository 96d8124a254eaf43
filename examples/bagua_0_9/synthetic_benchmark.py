"""Bagua 0.9.2's synthetic benchmark (itself Horovod's), on CPU: a model
trained on one fixed random batch, with throughput printed as the original
prints it. Run it with:

    python -m bagua.distributed.launch --nproc_per_node 2 examples/bagua_0_9/synthetic_benchmark.py \\
        --algorithm bytegrad --num-iters 5

The original's torchvision models (``--model resnet50``) are used when
torchvision imports; ``--model small_cnn`` (the default here) and
``--model mlp`` need nothing else. ``--deterministic`` seeds each rank and
prints the final loss, which the original's CI compared across runs.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

import bagua.torch_api as bagua

parser = argparse.ArgumentParser(
    description="PyTorch Synthetic Benchmark", formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument("--model", type=str, default="small_cnn", help="small_cnn, mlp, or a torchvision model name")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size")
parser.add_argument("--image-size", type=int, default=64, help="height and width of the synthetic images")
parser.add_argument("--num-classes", type=int, default=100)
parser.add_argument("--num-warmup-batches", type=int, default=2, help="warm-up batches not counted")
parser.add_argument("--num-batches-per-iter", type=int, default=5, help="batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=5, help="benchmark iterations")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
parser.add_argument("--deterministic", action="store_true", default=False, help="seeded, reproducible training")
parser.add_argument(
    "--algorithm",
    type=str,
    default="gradient_allreduce",
    help="gradient_allreduce, bytegrad, decentralized, low_precision_decentralized, qadam, async",
)
parser.add_argument("--async-sync-interval", default=100, type=int, help="async: averaging interval (ms)")
parser.add_argument("--async-warmup-steps", default=10, type=int, help="async: steps before averaging starts")
parser.add_argument("--amp", action="store_true", default=False, help="mixed precision (CUDA only)")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()


def build_model(name, num_classes, size):
    if name == "mlp":
        return torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(3 * size * size, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, num_classes),
        )
    if name == "small_cnn":
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Linear(512, num_classes),
        )
    from torchvision import models  # the original's models

    return getattr(models, name)(num_classes=num_classes)


if args.cuda:
    torch.cuda.set_device(bagua.get_local_rank())
else:
    torch.set_num_threads(1)
bagua.init_process_group()
if args.deterministic:
    np.random.seed(bagua.get_rank())
    torch.manual_seed(bagua.get_rank())

model = build_model(args.model, args.num_classes, args.image_size)
if args.cuda:
    model.cuda()
optimizer = optim.SGD(model.parameters(), lr=0.01 * bagua.get_world_size())

if args.algorithm == "qadam":
    from bagua.torch_api.algorithms import q_adam

    optimizer = q_adam.QAdamOptimizer(model.parameters(), lr=1e-3, warmup_steps=5)
    algorithm = q_adam.QAdamAlgorithm(optimizer)
elif args.algorithm == "async":
    algorithm = bagua.algorithms.Algorithm.init(
        "async", sync_interval_ms=args.async_sync_interval, warmup_steps=args.async_warmup_steps
    )
else:  # gradient_allreduce, bytegrad, decentralized, low_precision_decentralized, ...
    algorithm = bagua.algorithms.Algorithm.init(args.algorithm)

model = model.with_bagua([optimizer], algorithm)
amp = args.amp and args.cuda
scaler = torch.amp.GradScaler("cuda", enabled=amp)

data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.LongTensor(args.batch_size).random_() % args.num_classes
if args.cuda:
    data, target = data.cuda(), target.cuda()
last_loss = [float("nan")]


def benchmark_step():
    optimizer.zero_grad()
    with torch.autocast("cuda", enabled=amp):
        loss = F.cross_entropy(model(data), target)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    last_loss[0] = loss.item()


def log(s):
    if bagua.get_rank() == 0:
        print(s, flush=True)


device = "GPU" if args.cuda else "CPU"
log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
log(f"Number of {device}s: {bagua.get_world_size()}")
log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log(f"Iter #{x}: {img_sec * bagua.get_world_size():.1f} img/sec {device}")
    img_secs.append(img_sec)
if args.algorithm == "async":
    algorithm.abort(model)

img_sec_mean, img_sec_conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
log(
    f"Total img/sec on {bagua.get_world_size()} {device}(s): "
    f"{bagua.get_world_size() * img_sec_mean:.1f} +-{bagua.get_world_size() * img_sec_conf:.1f}"
)
if args.deterministic:
    log(f"Final loss: {last_loss[0]:.6f}")
