"""GradientAllReduce: gradients allreduced (mean or sum) bucket by bucket while
backward runs, like torch DDP."""

from __future__ import annotations

import dataclasses

from bagua_core.algorithms._base import Plan, check_bool, register


@register
@dataclasses.dataclass(frozen=True)
class GradientAllReduce:
    """Centralized full-precision gradient allreduce, like torch DDP.

    Args:
        hierarchical: reduce within each node to its leader, allreduce among
            leaders, broadcast within the node.
        average: mean of the gradients (else their sum).
    """

    hierarchical: bool = False
    average: bool = True

    name = "gradient_allreduce"
    # what a live job's members take on a membership change (docs/fault-tolerance.md's table)
    on_membership_change = (
        "Live. Nothing of its own: each step averages the gradients of the members present; the model and "
        "optimizer state every member takes from rank 0 are the ones all held."
    )

    def __post_init__(self):
        check_bool("GradientAllReduce", "hierarchical", self.hierarchical)
        check_bool("GradientAllReduce", "average", self.average)

    def plan(self) -> Plan:
        return Plan(step="centralized_allreduce", params={"hierarchical": self.hierarchical, "average": self.average})
