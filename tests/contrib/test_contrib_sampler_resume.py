"""Samplers that keep their place in the epoch (ResumableDistributedSampler,
LoadBalancingDistributedSampler): the same indices as torch's
DistributedSampler / the original's; a state saved mid-epoch resumes on the
same number of ranks with the uninterrupted run's indices, and on another
number of ranks (4 -> 3, 3 -> 4 -> 2, 2 -> 5) with every sample of the epoch
seen exactly once, counted (drop_last cuts at most one short deal at the end;
without it, only the last deal's padding repeats)."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils.data import DistributedSampler

from bagua_torch.contrib import LoadBalancingDistributedSampler, ResumableDistributedSampler


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return (i * 37) % 11  # sample i's complexity


def _make(kind, n, world, rank, drop_last, state=None, epoch=4):
    if kind == "resumable":
        s = ResumableDistributedSampler(Data(n), world, rank, shuffle=True, seed=3, drop_last=drop_last)
    else:
        s = LoadBalancingDistributedSampler(Data(n), lambda x: x, world, rank, seed=3, drop_last=drop_last)
    if state is not None:
        s.load_state_dict(state)
    s.set_epoch(epoch)  # as a training loop does, also after loading
    return s


def _steps(samplers, steps, batch):
    """Each rank trains ``steps`` batches; returns the indices each took."""
    taken = [list(s)[: steps * batch] for s in samplers]
    for s in samplers:
        for _ in range(steps):
            s.advance(batch)
    return taken


@pytest.mark.parametrize("n,world,drop_last", [(50, 4, False), (50, 4, True), (12, 3, False), (7, 2, True)])
@pytest.mark.parametrize("epoch", [0, 2])
def test_resumable_is_torch_distributed_sampler(n, world, drop_last, epoch):
    for rank in range(world):
        ours = ResumableDistributedSampler(Data(n), world, rank, seed=5, drop_last=drop_last)
        theirs = DistributedSampler(Data(n), world, rank, seed=5, drop_last=drop_last)
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize("kind", ["resumable", "load_balancing"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_same_ranks_resume_with_the_uninterrupted_indices(kind, drop_last):
    world, n, batch = 3, 47, 2
    uninterrupted = [list(_make(kind, n, world, r, drop_last)) for r in range(world)]
    first = [_make(kind, n, world, r, drop_last) for r in range(world)]
    taken = _steps(first, 4, batch)
    state = first[0].state_dict()
    assert state == {"epoch": 4, "consumed_samples": 4 * batch * world, "num_replicas": world, "segments": []}
    for r in range(world):
        assert taken[r] + list(_make(kind, n, world, r, drop_last, state)) == uninterrupted[r]


@pytest.mark.parametrize("kind", ["resumable", "load_balancing"])
@pytest.mark.parametrize("worlds", [(4, 3), (3, 4, 2), (2, 5)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_another_number_of_ranks_sees_every_sample_once(kind, worlds, drop_last):
    n, batch = 60, 2
    seen: collections.Counter = collections.Counter()
    state = None
    for world in worlds[:-1]:  # two steps on each number of ranks, then a save
        samplers = [_make(kind, n, world, r, drop_last, state) for r in range(world)]
        for mine in _steps(samplers, 2, batch):
            seen.update(mine)
        state = samplers[0].state_dict()
    last = worlds[-1]
    for r in range(last):  # the rest of the epoch
        seen.update(_make(kind, n, last, r, drop_last, state))
    repeated = [i for i, c in seen.items() if c > 1]
    lost = set(range(n)) - set(seen)
    if drop_last:
        assert not repeated and len(lost) < last, (repeated, lost)  # one short deal cut at the end
    else:
        assert not lost and sum(seen[i] - 1 for i in repeated) < last, (lost, repeated)  # its padding


def test_load_balancing_chunks_stay_complexity_neighbours_after_resharding():
    n = 40
    first = [_make("load_balancing", n, 4, r, True) for r in range(4)]
    taken = {i for mine in _steps(first, 3, 1) for i in mine}
    after = _make("load_balancing", n, 3, 0, True, first[0].state_dict())
    remaining = sorted((i for i in range(n) if i not in taken), key=lambda i: (i * 37) % 11)  # stable, as the sampler
    runs = {tuple(sorted(remaining[k : k + 3])) for k in range(0, len(remaining) - len(remaining) % 3, 3)}
    chunks = after.shuffle_chunks()
    assert chunks and all(tuple(sorted(c)) in runs for c in chunks), chunks


def test_bad_states_and_steps():
    s = ResumableDistributedSampler(Data(10), 2, 0)
    for bad in (
        {},
        {"epoch": 0, "consumed_samples": -1, "num_replicas": 2},
        {"epoch": 0, "consumed_samples": 0, "num_replicas": 0},
    ):
        with pytest.raises(ValueError, match="a sampler state needs"):
            s.load_state_dict(bad)
    with pytest.raises(ValueError, match="batch_size"):
        s.advance(-1)
