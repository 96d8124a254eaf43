"""Bagua's communication primitives on torch tensors.

Thin wrappers over :mod:`bagua_core.comm` (which takes any DLPack array), with
the original Bagua's names and argument order. ``comm`` is the
:class:`~bagua_core.ProcessGroup` to use (default: the world group; ``group=``
is accepted too). Tensors must be contiguous CPU tensors (CUDA tensors on a
NCCL group); tensors that require grad are used through ``.detach()`` (same
memory). Out-of-place operations write into ``recv_tensor`` and return it;
with ``recv_tensor=None`` they return a new tensor holding the result
(:func:`reduce` and :func:`gather` return None then on ranks other than
``dst``; on a group this process is not a member of every call returns at
once, out-of-place ones returning ``recv_tensor``).
Ranks (``src``, ``dst``) are ranks within the group. Every call blocks until
done; a dead or stuck peer raises (``PeerError`` / ``CommTimeoutError``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

import bagua_core
from bagua_core import PRIMITIVES, comm as _core
from bagua_core.comm import Group, Op, ReduceOp
from bagua_core.process_group import ProcessGroup
from bagua_torch import _torch_group

__all__ = [
    "ReduceOp",
    "init_process_group",
    "is_initialized",
    "new_group",
    "from_torch_group",
    "get_default_group",
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_local_size",
    "get_node_rank",
    *PRIMITIVES,
    "broadcast_coalesced",
    "allreduce_coalesced_inplace",
]


def init_process_group(
    store: Optional[torch.distributed.Store] = None,
    rank: int = -1,
    world_size: int = -1,
    local_world_size: int = -1,
    *,
    torch_distributed: bool = False,
) -> ProcessGroup:
    """Joins the job described by the environment (torchrun's contract, as set
    by ``bagua-run``) and returns the world group. Safe to call twice.

    The arguments are Bagua 0.9's: ``rank``, ``world_size`` and
    ``local_world_size`` (all three, or none) replace the environment's
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (written to
    ``os.environ``, as the original did). ``store`` (a ``torch.distributed``
    store) tells where to meet when ``MASTER_ADDR`` is unset: a ``TCPStore``'s
    host and port become ``MASTER_ADDR``/``MASTER_PORT``; with any other
    store, rank 0 publishes its address and a free port in it.

    ``torch_distributed=True`` (what ``bagua.torch_api`` passes) also
    initialises torch's default process group when nobody has (gloo, plus
    nccl for CUDA tensors when CUDA is available) on ``MASTER_PORT`` (or on
    ``store``), so ``torch.distributed.barrier()`` and ``DistributedSampler``
    work; a default group the caller made first is used as it is.
    """
    _torch_group.apply_layout(store, rank, world_size, local_world_size)
    group = bagua_core.init_process_group()
    if torch_distributed:
        _torch_group.init_torch_default_group(store, group)
    return group


is_initialized = bagua_core.is_initialized
new_group = bagua_core.new_group
get_default_group = bagua_core.get_default_group
from_torch_group = _torch_group.from_torch_group
get_rank = bagua_core.get_rank
get_world_size = bagua_core.get_world_size
get_local_rank = bagua_core.get_local_rank
get_local_size = bagua_core.get_local_world_size
get_node_rank = bagua_core.get_node_rank


def _g(comm: Optional[Group], group: Optional[Group]) -> Optional[Group]:
    if comm is not None and group is not None and comm is not group:
        raise TypeError("pass the process group as comm= or group=, not both")
    return comm if comm is not None else group


def _t(x):
    """The tensor as bagua_core sees it: detached (DLPack refuses tensors that
    require grad), same memory."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    return x


def _out(result: Any, recv_tensor: Optional[torch.Tensor]) -> Any:
    """``recv_tensor`` when given, else the new core Buffer as a torch tensor
    (None where the core call returned None: not the root, not a member)."""
    if recv_tensor is not None or result is None:
        return recv_tensor
    return torch.from_dlpack(result)


def send(tensor: torch.Tensor, dst: int, comm: Optional[Group] = None, *, group: Optional[Group] = None) -> None:
    """Sends ``tensor`` to rank ``dst``, which calls :func:`recv`; blocks until sent."""
    _core.send(_t(tensor), dst, _g(comm, group))


def recv(tensor: torch.Tensor, src: int, comm: Optional[Group] = None, *, group: Optional[Group] = None) -> None:
    """Receives into ``tensor`` what rank ``src`` passes to :func:`send`."""
    _core.recv(_t(tensor), src, _g(comm, group))


def broadcast(
    tensor: torch.Tensor, src: int = 0, comm: Optional[Group] = None, *, group: Optional[Group] = None
) -> None:
    """Overwrites ``tensor`` on every rank with rank ``src``'s.

    Example:
        >>> t = torch.arange(4.0) if bagua_torch.get_rank() == 0 else torch.zeros(4)
        >>> bagua_torch.broadcast(t, src=0)
        >>> t
        tensor([0., 1., 2., 3.])
    """
    _core.broadcast(_t(tensor), src, _g(comm, group))


def broadcast_object(obj: Any, src: int = 0, comm: Optional[Group] = None, *, group: Optional[Group] = None) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank."""
    return _core.broadcast_object(obj, src, _g(comm, group))


def reduce(
    send_tensor: torch.Tensor,
    recv_tensor: Optional[torch.Tensor] = None,
    dst: int = 0,
    op: Op = ReduceOp.SUM,
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> Optional[torch.Tensor]:
    """Reduces ``send_tensor`` of every rank with ``op`` into ``recv_tensor`` on
    rank ``dst`` (returned; a new tensor when ``recv_tensor`` is None).
    """
    out = _core.reduce(_t(send_tensor), _t(recv_tensor), dst, op, _g(comm, group))
    return _out(out, recv_tensor)


def reduce_inplace(
    tensor: torch.Tensor,
    dst: int = 0,
    op: Op = ReduceOp.SUM,
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> None:
    """Reduces ``tensor`` of every rank with ``op`` into ``tensor`` on rank ``dst``."""
    _core.reduce_inplace(_t(tensor), dst, op, _g(comm, group))


def allreduce(
    send_tensor: torch.Tensor,
    recv_tensor: Optional[torch.Tensor] = None,
    op: Op = ReduceOp.SUM,
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> torch.Tensor:
    """Reduces ``send_tensor`` of every rank with ``op`` into ``recv_tensor`` on
    every rank (returned; a new tensor when ``recv_tensor`` is None).

    Example:
        >>> x = torch.ones(3)
        >>> bagua_torch.allreduce(x)  # a world of one process
        tensor([1., 1., 1.])
    """
    out = _core.allreduce(_t(send_tensor), _t(recv_tensor), op, _g(comm, group))
    return _out(out, recv_tensor)


def allreduce_inplace(
    tensor: torch.Tensor, op: Op = ReduceOp.SUM, comm: Optional[Group] = None, *, group: Optional[Group] = None
) -> None:
    """Reduces ``tensor`` of every rank with ``op`` into ``tensor`` on every rank."""
    _core.allreduce_inplace(_t(tensor), op, _g(comm, group))


def allgather(
    send_tensor: torch.Tensor,
    recv_tensor: Optional[torch.Tensor] = None,
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> torch.Tensor:
    """Every rank's ``send_tensor`` in rank order (new tensor: shape ``(size, *send.shape)``)."""
    out = _core.allgather(_t(send_tensor), _t(recv_tensor), _g(comm, group))
    return _out(out, recv_tensor)


def allgather_inplace(tensor: torch.Tensor, comm: Optional[Group] = None, *, group: Optional[Group] = None) -> None:
    """Gathers chunk ``i`` of ``tensor`` from rank ``i`` into every rank's
    ``tensor`` (each rank's own chunk is its input).
    """
    _core.allgather_inplace(_t(tensor), _g(comm, group))


def gather(
    send_tensor: torch.Tensor,
    recv_tensor: Optional[torch.Tensor] = None,
    dst: int = 0,
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> Optional[torch.Tensor]:
    """Every rank's ``send_tensor`` in rank order, in ``recv_tensor`` on rank
    ``dst`` (returned; a new tensor when ``recv_tensor`` is None).
    """
    out = _core.gather(_t(send_tensor), _t(recv_tensor), dst, _g(comm, group))
    return _out(out, recv_tensor)


def gather_inplace(
    tensor: torch.Tensor, count: int, dst: int = 0, comm: Optional[Group] = None, *, group: Optional[Group] = None
) -> None:
    """On ``dst``, ``tensor`` holds ``size * count`` elements and its own
    contribution at chunk ``dst``; elsewhere it holds the ``count`` elements sent.
    """
    _core.gather_inplace(_t(tensor), count, dst, _g(comm, group))


def scatter(
    send_tensor: Optional[torch.Tensor],
    recv_tensor: torch.Tensor,
    src: int = 0,
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> torch.Tensor:
    """``recv_tensor`` is required (non-src ranks could not know its shape);
    ``send_tensor`` is only read on ``src``."""
    _core.scatter(_t(send_tensor), _t(recv_tensor), src, _g(comm, group))
    return recv_tensor


def scatter_inplace(
    tensor: torch.Tensor, count: int, src: int = 0, comm: Optional[Group] = None, *, group: Optional[Group] = None
) -> None:
    """On ``src``, ``tensor`` holds ``size * count`` elements (chunk ``src``
    stays); elsewhere it receives its ``count`` elements.
    """
    _core.scatter_inplace(_t(tensor), count, src, _g(comm, group))


def reduce_scatter(
    send_tensor: torch.Tensor,
    recv_tensor: Optional[torch.Tensor] = None,
    op: Op = ReduceOp.SUM,
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> torch.Tensor:
    """Reduces ``send_tensor`` of every rank with ``op``; rank ``i`` gets chunk
    ``i`` of the result in ``recv_tensor`` (returned; new when None).
    """
    out = _core.reduce_scatter(_t(send_tensor), _t(recv_tensor), op, _g(comm, group))
    return _out(out, recv_tensor)


def reduce_scatter_inplace(
    tensor: torch.Tensor, op: Op = ReduceOp.SUM, comm: Optional[Group] = None, *, group: Optional[Group] = None
) -> None:
    """As :func:`reduce_scatter`; the result for this rank is written over
    chunk ``rank`` of ``tensor``.
    """
    _core.reduce_scatter_inplace(_t(tensor), op, _g(comm, group))


def alltoall(
    send_tensor: torch.Tensor,
    recv_tensor: Optional[torch.Tensor] = None,
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> torch.Tensor:
    """Chunk ``j`` of ``send_tensor`` goes to rank ``j``, which stores it as chunk
    ``i`` (the sender's rank) of ``recv_tensor`` (returned; new when None).
    """
    out = _core.alltoall(_t(send_tensor), _t(recv_tensor), _g(comm, group))
    return _out(out, recv_tensor)


def alltoall_inplace(tensor: torch.Tensor, comm: Optional[Group] = None, *, group: Optional[Group] = None) -> None:
    """As :func:`alltoall`, with ``tensor`` both sent and received."""
    _core.alltoall_inplace(_t(tensor), _g(comm, group))


def alltoall_v(
    send_tensor: torch.Tensor,
    send_counts: Sequence[int],
    send_displs: Sequence[int],
    recv_tensor: Optional[torch.Tensor],
    recv_counts: Sequence[int],
    recv_displs: Sequence[int],
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> torch.Tensor:
    """As :func:`alltoall` with chunks of different sizes: rank ``j`` receives
    ``send_counts[j]`` elements from ``send_displs[j]`` of ``send_tensor``,
    written at ``recv_displs[i]`` of its ``recv_tensor``.
    """
    out = _core.alltoall_v(
        _t(send_tensor), send_counts, send_displs, _t(recv_tensor), recv_counts, recv_displs, _g(comm, group)
    )
    return _out(out, recv_tensor)


def alltoall_v_inplace(
    tensor: torch.Tensor,
    counts: Sequence[int],
    displs: Sequence[int],
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> None:
    """:func:`alltoall_v` on one tensor, with the same counts and
    displacements on both sides.
    """
    _core.alltoall_v_inplace(_t(tensor), counts, displs, _g(comm, group))


def barrier(comm: Optional[Group] = None, *, group: Optional[Group] = None) -> None:
    """Returns once every rank of the group has called it."""
    _core.barrier(_g(comm, group))


def _coalesced(fn: str, tensors: Sequence[torch.Tensor], call: Callable[[torch.Tensor], None]) -> None:
    """``call(flat)`` on the tensors flattened, one flat tensor per dtype (in
    order of first appearance), then the results copied back."""
    if isinstance(tensors, torch.Tensor) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError(f"{fn}: expected a list of tensors, got {type(tensors).__name__}")
    by_kind: dict = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    for same in by_kind.values():
        flat = torch.cat([t.detach().reshape(-1) for t in same])
        call(flat)
        offset = 0
        with torch.no_grad():
            for t in same:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def broadcast_coalesced(
    tensors: Sequence[torch.Tensor], src: int = 0, comm: Optional[Group] = None, *, group: Optional[Group] = None
) -> None:
    """Rank ``src``'s ``tensors`` on every rank, in one broadcast per dtype."""
    g = _g(comm, group)
    _coalesced("broadcast_coalesced", tensors, lambda flat: _core.broadcast(flat, src, g))


def allreduce_coalesced_inplace(
    tensors: Sequence[torch.Tensor],
    op: Op = ReduceOp.SUM,
    comm: Optional[Group] = None,
    *,
    group: Optional[Group] = None,
) -> None:
    """:func:`allreduce_inplace` of every tensor, in one allreduce per dtype."""
    g = _g(comm, group)
    _coalesced("allreduce_coalesced_inplace", tensors, lambda flat: _core.allreduce_inplace(flat, op, g))
