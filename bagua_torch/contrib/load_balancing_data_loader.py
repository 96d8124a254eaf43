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

Beyond the original, ``LoadBalancingDistributedSampler`` and
``ResumableDistributedSampler`` (torch's ``DistributedSampler``, the same
indices) keep their place in the epoch: ``advance(batch_size)`` after each
step, ``state_dict()`` / ``load_state_dict()``, and a state saved by one
number of ranks resumes on another without losing or repeating a sample
(:mod:`bagua_torch.contrib.sampler_position`).
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, List, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from bagua_torch.contrib.sampler_position import SamplerPosition

__all__ = ["LoadBalancingDistributedSampler", "LoadBalancingDistributedBatchSampler", "ResumableDistributedSampler"]


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


def _check_layout(num_replicas, rank) -> None:
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be a positive integer, got {num_replicas!r}")
    if not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")


def _sample_count(n: int, num_replicas: int, drop_last: bool) -> int:
    """Samples per rank for ``n`` samples (torch's DistributedSampler's rule)."""
    if drop_last and n % num_replicas != 0:
        return math.ceil((n - num_replicas) / num_replicas)
    return math.ceil(n / num_replicas)


class ResumableDistributedSampler(SamplerPosition, Sampler[int]):
    """torch's ``DistributedSampler`` (the same indices for the same seed and
    epoch) that keeps its place in the epoch and re-shards (see the module doc)."""

    def __init__(
        self,
        dataset: Dataset,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        num_replicas, rank = _world_defaults(num_replicas, rank)
        _check_layout(num_replicas, rank)
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        self._start_position()

    def _all_indices(self) -> List[int]:
        return list(range(len(self.dataset)))  # type: ignore[arg-type]  # a map-style dataset has a length

    def _epoch_order(self, indices: List[int], num_replicas: int) -> List[int]:
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        if len(indices) != n:
            keep = set(indices)
            order = [i for i in order if i in keep]
        total = _sample_count(len(order), num_replicas, self.drop_last) * num_replicas
        if total <= len(order):
            return order[:total]
        return (order * math.ceil(total / max(len(order), 1)))[:total] if order else []

    def __iter__(self) -> Iterator[int]:
        return iter(self._my_indices())

    def __len__(self) -> int:
        return len(self._my_indices())


class LoadBalancingDistributedSampler(SamplerPosition, Sampler[int]):
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
        _check_layout(num_replicas, rank)
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
        self.num_samples = _sample_count(n, num_replicas, drop_last)
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
        self._start_position()

    def _sorted_order(self, g: Optional[torch.Generator]) -> List[int]:
        if g is None:
            return list(self.sorted_indices)
        # drawn even when random_level is 0 (all zeros), so the chunk order is the original's
        noise = torch.randint(0, self.random_number, (len(self.complexities),), generator=g).tolist()
        noisy = [c + e for c, e in zip(self.complexities, noise)]
        return sorted(range(len(noisy)), key=lambda i: noisy[i])

    def _all_indices(self) -> List[int]:
        return list(range(len(self.complexities)))

    def _epoch_order(self, indices: List[int], num_replicas: int) -> List[int]:
        return [i for chunk in self._chunks(indices, num_replicas) for i in chunk]

    def _chunks(self, indices: List[int], num_replicas: int) -> List[List[int]]:
        """Chunks of ``num_replicas`` of ``indices`` in complexity order, in this epoch's order."""
        g = torch.Generator().manual_seed(self.seed + self.epoch) if self.shuffle else None
        order = self._sorted_order(g)
        if len(indices) != len(order):
            keep = set(indices)
            order = [i for i in order if i in keep]
        if not order:
            return []
        total = _sample_count(len(order), num_replicas, self.drop_last) * num_replicas
        cyclic = [order[i % len(order)] for i in range(total)]
        chunks = [cyclic[i : i + num_replicas] for i in range(0, total, num_replicas)]
        if g is not None:
            chunks = [chunks[i] for i in torch.randperm(len(chunks), generator=g).tolist()]
        return chunks

    def shuffle_chunks(self) -> List[List[int]]:
        """The chunks of ``num_replicas`` indices still ahead in this epoch, in its order."""
        order = self._order_now()[self.consumed_samples :]
        w = self.num_replicas
        return [order[i : i + w] for i in range(0, len(order), w)]

    def __iter__(self) -> Iterator[int]:
        return iter([chunk[self.rank] for chunk in self.shuffle_chunks()])

    def __len__(self) -> int:
        return len(self.shuffle_chunks())


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
