"""Bagua 0.9.2's MNIST example (examples/mnist/main.py), kept as written for
Bagua except that it runs on CPU and on synthetic MNIST-shaped data (no
download), with a smaller network. Run it with the original launcher:

    python -m bagua.distributed.launch --nproc_per_node 2 examples/bagua_0_9/mnist.py --algorithm bytegrad

Its Bagua calls are the original's: ``import bagua.torch_api as bagua``,
``bagua.init_process_group()``, ``torch.distributed.barrier()`` around the
data set, a plain ``DistributedSampler``, ``model.with_bagua([optimizer],
algorithm)`` with the algorithm from ``bagua.torch_api.algorithms``.
"""

from __future__ import print_function

import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR

import bagua.torch_api as bagua


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(1152, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def synthetic_mnist(n, seed):
    """MNIST-shaped data with a learnable rule: each class lights up its own patch."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 10, (n,), generator=g)
    data = 0.3 * torch.randn(n, 1, 28, 28, generator=g)
    for i, t in enumerate(target.tolist()):
        r, c = divmod(t, 5)
        data[i, 0, 4 + 10 * r : 12 + 10 * r, 1 + 5 * c : 5 + 5 * c] += 1.0
    return torch.utils.data.TensorDataset(data, target)


def train(args, model, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            logging.info(
                "Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                    epoch,
                    batch_idx * len(data),
                    len(train_loader.dataset),
                    100.0 * batch_idx / len(train_loader),
                    loss.item(),
                )
            )


def test(model, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    logging.info(
        "Test set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)".format(
            test_loss, correct, len(test_loader.dataset), 100.0 * correct / len(test_loader.dataset)
        )
    )
    return test_loss


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--batch-size", type=int, default=16, metavar="N")
    parser.add_argument("--test-batch-size", type=int, default=100, metavar="N")
    parser.add_argument("--epochs", type=int, default=2, metavar="N")
    parser.add_argument("--train-size", type=int, default=384, metavar="N")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR")
    parser.add_argument("--gamma", type=float, default=0.7, metavar="M")
    parser.add_argument("--log-interval", type=int, default=4, metavar="N")
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--save-model", default="", help="path to save rank 0's model state dict to")
    parser.add_argument(
        "--algorithm",
        type=str,
        default="gradient_allreduce",
        help="gradient_allreduce, bytegrad, decentralized, low_precision_decentralized, qadam, async",
    )
    parser.add_argument("--async-sync-interval", default=500, type=int)
    return parser.parse_args(argv)


def datasets(args):
    return synthetic_mnist(args.train_size, seed=0), synthetic_mnist(200, seed=1)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    bagua.init_process_group()

    logging.basicConfig(
        format="rank-{} %(asctime)s %(levelname)s: %(message)s".format(bagua.get_rank()),
        level=logging.INFO if bagua.get_rank() == 0 else logging.ERROR,
    )

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}

    # the original downloads MNIST on local rank 0 while the others wait
    if bagua.get_local_rank() == 0:
        dataset1, dataset2 = datasets(args)
        torch.distributed.barrier()
    else:
        torch.distributed.barrier()
        dataset1, dataset2 = datasets(args)

    train_sampler = torch.utils.data.distributed.DistributedSampler(dataset1)
    train_kwargs.update(
        {"sampler": train_sampler, "batch_size": args.batch_size // bagua.get_world_size() or 1, "shuffle": False}
    )
    train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)

    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    if args.algorithm == "gradient_allreduce":
        from bagua.torch_api.algorithms import gradient_allreduce

        algorithm = gradient_allreduce.GradientAllReduceAlgorithm()
    elif args.algorithm == "bytegrad":
        from bagua.torch_api.algorithms import bytegrad

        algorithm = bytegrad.ByteGradAlgorithm()
    elif args.algorithm == "decentralized":
        from bagua.torch_api.algorithms import decentralized

        algorithm = decentralized.DecentralizedAlgorithm()
    elif args.algorithm == "low_precision_decentralized":
        from bagua.torch_api.algorithms import decentralized

        algorithm = decentralized.LowPrecisionDecentralizedAlgorithm()
    elif args.algorithm == "qadam":
        from bagua.torch_api.algorithms import q_adam

        optimizer = q_adam.QAdamOptimizer(model.parameters(), lr=args.lr, warmup_steps=100)
        algorithm = q_adam.QAdamAlgorithm(optimizer)
    elif args.algorithm == "async":
        from bagua.torch_api.algorithms import async_model_average

        algorithm = async_model_average.AsyncModelAverageAlgorithm(sync_interval_ms=args.async_sync_interval)
    else:
        raise NotImplementedError

    model = model.with_bagua([optimizer], algorithm)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        if args.algorithm == "async":
            model.bagua_algorithm.resume(model)
        train(args, model, train_loader, optimizer, epoch)
        if args.algorithm == "async":
            model.bagua_algorithm.abort(model)
        test(model, test_loader)
        scheduler.step()

    if args.save_model and bagua.get_rank() == 0:
        torch.save(model.state_dict(), args.save_model)


if __name__ == "__main__":
    main()
