"""Making replicas start equal: broadcasts of parameters, buffers and
optimizer state from one rank (glue over the bagua_core primitives; tensors
are grouped per dtype so a model costs a few collectives, not one per
tensor)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Collection, Iterable, List

import torch

from bagua_core import comm as core_comm
from bagua_core.process_group import ProcessGroup

# dtypes the communicators carry; bool travels as uint8, the rest pickled
_WIRE = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8)


def broadcast_tensors(tensors: Iterable[torch.Tensor], src: int, group: ProcessGroup) -> None:
    """Every tensor becomes rank ``src``'s version, in place. Every rank passes
    tensors of the same shapes and dtypes in the same order."""
    if group.size == 1:
        return
    by_dtype: "OrderedDict[torch.dtype, List[torch.Tensor]]" = OrderedDict()
    others: List[torch.Tensor] = []
    for t in tensors:
        w = t.detach()
        if w.dtype == torch.bool:
            w = w.view(torch.uint8)
        if w.dtype in _WIRE:
            by_dtype.setdefault(w.dtype, []).append(w)
        else:
            others.append(w)
    for group_tensors in by_dtype.values():
        flat = torch.cat([w.reshape(-1) for w in group_tensors]) if group_tensors else None
        if flat is None or flat.numel() == 0:
            continue
        core_comm.broadcast(flat, src, group)
        if group.rank != src:
            offset = 0
            for w in group_tensors:
                n = w.numel()
                w.copy_(flat[offset : offset + n].view(w.shape))
                offset += n
    if others:
        values = core_comm.broadcast_object([w.cpu() for w in others] if group.rank == src else None, src, group)
        if group.rank != src:
            for w, v in zip(others, values):
                w.copy_(v)


def optimizer_signature(optimizer: torch.optim.Optimizer, names: dict) -> List[tuple]:
    """(kind, name, ...) entries describing an optimizer's parameter groups."""
    out = [("optimizer", type(optimizer).__name__, len(optimizer.param_groups))]
    for gi, g in enumerate(optimizer.param_groups):
        out.append(("param_group", str(gi), tuple(names.get(id(p), "<not in the model>") for p in g["params"])))
    return out


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, src: int, group: ProcessGroup, skip: Collection[int] = ()
) -> None:
    """Rank ``src``'s optimizer state and hyperparameters on every rank:
    tensors with the primitives, everything else (scalars, param-group
    settings) pickled in one broadcast_object. The state of parameters whose
    ``id()`` is in ``skip`` (ignored parameters) stays each rank's own."""
    if group.size == 1:
        return
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("LBFGS keeps its state in a form Bagua cannot broadcast; use another optimizer")
    sd = optimizer.state_dict()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    kept = {pid for pid in range(len(params)) if id(params[pid]) in skip}  # state_dict ids are positions
    meta = None
    if group.rank == src:
        meta = {
            "param_groups": sd["param_groups"],
            "state": {
                pid: {
                    k: ("tensor", tuple(v.shape), v.dtype) if torch.is_tensor(v) else ("value", v)
                    for k, v in entries.items()
                }
                for pid, entries in sd["state"].items()
                if pid not in kept
            },
        }
    meta = core_comm.broadcast_object(meta, src, group)
    state, tensors = {}, []
    if group.rank != src:
        for pid in kept:
            if pid in sd["state"]:
                state[pid] = sd["state"][pid]
    for pid, entries in meta["state"].items():
        st = {}
        for key, (kind, *info) in entries.items():
            if kind == "tensor":
                shape, dtype = info
                if group.rank == src:
                    t = sd["state"][pid][key]
                else:
                    device = params[pid].device if isinstance(pid, int) and pid < len(params) else "cpu"
                    t = torch.empty(shape, dtype=dtype, device=device)
                st[key] = t
                tensors.append(t)
            else:
                st[key] = info[0]
        state[pid] = st
    broadcast_tensors(tensors, src, group)
    if group.rank != src:
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
