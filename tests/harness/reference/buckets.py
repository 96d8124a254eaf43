"""The frontends' bucket layout for leaves of ``shapes`` (registration order),
as both bagua_torch and bagua_jax lay it out: ``bucket_bytes`` buckets
(bagua_core.engine.plan_buckets) taking the leaves in reverse order, each
padded with zeros to a multiple of the step's ``alignment``; and the moves
between leaves and padded flat buckets."""

import numpy as np


def padded_buckets(shapes, dtype, bucket_bytes, alignment):
    """[(leaf indices, padded element count)] per bucket, in launch order."""
    from bagua_core.engine import plan_buckets

    decls = [(str(i), int(np.prod(s)), np.dtype(dtype).name) for i, s in reversed(list(enumerate(shapes)))]
    out = []
    for names in plan_buckets(decls, bucket_bytes):
        leaves = [int(n) for n in names]
        numel = sum(int(np.prod(shapes[i])) for i in leaves)
        out.append((leaves, -(-numel // alignment) * alignment))
    return out


def flatten(leaves, bucket):
    """The padded flat bucket ``bucket`` (leaf indices, padded count) of the arrays ``leaves``."""
    indices, padded = bucket
    flat = np.concatenate([leaves[i].reshape(-1) for i in indices])
    return np.concatenate([flat, np.zeros(padded - flat.size, flat.dtype)])


def payload(bucket, shapes):
    """The element count of ``bucket`` without its padding."""
    return sum(int(np.prod(shapes[i])) for i in bucket[0])


def unflatten(flat, bucket, shapes, leaves):
    """Writes the flat bucket's payload back into the list ``leaves``."""
    off = 0
    for i in bucket[0]:
        size = int(np.prod(shapes[i]))
        leaves[i] = flat[off : off + size].reshape(shapes[i])
        off += size
