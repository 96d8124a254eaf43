"""The Bagua 0.9 MNIST example (examples/bagua_0_9/mnist.py) trained with
torch's own DistributedDataParallel over gloo: the reference its Bagua run
(GradientAllReduce) must match. Same model, data, sampler, seeds and loop;
launched by tests/harness/mp.py (torchrun's environment). argv: the example's flags."""

import importlib.util
import os
import sys

import torch
import torch.distributed as dist

from tests.harness.paths import REPO

spec = importlib.util.spec_from_file_location("mnist_example", os.path.join(REPO, "examples", "bagua_0_9", "mnist.py"))
mnist = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mnist)


def main():
    args = mnist.parse_args(sys.argv[1:])
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo")
    dataset1, dataset2 = mnist.datasets(args)
    test_loader = torch.utils.data.DataLoader(dataset2, batch_size=args.test_batch_size)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset1)
    loader = torch.utils.data.DataLoader(
        dataset1, sampler=sampler, shuffle=False, batch_size=args.batch_size // dist.get_world_size() or 1
    )
    model = mnist.Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        mnist.train(args, ddp, loader, optimizer, epoch)
        mnist.test(ddp, test_loader)  # as the example does (its loader draws a seed from torch's RNG)
        scheduler.step()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), args.save_model)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
