"""The wrapped ``optimizer.step`` / ``zero_grad`` of ``with_bagua``: the
optimizer's step first ends the open step of every wrapped model it updates,
or steps them bucket by bucket with ``overlap_optimizer``."""

from __future__ import annotations

import types
import weakref
from typing import TYPE_CHECKING

import torch

from bagua_core.engine import monotonic_ns
from bagua_torch import _overlap

if TYPE_CHECKING:
    from bagua_torch.distributed import BaguaDistributedDataParallel


class StepGuard:
    """Wraps an optimizer's ``step`` once, so it first ends the open step of
    every wrapped model it updates (a safety net: the post-backward callback
    normally did), or, for models wrapped with ``overlap_optimizer``, steps
    their parameters bucket by bucket as their exchange finishes
    (bagua_torch._overlap). Stays a bound method, as LR schedulers expect.
    ``zero_grad`` is wrapped too: it ends an open overlapped step first (the
    gradients it zeroes are the engine's buckets)."""

    @staticmethod
    def attach(optimizer: torch.optim.Optimizer, ddp: "BaguaDistributedDataParallel") -> None:
        if "_bagua_ddps" not in optimizer.__dict__:
            optimizer._bagua_ddps = weakref.WeakSet()
            optimizer._bagua_original_step = optimizer.step
            optimizer._bagua_original_zero_grad = optimizer.zero_grad

            def step(self, *args, **kwargs):
                owners = list(self._bagua_ddps)
                overlapped = [o for o in owners if o.overlap_optimizer and not o._closed]
                for owner in owners:
                    if owner not in overlapped:
                        owner.finish_step()
                    owner.before_optimizer_step()
                t0 = monotonic_ns()
                if overlapped:
                    out = _overlap.step_by_bucket(self, overlapped, self._bagua_original_step, args, kwargs)
                    for owner in overlapped:  # ends at once, unless another optimizer holds some buckets
                        owner.finish_step()
                else:
                    out = self._bagua_original_step(*args, **kwargs)
                t1 = monotonic_ns()
                for owner in owners:
                    owner.trace_optimizer_step(t0, t1)
                    owner.after_optimizer_step()
                return out

            def zero_grad(self, *args, **kwargs):
                for owner in list(self._bagua_ddps):
                    if owner.overlap_optimizer:
                        owner.finish_step()
                return self._bagua_original_zero_grad(*args, **kwargs)

            optimizer.step = types.MethodType(step, optimizer)
            optimizer.zero_grad = types.MethodType(zero_grad, optimizer)
        optimizer._bagua_ddps.add(ddp)

    @staticmethod
    def detach(optimizer: torch.optim.Optimizer, ddp: "BaguaDistributedDataParallel") -> None:
        ddps = optimizer.__dict__.get("_bagua_ddps")
        if ddps is not None:
            ddps.discard(ddp)
