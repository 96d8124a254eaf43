"""QAdam: Adam whose momentum, after a warm-up of full-precision gradient
averaging, is communicated with MinMaxUInt8 compression while the second
moment stays frozen (``csrc/ops/qadam.h``)."""

from __future__ import annotations

import dataclasses
import numbers

from bagua_core.algorithms._base import GRADIENTS, Plan, check_bool, check_int, register


@register
@dataclasses.dataclass(frozen=True)
class QAdam:
    """QAdam's communication: optimizer steps ``t < warmup_steps`` allreduce
    the gradients (Adam updates both moments); from ``t = warmup_steps`` on
    each rank folds its gradient into the momentum (``beta1``) and the
    momentum is averaged with the compressed scatter-reduce-gather (buckets
    padded to a multiple of the group size). The optimizer (torch
    ``QAdamOptimizer``, ``bagua_jax.qadam``) owns the momentum; the frontends
    share it with the engine step, and take ``warmup_steps`` and ``beta1``
    from the optimizer.

    Args:
        hierarchical: compressed averaging within each node first, then among
            node leaders.
        warmup_steps: optimizer steps ``t < warmup_steps`` allreduce the
            gradients (the optimizer's ``warmup_steps``).
        beta1: the momentum's decay (the optimizer's first beta).
    """

    hierarchical: bool = True
    warmup_steps: int = 100
    beta1: float = 0.9

    name = "qadam"
    # what a live job's members take on a membership change (docs/fault-tolerance.md's table)
    on_membership_change = (
        "Live. The momentum and variance are the optimizer's state, common to all, and its step count (warm-up or "
        "compressed) travels with it."
    )

    def __post_init__(self):
        check_bool("QAdam", "hierarchical", self.hierarchical)
        steps = check_int("QAdam", "warmup_steps", self.warmup_steps, 1)
        object.__setattr__(self, "warmup_steps", steps)
        if isinstance(self.beta1, bool) or not isinstance(self.beta1, numbers.Real):
            raise TypeError(f"QAdam: beta1 must be a float, got {self.beta1!r}")
        if not 0.0 <= float(self.beta1) < 1.0:
            raise ValueError(f"QAdam: beta1 must be in [0, 1), got {self.beta1!r}")
        object.__setattr__(self, "beta1", float(self.beta1))

    def plan(self) -> Plan:
        return Plan(
            step="qadam",
            params={"hierarchical": self.hierarchical, "warmup_steps": self.warmup_steps, "beta1": repr(self.beta1)},
            communicates=GRADIENTS,
            counts_steps=True,
            optimizer_state="exp_avg",
        )
