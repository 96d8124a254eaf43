"""The MinMaxUInt8 exchanges of QAdam and low-precision decentralized, built
from tests/reference/minmax_uint8.py (numpy) and torch.distributed all_gather
(gloo): shares no code with the engine. ``dist`` is an initialised
``torch.distributed``; arrays are flat float32 numpy arrays."""

import numpy as np
import torch

from tests.reference import minmax_uint8 as mm


def allgather_compressed(dist, x, n_chunks):
    """Every rank's compressed ``x`` (``n_chunks`` records), as numpy uint8
    arrays in rank order."""
    mine = torch.from_numpy(mm.compress(x, n_chunks))
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [e.numpy() for e in every]


def scatter_reduce_gather_mean(dist, flat):
    """The compressed scatter-reduce-gather mean of ``flat`` (its size a
    multiple of the group size): chunk r of every rank's compressed copy goes
    to rank r, which averages the decoded chunks, compresses the result and
    gathers every rank's chunk back."""
    n, r = dist.get_world_size(), dist.get_rank()
    chunk = flat.size // n
    rb = mm.record_nbytes(chunk)
    received = np.concatenate([e[r * rb:(r + 1) * rb] for e in allgather_compressed(dist, flat, n)])
    reduced = mm.reduce_chunks(received, chunk, n, np.float32, average=True)
    return mm.decompress(np.concatenate(allgather_compressed(dist, reduced, 1)), flat.size, n, np.float32)
