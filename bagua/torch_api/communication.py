"""``bagua.torch_api.communication``: :mod:`bagua_torch.communication` under
Bagua 0.9.2's names. ``init_process_group`` also initialises torch's default
process group (as the original did); ``get_backend(name)`` is the engine of
the default group kept under that name."""

from __future__ import annotations

import functools

from bagua_torch.communication import (  # noqa: F401  (re-exported)
    ReduceOp,
    allgather,
    allgather_inplace,
    allreduce,
    allreduce_inplace,
    alltoall,
    alltoall_inplace,
    alltoall_v,
    alltoall_v_inplace,
    barrier,
    broadcast,
    broadcast_object,
    from_torch_group,
    gather,
    gather_inplace,
    get_default_group,
    is_initialized,
    new_group,
    recv,
    reduce,
    reduce_inplace,
    reduce_scatter,
    reduce_scatter_inplace,
    scatter,
    scatter_inplace,
    send,
)
from bagua_torch.communication import init_process_group as _init_process_group


def init_process_group(store=None, rank: int = -1, world_size: int = -1, local_world_size: int = -1):
    """Bagua 0.9.2's ``init_process_group``: joins the job and initialises
    torch's default process group too, unless the caller made one first
    (see :func:`bagua_torch.init_process_group`)."""
    return _init_process_group(store, rank, world_size, local_world_size, torch_distributed=True)


@functools.lru_cache(maxsize=None)
def get_backend(model_name: str):
    """The communication engine kept under ``model_name`` (a
    :class:`bagua_core.engine.Engine` over a clone of the default group,
    built on first use: every rank asks for the same names in the same order)."""
    from bagua_core.engine import Engine

    return Engine.for_group(get_default_group())


__all__ = [
    "ReduceOp", "init_process_group", "is_initialized", "new_group", "from_torch_group", "get_backend",
    "send", "recv", "broadcast", "broadcast_object", "reduce", "reduce_inplace", "allreduce",
    "allreduce_inplace", "allgather", "allgather_inplace", "gather", "gather_inplace", "scatter",
    "scatter_inplace", "reduce_scatter", "reduce_scatter_inplace", "alltoall", "alltoall_inplace",
    "alltoall_v", "alltoall_v_inplace", "barrier",
]
