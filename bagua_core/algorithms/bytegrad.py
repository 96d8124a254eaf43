"""ByteGrad: gradients averaged with MinMaxUInt8 compression (8 bits per
element on the wire; each element is quantised twice)."""

from __future__ import annotations

import dataclasses

from bagua_core.algorithms._base import Plan, check_bool, register


@register
@dataclasses.dataclass(frozen=True)
class ByteGrad:
    """Centralized gradient averaging with MinMaxUInt8 compression
    (scatter-reduce-gather; buckets padded to a multiple of the group size)."""

    hierarchical: bool = True
    average: bool = True

    name = "bytegrad"

    def __post_init__(self):
        check_bool("ByteGrad", "hierarchical", self.hierarchical)
        check_bool("ByteGrad", "average", self.average)

    def plan(self) -> Plan:
        return Plan(step="bytegrad", params={"hierarchical": self.hierarchical, "average": self.average})
