"""The MinMaxUInt8 compressed exchanges, built from
tests/harness/reference/minmax_uint8.py (numpy): shares no code with the engine.

* :func:`scatter_reduce_gather` simulates every rank of ByteGrad's exchange
  (also LocalSteps' compressed pseudo-gradient) in one process, with the
  optional error feedback;
* :func:`allgather_compressed` and :func:`scatter_reduce_gather_mean` run the
  exchanges of QAdam and low-precision decentralized across processes with
  torch.distributed all_gather (gloo); ``dist`` is an initialised
  ``torch.distributed``; arrays are flat float32 numpy arrays.
"""

import numpy as np

from tests.harness.reference import minmax_uint8 as mm


def scatter_reduce_gather(xs, average, dtype=np.float32, errors=None):
    """The exchange of every rank's flat bucket ``xs`` (padded: their size a
    multiple of ``len(xs)``), as the engine runs it on one rank per entry:
    each rank compresses its bucket in one chunk per rank; rank r reduces the
    records of chunk r (float32; divided by the rank count when
    ``average``), compresses the result again and every rank decodes every
    chunk. With ``errors`` (each rank's residual, of ``dtype``; the codes come
    from float32 values) each rank first adds its residual and keeps
    ``x - decompress(compress(x))`` of its own first quantisation.
    Returns (the result, equal on every rank; the new residuals or None)."""
    n, numel = len(xs), xs[0].size
    chunk = numel // n
    rb = mm.record_nbytes(chunk)
    if errors is not None:
        xs = [x + e for x, e in zip(xs, errors)]
    sent = [mm.compress(x, n) for x in xs]
    residuals = None if errors is None else [x - mm.decompress(s, numel, n, dtype) for x, s in zip(xs, sent)]
    out = []
    for r in range(n):
        received = np.concatenate([s[r * rb : (r + 1) * rb] for s in sent])
        mine = mm.reduce_chunks(received, chunk, n, dtype, average)
        out.append(mm.decompress(mm.compress(mine, 1), chunk, 1, dtype))
    return np.concatenate(out), residuals


def allgather_compressed(dist, x, n_chunks):
    """Every rank's compressed ``x`` (``n_chunks`` records), as numpy uint8
    arrays in rank order."""
    import torch

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
    received = np.concatenate([e[r * rb : (r + 1) * rb] for e in allgather_compressed(dist, flat, n)])
    reduced = mm.reduce_chunks(received, chunk, n, np.float32, average=True)
    return mm.decompress(np.concatenate(allgather_compressed(dist, reduced, 1)), flat.size, n, np.float32)
