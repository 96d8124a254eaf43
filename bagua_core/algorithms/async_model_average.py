"""Asynchronous model average: every rank's weights are averaged by a
background loop while training runs (``csrc/sched/async_averager.h``), after
a warm-up of gradient allreduce (:meth:`AsyncModelAverage.warmup_plan`)."""

from __future__ import annotations

import dataclasses

from bagua_core.algorithms._base import BACKGROUND, WEIGHTS, Plan, check_choice, check_int, register
from bagua_core.algorithms.gradient_allreduce import GradientAllReduce

ASYNC_PEER_SELECTION_MODES = ("all",)


@register
@dataclasses.dataclass(frozen=True)
class AsyncModelAverage:
    """Asynchronous model average. Training steps ``t < warmup_steps``
    allreduce the gradients (mean); from then on a background loop, on its
    own clone of the group, averages the weights of every rank every
    ``sync_interval_ms`` while each rank trains at its own pace: one round
    snapshots the weights, averages the snapshots, and moves the weights by
    ``average - snapshot`` (keeping the local progress made meanwhile). An
    optimizer step never sees half an average (a weight lock). Needs
    ``do_flatten=True`` (torch: the weights live in the loop's buckets).

    Args:
        peer_selection_mode: "all" (every rank's weights are averaged; the
            only mode, as in Bagua 0.9).
        sync_interval_ms: pause between two averaging rounds of the
            background loop (0: back to back).
        warmup_steps: training steps that allreduce gradients (mean) before
            the background averaging starts.
    """

    peer_selection_mode: str = "all"
    sync_interval_ms: int = 500
    warmup_steps: int = 0

    name = "async"
    # what a live job's members take on a membership change (docs/fault-tolerance.md's table)
    on_membership_change = (
        "Live. The background averaging stops with the old group; rank 0's weights become every member's and the "
        "averaging starts again on the new group."
    )

    def __post_init__(self):
        check_choice("AsyncModelAverage", "peer_selection_mode", self.peer_selection_mode, ASYNC_PEER_SELECTION_MODES)
        interval = check_int("AsyncModelAverage", "sync_interval_ms", self.sync_interval_ms, 0)
        object.__setattr__(self, "sync_interval_ms", interval)
        steps = check_int("AsyncModelAverage", "warmup_steps", self.warmup_steps, 0)
        object.__setattr__(self, "warmup_steps", steps)

    def plan(self) -> Plan:
        """The background averaging of the weights (one bucket per dtype)."""
        return Plan(
            step="async_model_average",
            params={"peer_selection_mode": self.peer_selection_mode, "sync_interval_ms": self.sync_interval_ms},
            communicates=WEIGHTS,
            phase=BACKGROUND,
            one_bucket_per_dtype=True,
            counts_steps=True,
        )

    def warmup_plan(self) -> Plan:
        """The warm-up steps' plan: gradients allreduced (mean), flat."""
        return GradientAllReduce(hierarchical=False, average=True).plan()
