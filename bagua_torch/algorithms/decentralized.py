"""Decentralized SGD: weights averaged with peers concurrently with forward and
backward; the average replaces the weights before the optimizer step, which
then applies the local gradient: x_{t+1} = avg(x_t) - lr * g(x_t)."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class DecentralizedAlgorithm(Algorithm):
    """Decentralized synchronous SGD, full precision.

    Args:
        hierarchical: average within each node first; exchange between node
            leaders only.
        peer_selection_mode: "all" (global average of the weights) or
            "shift_one" (one partner per communication, rotating; needs an
            even number of peers).
        communication_interval: communicate every this many steps.
    """

    core_type = core.Decentralized

    def __init__(self, hierarchical: bool = True, peer_selection_mode: str = "all",
                 communication_interval: int = 1):
        super().__init__(hierarchical=hierarchical, peer_selection_mode=peer_selection_mode,
                         communication_interval=communication_interval)
