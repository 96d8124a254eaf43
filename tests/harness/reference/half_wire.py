"""HalfGrad's 16-bit exchange in numpy (and ml_dtypes for bfloat16): shares
no code with the engine."""

import numpy as np


def wire_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.float16


def scatter_reduce_gather(xs, average, wire="float16", dtype=np.float32):
    """The exchange of every rank's flat bucket ``xs`` (padded: their size a
    multiple of ``len(xs)``), simulated in one process: each rank rounds its
    bucket to ``wire`` (from float32); chunk r's records are summed in
    float32, record 0 first, divided by the rank count when ``average``,
    rounded to ``wire`` again; every rank decodes every chunk. Returns the
    result (equal on every rank) in ``dtype``."""
    w = wire_dtype(wire)
    n = len(xs)
    coded = [x.astype(np.float32).astype(w) for x in xs]
    acc = coded[0].astype(np.float32)
    for c in coded[1:]:
        acc = acc + c.astype(np.float32)
    if average:
        acc = acc / np.float32(n)
    return acc.astype(w).astype(np.float32).astype(dtype)
