"""Checking that every rank of a group holds the same thing (a model's tensor
names, shapes and dtypes; a pytree's structure) before anything is exchanged,
so a mismatch is a clear error on every rank rather than a hang or a wrong
pairing of collectives. Framework-neutral: a signature is a list of tuples.
The exchange runs on the group's host control communicator
(``group.control_group``: Gloo, also for NCCL groups)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from bagua_core import comm as core_comm
from bagua_core.process_group import ProcessGroup


def check_same_everywhere(signature: Sequence[tuple], group: ProcessGroup, what: str) -> None:
    """Raises ValueError on every rank unless ``signature`` (a list of
    comparable tuples, e.g. (kind, name, shape, dtype)) is equal on every rank;
    the message names the first rank that differs from rank 0 and its first
    difference."""
    if group.size == 1:
        return
    group = group.control_group  # host metadata: the Gloo control communicator, also on NCCL groups
    signature = [tuple(s) for s in signature]
    reference = core_comm.broadcast_object(signature if group.rank == 0 else None, 0, group)
    mine = "" if group.rank == 0 else first_difference(reference, signature, f"rank {group.rank}")
    flags = np.zeros(group.size, dtype=np.int64)
    core_comm.allgather(np.array([1 if mine else 0], dtype=np.int64), flags, group)
    bad = [r for r in range(group.size) if flags[r]]
    if not bad:
        return
    message = core_comm.broadcast_object(mine, bad[0], group)
    others = f" (ranks differing from rank 0: {bad})" if len(bad) > 1 else ""
    raise ValueError(f"{what} differs across ranks: {message}{others}")


def _describe(entry: Optional[tuple]) -> str:
    if entry is None:
        return "nothing"
    kind, name, *rest = entry
    return f"{kind} '{name}' " + " ".join(str(x) for x in rest)


def first_difference(reference: Sequence[tuple], mine: Sequence[tuple], me: str = "this rank") -> str:
    """'' when equal, else a description of the first difference."""
    for i in range(max(len(reference), len(mine))):
        a = reference[i] if i < len(reference) else None
        b = mine[i] if i < len(mine) else None
        if a != b:
            return f"rank 0 has {_describe(a)}, {me} has {_describe(b)} (entry {i})"
    return ""
