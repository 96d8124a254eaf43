"""The optimizer step bucket by bucket (``with_bagua(..., overlap_optimizer=True)``).

Backward ends without waiting for the exchange; the wrapped
``optimizer.step()`` then updates each bucket's parameters as soon as that
bucket's exchange has finished, while later buckets are still on the wire.

How: for the duration of the step, ``optimizer.param_groups`` is a
:class:`_BucketGroups`: the same group dicts, but iterating it (what every
per-parameter torch optimizer's ``step`` does: ``for group in
self.param_groups``) first yields each group narrowed to the parameters whose
gradients need no exchange, then, bucket by bucket in the order the buckets
finish (``Engine.wait_any``), each group narrowed to that bucket's parameters
(``group["params"]`` set to the subset, restored when the step moves on). So
``step`` runs once (its hooks, profiler range, LR-scheduler counter once), the
group's hyperparameters are read and written in the real dict, and each
parameter gets exactly the update of the unfused step: the optimizers accepted
here update every parameter from its own gradient and state alone (the
foreach / fused paths batch parameters, they do not mix them).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import torch

from bagua_core.engine import monotonic_ns


def _per_parameter_optimizers() -> Tuple[type, ...]:
    from bagua_torch.algorithms.q_adam import QAdamOptimizer

    names = (
        "SGD",
        "Adam",
        "AdamW",
        "Adamax",
        "NAdam",
        "RAdam",
        "Adagrad",
        "Adadelta",
        "RMSprop",
        "Rprop",
        "ASGD",
        "Adafactor",
    )
    return tuple(getattr(torch.optim, n) for n in names if hasattr(torch.optim, n)) + (QAdamOptimizer,)


def _algorithm_step(cls: type):
    """``cls.step`` without torch's hook/profiler wrapper (which torch puts on
    the class when the first instance is built)."""
    fn = getattr(cls, "step", None)
    while getattr(fn, "hooked", False) and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def check_optimizer(opt: torch.optim.Optimizer) -> None:
    """Raises ValueError unless ``opt`` updates each parameter from its own
    gradient and state only (its class or a subclass that keeps its ``step``)."""
    known = _per_parameter_optimizers()
    step = _algorithm_step(type(opt))
    if not any(step is _algorithm_step(k) for k in known):
        raise ValueError(
            f"overlap_optimizer=True steps the optimizer bucket by bucket, which gives the unfused result only for "
            f"optimizers that update each parameter from its own gradient and state; {type(opt).__name__} is not "
            f"one of them (supported: {', '.join(k.__name__ for k in known)}, and subclasses that keep their step). "
            "Wrap without overlap_optimizer"
        )


class _BucketGroups(list):
    """``param_groups`` during an overlapped step (see the module docstring).
    ``owners``: the wrapped models (``BaguaDistributedDataParallel``) whose
    gradients this optimizer steps with overlap; each owner whose step is
    open at iteration time contributes its buckets."""

    def __init__(self, groups, owners):
        super().__init__(groups)
        self._owners = owners

    def __iter__(self):
        groups = [(g, g["params"]) for g in list.__iter__(self)]
        unit_of: Dict[int, Tuple[int, int]] = {}  # id(param) -> (owner position, bucket index)
        open_owners = [o for o in self._owners if o.step_pending]
        for k, owner in enumerate(open_owners):
            for i, params in enumerate(owner.bucket_params):
                for p in params:
                    unit_of[id(p)] = (k, i)
        rest: List[List[torch.Tensor]] = [[] for _ in groups]
        units: Dict[Tuple[int, int], List[List[torch.Tensor]]] = {}
        for j, (_, params) in enumerate(groups):
            for p in params:
                unit = unit_of.get(id(p))
                if unit is None:
                    rest[j].append(p)
                else:
                    units.setdefault(unit, [[] for _ in groups])[j].append(p)
        try:
            yield from _narrowed(groups, rest)  # gradients that need no exchange first
            for k, owner in enumerate(open_owners):
                pending = sorted(i for kk, i in units if kk == k)
                while pending:
                    i = owner.wait_bucket_of_step(pending)
                    pending.remove(i)
                    t0 = monotonic_ns()
                    yield from _narrowed(groups, units[(k, i)])
                    owner.record_optimizer_span(i, t0, monotonic_ns())
        finally:
            for g, params in groups:
                g["params"] = params


def _narrowed(groups, subsets):
    for (g, params), subset in zip(groups, subsets):
        if subset:
            g["params"] = subset
            try:
                yield g
            finally:
                g["params"] = params


def step_by_bucket(opt: torch.optim.Optimizer, owners: Sequence, step: Callable, args, kwargs):
    """Calls ``step(*args, **kwargs)`` (the optimizer's own step, hooks
    included) with ``opt.param_groups`` iterating bucket by bucket."""
    groups = opt.param_groups
    opt.param_groups = _BucketGroups(groups, list(owners))
    try:
        return step(*args, **kwargs)
    finally:
        opt.param_groups = groups
