"""ByteGrad: gradients averaged with MinMaxUInt8 compression (scatter-reduce-
gather of 8-bit codes). Buckets are padded to a multiple of the group size."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class ByteGradAlgorithm(Algorithm):
    """Centralized low-precision synchronous data parallelism.

    Args:
        hierarchical: average within each node first, compress only between
            node leaders.
        average: mean of the gradients (else their sum).
    """

    core_type = core.ByteGrad

    def __init__(self, hierarchical: bool = True, average: bool = True):
        super().__init__(hierarchical=hierarchical, average=average)
