"""Per-bucket state saved under another bucket size, laid out for this one.

A step whose state is data-shaped (``StateLayout.data_shaped``: each span
holds the bucket's tensors back to back, padding after them; ByteGrad's
residual, LocalSteps' anchor, momentum and residual, the decentralized
replicas) keeps, per tensor, the same numbers whatever the buckets are. A
state saved under another ``BAGUA_BUCKET_SIZE`` holds them in other buckets:
:func:`saved_buckets` recovers which tensors each saved bucket held from the
saved sizes alone (the plan is :func:`bagua_core.engine.plan_buckets`': per
dtype, consecutive runs of the registration order), and :func:`moves` says
where each tensor's numbers go. A saved layout that fits no plan, or more
than one, is an error: the numbers are never guessed.
"""

from __future__ import annotations

import functools
from typing import Hashable, List, NamedTuple, Optional, Sequence, Tuple


class Move(NamedTuple):
    """``count`` numbers of each span: from saved bucket ``source`` at
    ``source_offset`` to ``target_offset`` in the new bucket."""

    source: int
    source_offset: int
    target_offset: int
    count: int


def _padded(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def saved_buckets(
    decls: Sequence[Tuple[Hashable, int, str]], saved: Sequence[Tuple[str, int]], alignment: int
) -> List[List[Hashable]]:
    """The tensors of each saved bucket, from ``decls`` (``(key, numel,
    dtype)`` in registration order, as :func:`~bagua_core.engine.plan_buckets`
    takes them) and ``saved`` (each saved bucket's dtype and padded size, in
    bucket order). Raises ValueError when no plan, or more than one, gives
    those sizes."""
    by_dtype: dict = {}
    for position, (_, numel, dtype) in enumerate(decls):
        by_dtype.setdefault(str(dtype), []).append((position, int(numel)))
    wanted: dict = {}
    for k, (dtype, padded) in enumerate(saved):
        wanted.setdefault(str(dtype), []).append((k, int(padded)))
    if set(wanted) != set(by_dtype):
        raise ValueError(f"the saved buckets are of dtypes {sorted(wanted)}, these tensors of {sorted(by_dtype)}")
    buckets: List[Optional[List[int]]] = [None] * len(saved)
    for dtype, stream in by_dtype.items():
        runs = _runs([n for _, n in stream], tuple(p for _, p in wanted[dtype]), alignment, dtype)
        for (k, _), (start, end) in zip(wanted[dtype], runs):
            buckets[k] = [position for position, _ in stream[start:end]]
    lasts = [b[-1] for b in buckets if b is not None]
    if lasts != sorted(lasts):
        raise ValueError("the saved buckets are not in the order a bucket plan gives them")
    return [[decls[p][0] for p in b] for b in buckets if b is not None]


def _runs(numels: List[int], padded: Tuple[int, ...], alignment: int, dtype: str) -> List[Tuple[int, int]]:
    """Splits ``numels`` into consecutive runs, one per ``padded`` size."""

    @functools.lru_cache(maxsize=None)
    def ways(k: int, start: int) -> int:  # how many splits of numels[start:] fit padded[k:] (capped at 2)
        if k == len(padded):
            return int(start == len(numels))
        total, found = 0, 0
        for end in range(start + 1, len(numels) + 1):
            total += numels[end - 1]
            if total > padded[k]:
                break
            if _padded(total, alignment) == padded[k]:
                found = min(2, found + ways(k + 1, end))
        return found

    count = ways(0, 0)
    if count != 1:
        why = "no" if count == 0 else "more than one"
        raise ValueError(
            f"{why} split of the {dtype} tensors into consecutive buckets has the saved sizes {list(padded)}"
        )
    runs, start = [], 0
    for k in range(len(padded)):
        total = 0
        for end in range(start + 1, len(numels) + 1):
            total += numels[end - 1]
            if _padded(total, alignment) == padded[k] and ways(k + 1, end):
                runs.append((start, end))
                start = end
                break
    ways.cache_clear()
    return runs


def moves(saved: Sequence[Sequence[Hashable]], new: Sequence[Sequence[Hashable]], numel_of: dict) -> List[List[Move]]:
    """Per new bucket, where its tensors' numbers come from in the saved
    buckets (both given as the keys of their tensors in bucket order)."""
    where = {}
    for k, keys in enumerate(saved):
        offset = 0
        for key in keys:
            where[key] = (k, offset)
            offset += int(numel_of[key])
    out = []
    for keys in new:
        offset, bucket = 0, []
        for key in keys:
            k, source_offset = where[key]
            bucket.append(Move(k, source_offset, offset, int(numel_of[key])))
            offset += int(numel_of[key])
        out.append(bucket)
    return out
