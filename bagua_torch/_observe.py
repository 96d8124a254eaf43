"""Watching a wrapped model train: ``BAGUA_TRACE`` (each engine step's
buckets and timings, the forward/backward and optimizer spans) and
``BAGUA_AUTOTUNE`` (the bucket plan re-tuned between steps from the order the
gradients became ready). Functions of the wrapper
(:class:`bagua_torch.distributed.BaguaDistributedDataParallel`), whose
attributes hold the state (``autotune``, ``_tracer``, the ``_t_*`` times)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from bagua_core import log, trace as core_trace
from bagua_core.algorithms import BACKWARD
from bagua_core.autotune import AutotuneSession
from bagua_core.dtypes import as_dtype
from bagua_torch._views import same_memory

if TYPE_CHECKING:
    from bagua_torch.distributed import BaguaDistributedDataParallel


def autotune_unsupported(ddp: "BaguaDistributedDataParallel") -> str:
    """Why the bucket plan of this algorithm cannot change during training ('' if it can)."""
    if ddp.background_plan is not None:
        return "it switches to averaging weights in the background after its warm-up"
    if ddp.plan.phase != BACKWARD or ddp.communicates_weights:
        return "it communicates weights"
    if ddp.plan.one_bucket_per_dtype:
        return "it uses one bucket per dtype"
    if ddp.plan.optimizer_state or ddp.impl.keeps_state:
        return "its steps keep state per bucket"
    return ""


def start_observing(ddp: "BaguaDistributedDataParallel", bucket_bytes: Optional[int]) -> None:
    s = ddp._settings
    ddp._tracer = core_trace.writer(s)
    if s.autotune_level >= 1:
        reason = autotune_unsupported(ddp)
        if reason:
            log.logger.warning("BAGUA_AUTOTUNE: %s keeps its bucket plan: %s", ddp.algorithm.name, reason)
        else:
            group = ddp.engine.group
            decls = [(n, p.numel(), as_dtype(p.dtype)) for n, p in reversed(ddp.params)]
            ddp.autotune = AutotuneSession(
                decls,
                bucket_bytes or s.bucket_size,
                group.store,
                group.name,
                group.rank,
                group.size,
                ddp.module_name,
                s,
            )
    if ddp._tracer is not None or ddp.autotune is not None:
        ddp.engine.record_ready = True


def autotune_step(ddp: "BaguaDistributedDataParallel") -> None:
    plan = ddp.autotune.on_step_start(ddp.engine.steps, ddp.engine.ready_order)
    if plan is None:
        return
    with torch.no_grad():  # gradients keep their values, in their own memory until the new buckets
        for n, p in ddp.params:
            if same_memory(p.grad, ddp.slots[n]):
                p.grad = ddp.slots[n].clone()
    ddp.engine.clear_buckets()
    ddp._build_buckets(plan.bucket_bytes, [n for n, _, _ in ddp.autotune.ordered_decls(plan)])


def trace_step(ddp: "BaguaDistributedDataParallel") -> None:
    step = ddp.engine.steps - 1
    ddp._tracer.engine_step(
        ddp.module_name, step, [b.name for b in ddp.buckets], ddp.engine.timings(), lanes=ddp.engine.num_lanes
    )
    if ddp._t_backward_end >= 0:
        ddp._tracer.span(
            ddp.module_name, "forward start -> backward end", ddp._t_forward, ddp._t_backward_end, step=step
        )
        ddp._tracer.span(
            ddp.module_name, "backward: first gradient -> end", ddp._t_first_grad, ddp._t_backward_end, step=step
        )
    ddp._t_forward = ddp._t_first_grad = ddp._t_backward_end = -1


def record_optimizer_span(ddp: "BaguaDistributedDataParallel", bucket: int, start_ns: int, end_ns: int) -> None:
    if ddp._tracer is not None:
        ddp._optimizer_spans.append((bucket, start_ns, end_ns))


def trace_optimizer_step(ddp: "BaguaDistributedDataParallel", start_ns: int, end_ns: int) -> None:
    """Traced: the optimizer step (and, overlapped, each bucket's part of
    it) as spans of the step just ended."""
    if ddp._tracer is None:
        return
    step = ddp.engine.steps - 1
    ddp._tracer.span(ddp.module_name, "optimizer step", start_ns, end_ns, step=step)
    for bucket, t0, t1 in ddp._optimizer_spans:
        ddp._tracer.span(ddp.module_name, f"optimizer: bucket {ddp.buckets[bucket].name}", t0, t1, step=step)
    ddp._optimizer_spans.clear()
