"""Bagua 0.9.2's ImageNet example, on CPU: ImageFolder data (``DIR/train``
and ``DIR/val``, one sub-directory of images per class), a ResNet, SGD with
momentum and a step learning-rate schedule, top-1/top-5 accuracy, rank 0
saving ``checkpoint.pth.tar`` and ``model_best.pth.tar``, ``--resume`` and
``--evaluate``; the flags are the original's. torchvision does not import
next to the CPU build of torch, so the images are read with Pillow and the
default ``--arch small_resnet`` is defined here (a torchvision name is used
when torchvision imports). Run it with:

    python -m bagua.distributed.launch --nproc_per_node 2 examples/bagua_0_9/imagenet.py DIR \\
        --algorithm bytegrad --epochs 3 --image-size 32
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

import bagua.torch_api as bagua

MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp")


class ImageFolder(torch.utils.data.Dataset):
    """torchvision's ImageFolder layout: classes are the sorted sub-directories."""

    def __init__(self, root, size, train):
        self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        if not self.classes:
            raise FileNotFoundError(f"{root} has no class directories")
        self.samples = [
            (os.path.join(root, c, f), i)
            for i, c in enumerate(self.classes)
            for f in sorted(os.listdir(os.path.join(root, c)))
            if f.lower().endswith(EXTENSIONS)
        ]
        self.size, self.train = size, train

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        with Image.open(path) as img:
            img = img.convert("RGB")
            if self.train:  # a random crop of 64-100% of the side, then a random flip
                w, h = img.size
                side = int(min(w, h) * random.uniform(0.64, 1.0))
                x, y = random.randint(0, w - side), random.randint(0, h - side)
                img = img.crop((x, y, x + side, y + side))
                if random.random() < 0.5:
                    img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            img = img.resize((self.size, self.size))
            array = (np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(array.astype(np.float32)).permute(2, 0, 1), target


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential() if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride, bias=False)

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + self.skip(x))


def small_resnet(num_classes):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        Block(16, 16, 1),
        Block(16, 32, 2),
        Block(32, 64, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def build_model(arch, num_classes):
    if arch == "small_resnet":
        return small_resnet(num_classes)
    from torchvision import models

    return models.__dict__[arch](num_classes=num_classes)


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, value, n=1):
        self.sum += value * n
        self.count += n

    @property
    def avg(self):
        return self.sum / max(self.count, 1)


def accuracy(output, target, topk=(1,)):
    maxk = min(max(topk), output.shape[1])
    pred = output.topk(maxk, 1, True, True)[1].t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    return [correct[: min(k, maxk)].reshape(-1).float().sum() * 100.0 / target.shape[0] for k in topk]


def train(loader, model, optimizer, epoch, args):
    losses, top1 = AverageMeter(), AverageMeter()
    model.train()
    start = time.time()
    for i, (images, target) in enumerate(loader):
        output = model(images)
        loss = F.cross_entropy(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.update(loss.item(), images.shape[0])
        top1.update(accuracy(output, target)[0].item(), images.shape[0])
        if i % args.print_freq == 0 and bagua.get_rank() == 0:
            print(f"Epoch: [{epoch}][{i}/{len(loader)}]\tLoss {losses.avg:.4f}\tAcc@1 {top1.avg:.2f}", flush=True)
    if bagua.get_rank() == 0:
        print(f"Epoch {epoch} took {time.time() - start:.1f} s", flush=True)


def validate(loader, model):
    top1, top5 = AverageMeter(), AverageMeter()
    model.eval()
    with torch.no_grad():
        for images, target in loader:
            a1, a5 = accuracy(model(images), target, topk=(1, 5))
            top1.update(a1.item(), images.shape[0])
            top5.update(a5.item(), images.shape[0])
    if bagua.get_rank() == 0:
        print(f" * Acc@1 {top1.avg:.3f} Acc@5 {top5.avg:.3f}", flush=True)
    return top1.avg


def main():
    parser = argparse.ArgumentParser(description="ImageNet training with Bagua (CPU)")
    parser.add_argument("data", metavar="DIR", help="path to the data set (train/ and val/ in ImageFolder layout)")
    parser.add_argument("-a", "--arch", default="small_resnet")
    parser.add_argument("-j", "--workers", default=0, type=int, help="data loading workers")
    parser.add_argument("--epochs", default=3, type=int)
    parser.add_argument("--start-epoch", default=0, type=int)
    parser.add_argument("-b", "--batch-size", default=16, type=int, help="total over all ranks")
    parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr")
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("-p", "--print-freq", default=10, type=int)
    parser.add_argument("--resume", default="", type=str, help="path to a checkpoint")
    parser.add_argument("-e", "--evaluate", dest="evaluate", action="store_true")
    parser.add_argument("--seed", default=None, type=int)
    parser.add_argument("--image-size", default=32, type=int, help="the original's is 224")
    parser.add_argument("--save-dir", default=".", help="where rank 0 writes checkpoint.pth.tar")
    parser.add_argument(
        "--algorithm",
        default="gradient_allreduce",
        help="gradient_allreduce, bytegrad, decentralized, low_precision_decentralized, qadam, async",
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    if args.seed is not None:
        random.seed(args.seed)
        torch.manual_seed(args.seed)
    bagua.init_process_group()

    train_set = ImageFolder(os.path.join(args.data, "train"), args.image_size, train=True)
    val_set = ImageFolder(os.path.join(args.data, "val"), args.image_size, train=False)
    model = build_model(args.arch, len(train_set.classes))
    if args.algorithm == "qadam":
        from bagua.torch_api.algorithms import q_adam

        optimizer = q_adam.QAdamOptimizer(model.parameters(), lr=args.lr, warmup_steps=100)
        algorithm = q_adam.QAdamAlgorithm(optimizer)
    else:
        optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
        algorithm = bagua.algorithms.Algorithm.init(args.algorithm)

    best_acc1 = 0.0
    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu")
        args.start_epoch = checkpoint["epoch"]
        best_acc1 = checkpoint["best_acc1"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if bagua.get_rank() == 0:
            print(f"=> loaded checkpoint '{args.resume}' (epoch {checkpoint['epoch']})", flush=True)
    model = model.with_bagua([optimizer], algorithm)

    sampler = torch.utils.data.distributed.DistributedSampler(train_set)
    per_rank = max(1, args.batch_size // bagua.get_world_size())
    train_loader = torch.utils.data.DataLoader(
        train_set, batch_size=per_rank, sampler=sampler, num_workers=args.workers
    )
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=per_rank, num_workers=args.workers)
    if args.evaluate:
        validate(val_loader, model)
        return
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    for epoch in range(args.start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        if args.algorithm == "async":
            algorithm.resume(model)
        train(train_loader, model, optimizer, epoch, args)
        if args.algorithm == "async":
            algorithm.abort(model)
        acc1 = validate(val_loader, model)
        scheduler.step()
        is_best, best_acc1 = acc1 > best_acc1, max(acc1, best_acc1)
        if bagua.get_rank() == 0:
            state = {
                "epoch": epoch + 1,
                "arch": args.arch,
                "state_dict": model.state_dict(),
                "best_acc1": best_acc1,
                "optimizer": optimizer.state_dict(),
            }
            path = os.path.join(args.save_dir, "checkpoint.pth.tar")
            torch.save(state, path)
            if is_best:
                shutil.copyfile(path, os.path.join(args.save_dir, "model_best.pth.tar"))


if __name__ == "__main__":
    main()
