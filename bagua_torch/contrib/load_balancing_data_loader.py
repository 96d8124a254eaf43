"""Samplers that give every rank samples of similar complexity at each position.

Contract (the original Bagua's): ``LoadBalancingDistributedSampler`` sorts the
dataset by ``complexity_fn(dataset[i])`` (computed once, for every sample, at
construction), cuts the sorted order into consecutive chunks of
``num_replicas`` samples and gives rank ``r`` the ``r``-th sample of each
chunk; with ``shuffle`` the chunks come in a random order seeded by
``seed + epoch`` (so every rank draws the same order; ``set_epoch`` reshuffles
deterministically), and ``random_level`` in [0, 1] adds integer noise up to
``(max - min) * random_level`` to the complexities before sorting, so equally
complex samples do not always land together. Every rank gets ``num_samples``
indices (the sorted order is read cyclically to pad, or truncated with
``drop_last``).

``LoadBalancingDistributedBatchSampler(sampler, batch_fn)`` groups each rank's
indices into batches with ``batch_fn`` and makes every rank yield the same
number of batches (padding with a rank's own first batches, or truncating to
the fewest with ``drop_last``).
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, List, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

__all__ = ["LoadBalancingDistributedSampler", "LoadBalancingDistributedBatchSampler"]


def _world_defaults(num_replicas: Optional[int], rank: Optional[int]):
    """Missing values from Bagua's group, else torch.distributed's (as the original)."""
    if num_replicas is not None and rank is not None:
        return num_replicas, rank
    import bagua_core

    if bagua_core.is_initialized():
        world, me = bagua_core.get_world_size(), bagua_core.get_rank()
    else:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "pass num_replicas and rank, or initialise Bagua (bagua_torch.init_process_group()) "
                "or torch.distributed first"
            )
        world, me = dist.get_world_size(), dist.get_rank()
    return (world if num_replicas is None else num_replicas), (me if rank is None else rank)


def _as_complexity(c, i: int):
    """``complexity_fn``'s result as a Python int or float: numbers, numpy
    scalars and 0-d tensors or arrays of them; anything else (bool, NaN, a
    string, a tensor of several elements) is a ValueError."""
    value = c
    if isinstance(c, (torch.Tensor, np.ndarray)) and c.ndim == 0:
        value = c.item()
    elif isinstance(c, np.generic):
        value = c.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"complexity_fn must return a number, got {c!r} for sample {i}")
    return value


class LoadBalancingDistributedSampler(Sampler[int]):
    def __init__(
        self,
        dataset: Dataset,
        complexity_fn: Callable[..., int],
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        random_level: float = 0,
    ) -> None:
        num_replicas, rank = _world_defaults(num_replicas, rank)
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive integer, got {num_replicas!r}")
        if not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        if not 0 <= random_level <= 1:
            raise ValueError(f"Invalid random level {random_level}, should be in the range [0.0, 1.0]")
        if not callable(complexity_fn):
            raise TypeError("complexity_fn must be callable: it maps a sample to its complexity (a number)")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.random_level = random_level
        n = len(dataset)  # type: ignore[arg-type]  # a map-style dataset has a length
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        complexities = []
        for i in range(n):
            try:
                c = complexity_fn(dataset[i])
            except Exception as e:
                raise ValueError(f"complexity_fn failed on sample {i}: {type(e).__name__}: {e}") from e
            complexities.append(_as_complexity(c, i))
        self.complexities = complexities
        # stable ascending sort: equal complexities keep dataset order
        self.sorted_indices = sorted(range(n), key=lambda i: complexities[i])
        spread = (max(complexities) - min(complexities)) if complexities else 0
        self.random_number = int(spread * random_level + 1)

    def _sorted_order(self, g: Optional[torch.Generator]) -> List[int]:
        if g is None:
            return list(self.sorted_indices)
        # drawn even when random_level is 0 (all zeros), so the chunk order is the original's
        noise = torch.randint(0, self.random_number, (len(self.complexities),), generator=g).tolist()
        noisy = [c + e for c, e in zip(self.complexities, noise)]
        return sorted(range(len(noisy)), key=lambda i: noisy[i])

    def shuffle_chunks(self) -> List[List[int]]:
        """The chunks of ``num_replicas`` indices, in this epoch's order."""
        g = torch.Generator().manual_seed(self.seed + self.epoch) if self.shuffle else None
        order = self._sorted_order(g)
        if not order:
            return []
        cyclic = [order[i % len(order)] for i in range(self.total_size)]
        chunks = [cyclic[i : i + self.num_replicas] for i in range(0, self.total_size, self.num_replicas)]
        if g is not None:
            chunks = [chunks[i] for i in torch.randperm(len(chunks), generator=g).tolist()]
        return chunks

    def __iter__(self) -> Iterator[int]:
        return iter([chunk[self.rank] for chunk in self.shuffle_chunks()])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Reshuffles for ``epoch`` (the same on every rank); call before each epoch."""
        self.epoch = epoch


class LoadBalancingDistributedBatchSampler(Sampler[List[int]]):
    def __init__(
        self,
        sampler: LoadBalancingDistributedSampler,
        batch_fn: Callable[[List[int]], List[List[int]]],
        drop_last: bool = False,
    ) -> None:
        if not isinstance(sampler, LoadBalancingDistributedSampler):
            raise ValueError("sampler should be of LoadBalancingDistributedSampler type.")
        if sampler.drop_last:
            raise ValueError("drop_last of sampler should be False")
        if not callable(batch_fn):
            raise TypeError("batch_fn must be callable: it groups a rank's indices into batches")
        self.sampler = sampler
        self.batch_fn = batch_fn
        self.drop_last = drop_last
        self.num_replicas = sampler.num_replicas
        self.rank = sampler.rank
        self.generate_batches()

    def generate_batches(self) -> None:
        chunks = self.sampler.shuffle_chunks()
        per_rank = []
        for r in range(self.num_replicas):
            batches = list(self.batch_fn([chunk[r] for chunk in chunks]))
            if any(not isinstance(b, (list, tuple)) for b in batches):
                raise ValueError("batch_fn must return a list of batches (lists of indices)")
            per_rank.append(batches)
        counts = [len(b) for b in per_rank]
        self.total_batch = min(counts) if self.drop_last else max(counts)
        mine = per_rank[self.rank]
        if self.total_batch and not mine:
            raise ValueError(f"batch_fn gave rank {self.rank} no batch while another rank got {max(counts)}")
        self.padded_batches = [list(mine[i % len(mine)]) for i in range(self.total_batch)] if mine else []

    def __iter__(self) -> Iterator[List[int]]:
        return iter(self.padded_batches)

    def __len__(self) -> int:
        return self.total_batch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.generate_batches()
