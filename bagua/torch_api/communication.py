"""``bagua.torch_api.communication``: :mod:`bagua_torch.communication` under
Bagua 0.9.2's names. ``init_process_group`` also initialises torch's default
process group (as the original did); ``get_backend(name)`` is the engine of
the default group kept under that name. Groups have the original's
``get_global_communicator()``, ``get_inter_node_communicator()`` and
``get_intra_node_communicator()`` (see :mod:`bagua_core.group_communicator`);
what they return is accepted as ``comm=`` by every primitive, as is the group
itself."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Optional

from bagua_core import PRIMITIVES
from bagua_core.group_communicator import GroupCommunicator
from bagua_core.process_group import ProcessGroup, group_named

# "name as name": an explicit re-export, which type checkers see without
# reading __all__ (they cannot expand the names it takes from PRIMITIVES).
from bagua_torch.communication import (
    ReduceOp as ReduceOp,
    allgather as allgather,
    allgather_inplace as allgather_inplace,
    allreduce as allreduce,
    allreduce_coalesced_inplace as allreduce_coalesced_inplace,
    allreduce_inplace as allreduce_inplace,
    alltoall as alltoall,
    alltoall_inplace as alltoall_inplace,
    alltoall_v as alltoall_v,
    alltoall_v_inplace as alltoall_v_inplace,
    barrier as barrier,
    broadcast as broadcast,
    broadcast_coalesced as broadcast_coalesced,
    broadcast_object as broadcast_object,
    from_torch_group as from_torch_group,
    gather as gather,
    gather_inplace as gather_inplace,
    get_default_group,
    init_process_group as _init_process_group,
    is_initialized as is_initialized,
    new_group as new_group,
    recv as recv,
    reduce as reduce,
    reduce_inplace as reduce_inplace,
    reduce_scatter as reduce_scatter,
    reduce_scatter_inplace as reduce_scatter_inplace,
    scatter as scatter,
    scatter_inplace as scatter_inplace,
    send as send,
)

if TYPE_CHECKING:
    import torch

    from bagua_core.engine import Engine

BaguaProcessGroup = ProcessGroup  # the original's name for the groups new_group returns


def init_process_group(
    store: Optional[torch.distributed.Store] = None, rank: int = -1, world_size: int = -1, local_world_size: int = -1
) -> ProcessGroup:
    """Bagua 0.9.2's ``init_process_group``: joins the job and initialises
    torch's default process group too, unless the caller made one first
    (see :func:`bagua_torch.init_process_group`)."""
    return _init_process_group(store, rank, world_size, local_world_size, torch_distributed=True)


def _get_default_group() -> ProcessGroup:
    """The world group (Bagua 0.9.2's private name, which user code calls)."""
    return get_default_group()


_COMMUNICATOR_GETTERS = {
    "global": "get_global_communicator",
    "inter": "get_inter_node_communicator",
    "intra": "get_intra_node_communicator",
}


def get_communicator(group_name: str, comm_name: str) -> GroupCommunicator:
    """The ``comm_name`` ("global", "inter" or "intra") communicator of the
    group called ``group_name`` (its ``.name``)."""
    getter = _COMMUNICATOR_GETTERS.get(comm_name)
    if getter is None:
        raise ValueError(f"comm_name should be one of {list(_COMMUNICATOR_GETTERS)}, got {comm_name!r}")
    return getattr(group_named(group_name), getter)()


def _rank_not_in_comm(comm: Optional[GroupCommunicator] = None) -> bool:
    """True when this process is not a member of ``comm`` (None: the world)."""
    return comm is not None and not comm.is_member


def _rank_not_in_group(group: Optional[ProcessGroup] = None) -> bool:
    """True when this process is not a member of ``group`` (None: the world)."""
    return group is not None and not group.is_member


@functools.lru_cache(maxsize=None)
def get_backend(model_name: str) -> Engine:
    """The communication engine kept under ``model_name`` (a
    :class:`bagua_core.engine.Engine` over a clone of the default group,
    built on first use: every rank asks for the same names in the same order)."""
    from bagua_core.engine import Engine

    return Engine.for_group(get_default_group())


__all__ = [
    "ReduceOp",
    "init_process_group",
    "is_initialized",
    "new_group",
    "from_torch_group",
    "get_backend",
    *PRIMITIVES,
    "broadcast_coalesced",
    "allreduce_coalesced_inplace",
    "get_communicator",
    "BaguaProcessGroup",
]
