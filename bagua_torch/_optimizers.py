"""What the wrapper requires of the optimizers it is given (checked at wrap
time, the same on every rank), and the optimizer state it shares with the
engine's step (QAdam: the optimizer's ``exp_avg`` is a view of the step's
state)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from bagua_core.algorithms import BACKWARD
from bagua_torch import _overlap
from bagua_torch._views import torch_view

if TYPE_CHECKING:
    from bagua_torch.distributed import BaguaDistributedDataParallel


def check_own_optimizer(ddp: "BaguaDistributedDataParallel") -> None:
    """Algorithms that share their optimizer's state (QAdam's momentum)
    need exactly that optimizer, updating every parameter."""
    own = getattr(ddp.algorithm, "optimizer", None)
    name = type(ddp.algorithm).__name__
    if len(ddp.optimizers) != 1 or ddp.optimizers[0] is not own:
        got = ", ".join(type(o).__name__ for o in ddp.optimizers) or "none"
        raise ValueError(
            f"{name} communicates the state of the optimizer it was built with, so pass exactly "
            f"that optimizer to with_bagua; got {got}"
        )
    check_one_optimizer_updates_all(ddp)


def share_optimizer_state(ddp: "BaguaDistributedDataParallel") -> None:
    """Makes the optimizer's per-parameter state ``plan.optimizer_state``
    (QAdam: exp_avg) a view of the engine step's state, so both update
    the same memory; again after optimizer.load_state_dict() replaced it.
    The step counter follows the optimizer's."""
    opt = ddp.optimizers[0]
    key = ddp.plan.optimizer_state
    relinked = False
    with torch.no_grad():
        for p, view in ddp._shared_state:
            current = opt.init_state(p).get(key)
            if current is not view:
                if current is not None:
                    view.copy_(current)
                opt.state[p][key] = view
                relinked = True
    if relinked:
        for op in ddp.impl.ops:
            op.step = opt.step_id()


def link_optimizer_state(ddp: "BaguaDistributedDataParallel") -> None:
    ddp._shared_state = []
    for b, op in zip(ddp.buckets, ddp.impl.ops):
        state = torch_view(op.state_view())[0]
        with torch.no_grad():
            state.zero_()
        base = b.flat_view().address
        for n in b.tensor_names:
            slot = ddp.slots[n]
            off = (slot.data_ptr() - base) // slot.element_size()
            ddp._shared_state.append((ddp._by_name[n], state[off : off + slot.numel()].view(slot.shape)))
    # by memory, not by parameter: fuse_optimizer steps flat views of the same buffer
    ddp.optimizers[0].momentum_by_engine = {view.untyped_storage().data_ptr() for _, view in ddp._shared_state}
    share_optimizer_state(ddp)


def check_overlap_optimizer(ddp: "BaguaDistributedDataParallel") -> None:
    """overlap_optimizer: a gradient algorithm whose step ends with
    backward, and optimizers that update every communicated parameter,
    each from its own gradient and state (so the step can go bucket by
    bucket). Raises ValueError, the same on every rank, before any
    communication."""
    name = type(ddp.algorithm).__name__
    if ddp.background_plan is not None or ddp.plan.phase != BACKWARD or ddp.communicates_weights:
        raise ValueError(
            f"overlap_optimizer=True applies to algorithms that exchange gradients during backward "
            f"(GradientAllReduce, ByteGrad, LowRank, QAdam); {name} communicates weights "
            f"({'in the background' if ddp.background_plan is not None else ddp.plan.phase.replace('_', ' ')}), "
            "so there is no exchange for the optimizer to overlap with. Wrap without overlap_optimizer"
        )
    if not ddp.optimizers:
        raise ValueError(
            "overlap_optimizer=True needs the optimizers that update the model: pass them to "
            "with_bagua, since their step() is where the gradients are waited for"
        )
    for opt in ddp.optimizers:
        _overlap.check_optimizer(opt)
    owned = {id(p) for opt in ddp.optimizers for g in opt.param_groups for p in g["params"]}
    missing = [n for n, p in ddp.params if id(p) not in owned]
    if missing:
        raise ValueError(
            f"overlap_optimizer=True: parameter(s) {', '.join(repr(n) for n in missing[:8])} are not updated by "
            "the optimizers passed to with_bagua; their gradients would be read before their exchange ends. "
            "Add them to an optimizer, list them in module._bagua_params_and_buffers_to_ignore, or wrap "
            "without overlap_optimizer"
        )


def check_one_optimizer_updates_all(ddp: "BaguaDistributedDataParallel") -> None:
    """Algorithms that communicate after ``optimizer.step()`` run once per
    step of exactly one optimizer, which must update every parameter."""
    if len(ddp.optimizers) != 1:
        raise ValueError(
            f"{type(ddp.algorithm).__name__} communicates after the optimizer step, so it needs "
            f"exactly one optimizer; got {len(ddp.optimizers)}"
        )
    owned = {id(p) for g in ddp.optimizers[0].param_groups for p in g["params"]}
    missing = [n for n, p in ddp.params if id(p) not in owned]
    if missing:
        raise ValueError(
            f"{type(ddp.algorithm).__name__}: parameter(s) {', '.join(repr(n) for n in missing[:8])} "
            "are not updated by the optimizer; add them to it or list them in "
            "module._bagua_params_and_buffers_to_ignore"
        )
