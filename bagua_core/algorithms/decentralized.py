"""Decentralized SGD: weights averaged with peers concurrently with forward and
backward; the average replaces the weights before the optimizer step, which
then applies the local gradient: x_{t+1} = avg(x_t) - lr * g(x_t)."""

from __future__ import annotations

import dataclasses

from bagua_core.algorithms._base import FORWARD_START, WEIGHTS, Plan, check_bool, check_choice, check_int, register

PEER_SELECTION_MODES = ("all", "shift_one")


@register
@dataclasses.dataclass(frozen=True)
class Decentralized:
    """Decentralized SGD: weights averaged with peers every
    ``communication_interval`` steps.

    Args:
        hierarchical: average within each node first; exchange between node
            leaders only.
        peer_selection_mode: "all" (global average of the weights) or
            "shift_one" (one partner per communication, rotating; it pairs
            peers, so it needs an even number of them: processes, or nodes
            when ``hierarchical``).
        communication_interval: communicate every this many steps.
    """

    hierarchical: bool = True
    peer_selection_mode: str = "all"
    communication_interval: int = 1

    name = "decentralized"
    # what a live job's members take on a membership change (docs/fault-tolerance.md's table)
    on_membership_change = (
        "Live. Rank 0's weights become every member's, so the replicas start equal again; the peers follow the "
        "carried step on the new ring."
    )

    def __post_init__(self):
        check_bool("Decentralized", "hierarchical", self.hierarchical)
        check_choice("Decentralized", "peer_selection_mode", self.peer_selection_mode, PEER_SELECTION_MODES)
        interval = check_int("Decentralized", "communication_interval", self.communication_interval, 1)
        object.__setattr__(self, "communication_interval", interval)

    def plan(self) -> Plan:
        return Plan(
            step="decentralized",
            params={
                "hierarchical": self.hierarchical,
                "peer_selection_mode": self.peer_selection_mode,
                "communication_interval": self.communication_interval,
            },
            communicates=WEIGHTS,
            phase=FORWARD_START,
            one_bucket_per_dtype=True,
            counts_steps=True,
        )
