"""GradientAllReduce: gradients allreduced (mean or sum) bucket by bucket while
backward runs; the optimizer then steps on identical gradients everywhere."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class GradientAllReduceAlgorithm(Algorithm):
    """Centralized full-precision synchronous data parallelism (like DDP).

    Args:
        hierarchical: reduce within each node to its leader, allreduce among
            leaders, broadcast within the node.
        average: mean of the gradients (else their sum).
    """

    core_type = core.GradientAllReduce

    def __init__(self, hierarchical: bool = False, average: bool = True):
        super().__init__(hierarchical=hierarchical, average=average)
