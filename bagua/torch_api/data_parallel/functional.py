"""``bagua.torch_api.data_parallel.functional``: Bagua 0.9.2's differentiable
allreduce.

``all_reduce(tensor, op, group)`` returns ``tensor`` reduced over the ranks of
``group`` (a ``torch.distributed`` group, default the world) and is part of
the autograd graph: its backward reduces the incoming gradient over the same
ranks with the same op. For SUM that is the gradient (every rank's output
depends on every rank's input). As in the original, only SUM and MAX are
accepted, and MAX's backward max-reduces the gradients (the original's
behaviour, not the gradient of a maximum).

The first call on a torch sub-group makes the Bagua group of its ranks, and
making a group is a meeting of the whole job: every rank makes that first
call (a non-member gets a copy of its tensor back), in the same order.
"""

from __future__ import annotations

import threading
from typing import Optional, Union

import torch
import torch.distributed as dist

from bagua_torch.communication import ReduceOp, allreduce_inplace, from_torch_group

__all__ = ["ReduceOp", "all_reduce", "torch_reduce_op_to_bagua"]

_lock = threading.Lock()
_groups: dict = {}  # id(torch group) -> (torch group, Bagua group of its ranks)


def torch_reduce_op_to_bagua(op: Union[dist.ReduceOp, dist.ReduceOp.RedOpType]) -> ReduceOp:
    """``torch.distributed.ReduceOp.SUM`` / ``MAX`` as Bagua's ReduceOp;
    ValueError for the others (the original accepts these two only)."""
    if op == dist.ReduceOp.SUM:
        return ReduceOp.SUM
    if op == dist.ReduceOp.MAX:
        return ReduceOp.MAX
    raise ValueError(f"all_reduce supports torch.distributed.ReduceOp.SUM and MAX, got {op!r}")


def _bagua_group(group):
    """The Bagua group of ``group``'s ranks, made once per torch group (making
    it is collective: every rank reaches the first call in the same order)."""
    with _lock:
        hit = _groups.get(id(group))
        if hit is None or hit[0] is not group:
            hit = (group, from_torch_group(group))
            _groups[id(group)] = hit
        return hit[1]


def all_reduce(
    tensor: torch.Tensor,
    op: Union[dist.ReduceOp, dist.ReduceOp.RedOpType] = dist.ReduceOp.SUM,
    group: Optional[dist.ProcessGroup] = None,
) -> torch.Tensor:
    """``tensor`` reduced over every rank of ``group`` (a new tensor; the input
    is left as it was), differentiable (see the module docstring)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"all_reduce takes a torch.Tensor, got {type(tensor).__name__}")
    torch_reduce_op_to_bagua(op)  # a clear error before autograd records anything
    return _AllReduce.apply(op, dist.group.WORLD if group is None else group, tensor)


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, group, tensor):
        ctx.op, ctx.group = op, group
        out = tensor.detach().clone(memory_format=torch.contiguous_format)
        allreduce_inplace(out, torch_reduce_op_to_bagua(op), comm=_bagua_group(group))
        return out

    @staticmethod
    def backward(ctx, grad_output):
        return None, None, _AllReduce.apply(ctx.op, ctx.group, grad_output)
