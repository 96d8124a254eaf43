"""Bagua 0.9.2's elastic-training example, on CPU and synthetic MNIST-shaped
data: rank 0 saves a checkpoint after each epoch, and every (re)started
worker group resumes from it. Its launch line is the original's:

    python -m bagua.distributed.run --nnodes=1:2 --nproc_per_node=2 --max_restarts=3 \\
        --rdzv_id=JOB_ID --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT \\
        examples/bagua_0_9/elastic_mnist.py --checkpoint_path /shared/mnist.ckpt

Run the same command on another machine to add a node (up to 2 here); kill
a worker and its group restarts (up to ``--max_restarts`` times) from the
last checkpoint. The model and data are those of ``mnist.py``. ``--kill-rank-at-epoch R:E`` makes rank R kill itself
(SIGKILL) at epoch E of the first attempt, to see a restart happen.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal

import torch
import torch.nn.functional as F
import torch.optim as optim
from mnist import Net, synthetic_mnist  # the MNIST example's model and data, beside this file
from torch.optim.lr_scheduler import StepLR

import bagua.torch_api as bagua


def main():
    parser = argparse.ArgumentParser(description="Elastic MNIST with Bagua")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--train-size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--algorithm", default="gradient_allreduce", help="gradient_allreduce, bytegrad, decentralized")
    parser.add_argument("--checkpoint_path", default="./mnist.ckpt", help="a path every node can reach")
    parser.add_argument("--kill-rank-at-epoch", default="", metavar="R:E", help="rank R SIGKILLs itself at epoch E")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    bagua.init_process_group()
    rank, world = bagua.get_rank(), bagua.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    logging.basicConfig(format=f"rank-{rank} %(message)s", level=logging.INFO if rank == 0 else logging.ERROR)
    logging.info(f"world size {world}, restart {restart}")

    train_set, test_set = synthetic_mnist(args.train_size, 0), synthetic_mnist(200, 1)
    sampler = torch.utils.data.distributed.DistributedSampler(train_set, num_replicas=world, rank=rank)
    loader = torch.utils.data.DataLoader(train_set, batch_size=max(1, args.batch_size // world), sampler=sampler)
    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    algorithm = bagua.algorithms.Algorithm.init(args.algorithm)

    start_epoch = 1
    if os.path.exists(args.checkpoint_path):
        checkpoint = torch.load(args.checkpoint_path)
        model.load_state_dict(checkpoint["model_state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
        start_epoch = checkpoint["epoch"]
        logging.info(f"resumed at epoch {start_epoch}")
    model = model.with_bagua([optimizer], algorithm)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)  # the checkpoint's lr is already decayed

    kill_rank, _, kill_epoch = args.kill_rank_at_epoch.partition(":")
    for epoch in range(start_epoch, args.epochs + 1):
        if args.kill_rank_at_epoch and restart == 0 and rank == int(kill_rank) and epoch == int(kill_epoch):
            os.kill(os.getpid(), signal.SIGKILL)
        sampler.set_epoch(epoch)
        model.train()
        for data, target in loader:
            optimizer.zero_grad()
            F.nll_loss(model(data), target).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            data, target = test_set.tensors
            loss = F.nll_loss(model(data), target).item()
        logging.info(f"epoch {epoch} world size {world} test loss {loss:.4f}")
        scheduler.step()
        if rank == 0:
            state = {
                "epoch": epoch + 1,
                "model_state_dict": model.state_dict(),
                "optimizer_state_dict": optimizer.state_dict(),
            }
            torch.save(state, args.checkpoint_path + ".tmp")
            os.replace(args.checkpoint_path + ".tmp", args.checkpoint_path)  # never half a checkpoint
        bagua.barrier()
    logging.info("done")


if __name__ == "__main__":
    main()
