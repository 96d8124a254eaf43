"""Low-precision decentralized SGD: after the optimizer step, each rank moves
its weights towards the average of its ring neighbours (left and right),
sending only MinMaxUInt8-compressed differences; it keeps replicas of its own
and its neighbours' weights (``csrc/ops/low_precision_decentralized.h``)."""

from __future__ import annotations

import dataclasses

from bagua_core.algorithms._base import AFTER_OPTIMIZER_STEP, WEIGHTS, Plan, check_bool, check_int, register


@register
@dataclasses.dataclass(frozen=True)
class LowPrecisionDecentralized:
    """Decentralized SGD on a ring with 8-bit compressed weight differences,
    after the optimizer step, every ``communication_interval`` steps. Its
    replicas of the neighbours' weights are algorithm state (checkpointed).

    Args:
        hierarchical: average within each node first; the ring runs among
            node leaders (every node must hold the same number of processes).
        communication_interval: communicate every this many steps.
    """

    hierarchical: bool = True
    communication_interval: int = 1

    name = "low_precision_decentralized"
    # what a live job's members take on a membership change (docs/fault-tolerance.md's table)
    on_membership_change = (
        "Live. Rank 0's weights and its copies of its neighbours' weights become every member's, so the replicas "
        "start equal again."
    )

    def __post_init__(self):
        check_bool("LowPrecisionDecentralized", "hierarchical", self.hierarchical)
        interval = check_int("LowPrecisionDecentralized", "communication_interval", self.communication_interval, 1)
        object.__setattr__(self, "communication_interval", interval)

    def plan(self) -> Plan:
        return Plan(
            step="low_precision_decentralized",
            params={"hierarchical": self.hierarchical, "communication_interval": self.communication_interval},
            communicates=WEIGHTS,
            phase=AFTER_OPTIMIZER_STEP,
            counts_steps=True,
        )
