"""ByteGrad: gradients averaged with MinMaxUInt8 compression (8 bits per
element on the wire; each element is quantised twice), optionally with error
feedback (``csrc/ops/bytegrad.h``)."""

from __future__ import annotations

import dataclasses

from bagua_core.algorithms._base import Plan, check_bool, register


@register
@dataclasses.dataclass(frozen=True)
class ByteGrad:
    """Centralized gradient averaging with MinMaxUInt8 compression
    (scatter-reduce-gather; buckets padded to a multiple of the group size).

    Args:
        hierarchical: average within each node first, compress only between
            node leaders.
        average: mean of the gradients (else their sum).
        error_feedback: keep, per bucket, the residual of this rank's own
            (first) quantisation, ``e = (g + e) - decompress(compress(g + e))``,
            and add it to the next step's gradient before compressing
            (EF-SGD). The second quantisation (of the reduced chunk, before
            the allgather) is not fed back. With ``hierarchical`` the node
            leader, which quantises the node average, keeps it. The residual
            is algorithm state (checkpointed; one element of the gradients'
            dtype per bucket element, zero at the start).
    """

    hierarchical: bool = True
    average: bool = True
    error_feedback: bool = False

    name = "bytegrad"
    # what a live job's members take on a membership change (docs/fault-tolerance.md's table)
    on_membership_change = (
        "Live. The model and optimizer state are common; with `error_feedback`, rank 0's residual becomes every "
        "member's (a one-off repeat of one step's compression error)."
    )

    def __post_init__(self):
        check_bool("ByteGrad", "hierarchical", self.hierarchical)
        check_bool("ByteGrad", "average", self.average)
        check_bool("ByteGrad", "error_feedback", self.error_feedback)

    def plan(self) -> Plan:
        params = {"hierarchical": self.hierarchical, "average": self.average}
        if self.error_feedback:  # absent when off: the step and its description stay as without it
            params["error_feedback"] = True
        return Plan(step="bytegrad", params=params)
