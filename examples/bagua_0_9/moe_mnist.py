"""An MNIST-style model with mixture-of-experts layers, written for Bagua
0.9.2's API (``bagua.moe.MoE``, ``model.with_bagua``, ``bagua.torch_api.checkpoint``)
as its MoE example is, on CPU and synthetic MNIST-shaped data. Run it with:

    python -m bagua.distributed.launch --nproc_per_node 2 examples/bagua_0_9/moe_mnist.py \\
        --num-local-experts 2 --algorithm bytegrad --save-checkpoint /tmp/moe-ckpt

Each rank holds ``--num-local-experts`` experts of each MoE layer; tokens
(here: one per sample) travel to their experts and back by all-to-all. With
``--save-checkpoint DIR`` the model and optimizer are saved in Bagua 0.9's
layout (a file per expert, an optimizer file per rank); ``--resume DIR``
loads them first and prints the iteration it resumed from.
"""

from __future__ import annotations

import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from mnist import synthetic_mnist  # the MNIST example's data, beside this file

import bagua.torch_api as bagua
from bagua.torch_api.checkpoint import load_checkpoint, save_checkpoint


class ExpertLayer(nn.Module):
    """A residual block whose feed-forward part is a mixture of experts."""

    def __init__(self, width, num_local_experts):
        super().__init__()
        expert = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
        self.moe = bagua.moe.MoE(width, expert, num_local_experts, k=2)

    def forward(self, x):
        y, l_aux, _ = self.moe(x)
        return x + y, l_aux


class Net(nn.Module):
    def __init__(self, num_local_experts, num_layers=2, width=32):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.fc1 = nn.Linear(1152, width)
        self.experts = nn.ModuleList([ExpertLayer(width, num_local_experts) for _ in range(num_layers)])
        self.fc2 = nn.Linear(width, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        l_aux = 0.0
        for layer in self.experts:
            x, aux = layer(x)
            l_aux = l_aux + aux
        return F.log_softmax(self.fc2(x), dim=1), l_aux


def main():
    parser = argparse.ArgumentParser(description="MNIST with mixture-of-experts layers")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--num-local-experts", type=int, default=2)
    parser.add_argument("--aux-loss-weight", type=float, default=0.01)
    parser.add_argument("--algorithm", default="gradient_allreduce", help="gradient_allreduce, bytegrad, decentralized")
    parser.add_argument("--save-checkpoint", default="", help="directory to save the final checkpoint to")
    parser.add_argument("--resume", default="", help="directory to load a checkpoint from first")
    args = parser.parse_args()

    torch.set_num_threads(1)
    bagua.init_process_group()
    torch.manual_seed(bagua.get_rank())  # each rank's experts start differently; with_bagua aligns the rest
    logging.basicConfig(
        format=f"rank-{bagua.get_rank()} %(levelname)s: %(message)s",
        level=logging.INFO if bagua.get_rank() == 0 else logging.ERROR,
    )

    train_set, test_set = synthetic_mnist(args.train_size, seed=0), synthetic_mnist(200, seed=1)
    sampler = torch.utils.data.distributed.DistributedSampler(train_set)
    train_loader = torch.utils.data.DataLoader(
        train_set, batch_size=max(1, args.batch_size // bagua.get_world_size()), sampler=sampler
    )
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=100)

    model = Net(args.num_local_experts)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    algorithm = bagua.algorithms.Algorithm.init(args.algorithm)
    model = model.with_bagua([optimizer], algorithm)
    start = load_checkpoint(args.resume, model, optimizer) if args.resume else 0
    if args.resume:
        logging.info(f"resumed from iteration {start}")

    iteration = start
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        for data, target in train_loader:
            output, l_aux = model(data)
            loss = F.nll_loss(output, target) + args.aux_loss_weight * l_aux
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            iteration += 1
        model.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for data, target in test_loader:
                output, _ = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                correct += int((output.argmax(dim=1) == target).sum())
        logging.info(f"Test set: Average loss: {test_loss / len(test_set):.4f}, Accuracy: {correct}/{len(test_set)}")

    if args.save_checkpoint:
        save_checkpoint(iteration, args.save_checkpoint, model, optimizer)
        logging.info(f"saved iteration {iteration} to {args.save_checkpoint}")


if __name__ == "__main__":
    main()
