"""LoadBalancingDistributedSampler / LoadBalancingDistributedBatchSampler
against the original's rules: complexity order, ranks holding samples of
neighbouring complexity at every position, every sample served (cyclic
padding) or dropped per drop_last, set_epoch reshuffling identically in
independent processes' samplers, random_level noise, batch padding and
truncation, and clear errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bagua_torch.contrib import LoadBalancingDistributedBatchSampler, LoadBalancingDistributedSampler


class Lengths(torch.utils.data.Dataset):
    """Samples are token lists; complexity is their length."""

    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(1, 50, (n,), generator=g).tolist()

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return [0] * self.lengths[i]


def samplers(ds, world, **kw):
    """One sampler per rank, built independently as separate processes would."""
    return [LoadBalancingDistributedSampler(ds, len, num_replicas=world, rank=r, **kw) for r in range(world)]


def test_one_replica_without_shuffle_is_complexity_order():
    ds = Lengths(40)
    (s,) = samplers(ds, 1, shuffle=False)
    order = list(s)
    assert sorted(order) == list(range(40))
    assert [ds.lengths[i] for i in order] == sorted(ds.lengths)
    # stable: equal complexities keep dataset order
    assert order == sorted(range(40), key=lambda i: ds.lengths[i])


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_get_neighbouring_complexities_at_each_position(world, shuffle):
    ds = Lengths(37)
    per_rank = [list(s) for s in samplers(ds, world, shuffle=shuffle, seed=7)]
    n = len(per_rank[0])
    assert n == -(-37 // world) and all(len(p) == n for p in per_rank)
    ranked = sorted(range(37), key=lambda i: ds.lengths[i])  # stable, as the sampler's
    cyclic = [ranked[k % 37] for k in range(n * world)]
    chunks = [tuple(cyclic[k : k + world]) for k in range(0, n * world, world)]  # consecutive in complexity
    positions = [tuple(per_rank[r][pos] for r in range(world)) for pos in range(n)]
    if shuffle:
        assert sorted(positions) == sorted(chunks)  # the chunks, in a shuffled order
    else:
        assert positions == chunks
    served = {i for p in positions for i in p}
    assert served == set(range(37))  # every sample is served


def test_drop_last_truncates():
    ds = Lengths(37)
    per_rank = [list(s) for s in samplers(ds, 5, shuffle=True, drop_last=True)]
    assert all(len(p) == 7 for p in per_rank)  # ceil((37 - 5) / 5)
    assert len({i for p in per_rank for i in p}) == 35  # no padding, no repeats


def test_set_epoch_reshuffles_deterministically():
    ds = Lengths(60)
    a, b = samplers(ds, 3, shuffle=True, seed=3)[0], samplers(ds, 3, shuffle=True, seed=3)[0]
    epochs = []
    for e in range(3):
        a.set_epoch(e)
        b.set_epoch(e)
        assert list(a) == list(b)
        epochs.append(list(a))
    assert epochs[0] != epochs[1] != epochs[2]
    a.set_epoch(0)
    assert list(a) == epochs[0]
    other_seed = samplers(ds, 3, shuffle=True, seed=4)[0]
    assert list(other_seed) != epochs[0]
    # within an epoch the ranks' lists are disjoint chunks of one permutation
    ranks = samplers(ds, 3, shuffle=True, seed=3)
    for s in ranks:
        s.set_epoch(2)
    assert len({i for s in ranks for i in s}) == 60


def test_random_level_adds_bounded_noise():
    ds = Lengths(200)
    plain = samplers(ds, 1, shuffle=True, random_level=0)[0]
    noisy = samplers(ds, 1, shuffle=True, random_level=0.5)[0]
    assert noisy.random_number == int((max(ds.lengths) - min(ds.lengths)) * 0.5 + 1)
    assert plain.random_number == 1
    order = noisy._sorted_order(torch.Generator().manual_seed(0))
    assert order != plain._sorted_order(torch.Generator().manual_seed(0))
    assert sorted(order) == list(range(200))
    # noise is below random_number: a sample never overtakes one more complex by that much
    lens = [ds.lengths[i] for i in order]
    assert all(lens[j] - lens[k] < noisy.random_number for j in range(200) for k in range(j + 1, 200))


def test_batch_sampler_growing_batches():
    """The original's test: batch sizes 1, 2, 3, 4, 5 from 15 samples on one replica."""
    ds = Lengths(15)
    s = LoadBalancingDistributedSampler(ds, len, num_replicas=1, rank=0, shuffle=False)

    def batch_fn(indices):
        batches, k, size = [], 0, 1
        while k < len(indices):
            batches.append(indices[k : k + size])
            k += size
            size += 1
        return batches

    bs = LoadBalancingDistributedBatchSampler(s, batch_fn)
    assert [len(b) for b in bs] == [1, 2, 3, 4, 5]
    loader = torch.utils.data.DataLoader(ds, batch_sampler=bs, collate_fn=lambda b: b)
    assert sum(len(b) for b in loader) == 15


def test_batch_sampler_pads_and_truncates_to_the_same_count():
    ds = Lengths(30)

    def uneven(indices):  # batch count depends on the content: differs per rank
        batches, cur = [], []
        for i in indices:
            cur.append(i)
            if sum(ds.lengths[j] for j in cur) > 60:
                batches.append(cur)
                cur = []
        return batches + ([cur] if cur else [])

    for drop_last in (False, True):
        per_rank = [
            LoadBalancingDistributedBatchSampler(s, uneven, drop_last=drop_last) for s in samplers(ds, 3, shuffle=True)
        ]
        raw = [len(uneven(list(s.sampler))) for s in per_rank]
        expect = min(raw) if drop_last else max(raw)
        assert all(len(b) == expect and len(list(b)) == expect for b in per_rank)
        for b in per_rank:  # padding repeats the rank's own first batches
            own = uneven(list(b.sampler))
            assert list(b) == [own[i % len(own)] for i in range(expect)]
        first = list(per_rank[0])
        per_rank[0].set_epoch(5)
        assert list(per_rank[0]) != first


def test_complexity_as_a_tensor_or_numpy_scalar():
    """0-d tensors and numpy scalars count as numbers, with the same order as
    the plain ints (the original accepts them: it only sorts and subtracts)."""
    ds = Lengths(10)
    plain = LoadBalancingDistributedSampler(ds, len, num_replicas=2, rank=1, seed=3)
    for fn in (
        lambda s: torch.tensor(len(s)),
        lambda s: np.int64(len(s)),
        lambda s: np.float32(len(s)),
        lambda s: np.array(len(s)),
    ):
        other = LoadBalancingDistributedSampler(ds, fn, num_replicas=2, rank=1, seed=3)
        assert other.complexities == plain.complexities
        assert all(type(c) in (int, float) for c in other.complexities)
        assert list(other) == list(plain)


def test_bad_input():
    ds = Lengths(10)
    with pytest.raises(ValueError, match="Invalid rank"):
        LoadBalancingDistributedSampler(ds, len, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="random level"):
        LoadBalancingDistributedSampler(ds, len, num_replicas=2, rank=0, random_level=1.5)

    def broken(sample):
        if len(sample) > 20:
            raise KeyError("no")
        return len(sample)

    with pytest.raises(ValueError, match="complexity_fn failed on sample"):
        LoadBalancingDistributedSampler(ds, broken, num_replicas=2, rank=0)
    for bad in ("long", True, float("nan"), torch.tensor([1, 2]), torch.tensor(True), np.array([3.0])):
        with pytest.raises(ValueError, match="must return a number"):
            LoadBalancingDistributedSampler(ds, lambda s, b=bad: b, num_replicas=2, rank=0)
    dropping = LoadBalancingDistributedSampler(ds, len, num_replicas=2, rank=0, drop_last=True)
    with pytest.raises(ValueError, match="drop_last of sampler"):
        LoadBalancingDistributedBatchSampler(dropping, lambda ix: [ix])
    with pytest.raises(ValueError, match="LoadBalancingDistributedSampler"):
        LoadBalancingDistributedBatchSampler(torch.utils.data.SequentialSampler(ds), lambda ix: [ix])
