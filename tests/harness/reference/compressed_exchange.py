"""The compressed exchanges, built from the numpy codecs of
tests/harness/reference/minmax_uint8.py and lowbit.py: shares no code with the engine.

* :func:`scatter_reduce_gather` simulates every rank of ByteGrad's exchange
  (also LocalSteps' compressed pseudo-gradient, in any dense codec) in one
  process, with the optional error feedback; :func:`allgather_reduce` the
  top-k codecs' exchange;
* :func:`allgather_compressed` and :func:`scatter_reduce_gather_mean` run the
  exchanges of QAdam and low-precision decentralized across processes with
  torch.distributed all_gather (gloo); ``dist`` is an initialised
  ``torch.distributed``; arrays are flat float32 numpy arrays.
"""

import numpy as np

from tests.harness.reference import lowbit as lb, minmax_uint8 as mm


class _Codec:
    """A codec of the reference by name; ``k``: the top-k codecs' elements kept per block."""

    def __init__(self, name, k=0):
        self.name, self.k = name, k

    def record_nbytes(self, chunk_len):
        if self.name == "minmax_uint8":
            return mm.record_nbytes(chunk_len)
        return lb.record_nbytes(self.name, chunk_len, self.k)

    def compress(self, x, n_chunks):
        return mm.compress(x, n_chunks) if self.name == "minmax_uint8" else lb.compress(self.name, x, n_chunks, self.k)

    def decompress(self, c, n, n_chunks, dtype):
        if self.name == "minmax_uint8":
            return mm.decompress(c, n, n_chunks, dtype)
        return lb.decompress(self.name, c, n, n_chunks, dtype, self.k)

    def reduce_chunks(self, c, chunk_len, n_records, dtype, average):
        if self.name == "minmax_uint8":
            return mm.reduce_chunks(c, chunk_len, n_records, dtype, average)
        return lb.reduce_chunks(self.name, c, chunk_len, n_records, dtype, average, self.k)


def scatter_reduce_gather(xs, average, dtype=np.float32, errors=None, codec="minmax_uint8", k=0):
    """The exchange of every rank's flat bucket ``xs`` (padded: their size a
    multiple of ``len(xs)``), as the engine runs it on one rank per entry:
    each rank compresses its bucket in one chunk per rank; rank r reduces the
    records of chunk r (float32; divided by the rank count when
    ``average``), compresses the result again and every rank decodes every
    chunk. With ``errors`` (each rank's residual, of ``dtype``; the codes come
    from float32 values) each rank first adds its residual and keeps
    ``x - decompress(compress(x))`` of its own first quantisation.
    Returns (the result, equal on every rank; the new residuals or None)."""
    c = _Codec(codec, k)
    n, numel = len(xs), xs[0].size
    chunk = numel // n
    rb = c.record_nbytes(chunk)
    if errors is not None:
        xs = [x + e for x, e in zip(xs, errors)]
    sent = [c.compress(x, n) for x in xs]
    residuals = None if errors is None else [x - c.decompress(s, numel, n, dtype) for x, s in zip(xs, sent)]
    out = []
    for r in range(n):
        received = np.concatenate([s[r * rb : (r + 1) * rb] for s in sent])
        mine = c.reduce_chunks(received, chunk, n, dtype, average)
        out.append(c.decompress(c.compress(mine, 1), chunk, 1, dtype))
    return np.concatenate(out), residuals


def allgather_reduce(xs, average, dtype=np.float32, errors=None, codec="topk_uint4", k=0):
    """The top-k codecs' exchange of every rank's flat bucket ``xs``: each
    rank compresses its whole bucket (plus its residual) as one record, every
    rank decodes every record and sums them in rank order (float32). Returns
    (the result, equal on every rank; the new residuals or None)."""
    c = _Codec(codec, k)
    n, numel = len(xs), xs[0].size
    if errors is not None:
        xs = [x + e for x, e in zip(xs, errors)]
    sent = [c.compress(x, 1) for x in xs]
    residuals = None if errors is None else [x - c.decompress(s, numel, 1, dtype) for x, s in zip(xs, sent)]
    return c.reduce_chunks(np.concatenate(sent), numel, n, dtype, average), residuals


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
