"""HalfGrad: gradients averaged over a 16-bit wire (float16 or bfloat16) and
summed in float32 (``csrc/ops/halfgrad.h``)."""

from __future__ import annotations

import dataclasses

from bagua_core.algorithms._base import Plan, check_bool, check_choice, register

WIRE_DTYPES = ("float16", "bfloat16")


@register
@dataclasses.dataclass(frozen=True)
class HalfGrad:
    """Centralized gradient averaging with 16-bit floats on the wire
    (scatter-reduce-gather; buckets padded to a multiple of the group size):
    half the bytes of :class:`GradientAllReduce`, no state. Each rank sends
    its gradients rounded to ``wire``; the sums are taken in float32 and
    rounded to ``wire`` once more for the gather, so every element is rounded
    twice and never summed in 16 bits (torch's ``fp16_compress_hook`` sums in
    float16).

    Args:
        hierarchical: average within each node first, in full precision;
            only node leaders use the 16-bit wire.
        average: mean of the gradients (else their sum).
        wire: "float16" (10 mantissa bits; gradients beyond 65504 in
            magnitude become infinite, below 6e-8 zero) or "bfloat16" (7
            mantissa bits, float32's range).
    """

    hierarchical: bool = False
    average: bool = True
    wire: str = "float16"

    name = "halfgrad"
    # what a live job's members take on a membership change (docs/fault-tolerance.md's table)
    on_membership_change = "Live. No state of its own; the model and optimizer state are common."

    def __post_init__(self):
        check_bool("HalfGrad", "hierarchical", self.hierarchical)
        check_bool("HalfGrad", "average", self.average)
        check_choice("HalfGrad", "wire", self.wire, WIRE_DTYPES)

    def plan(self) -> Plan:
        return Plan(
            step="halfgrad", params={"hierarchical": self.hierarchical, "average": self.average, "wire": self.wire}
        )
