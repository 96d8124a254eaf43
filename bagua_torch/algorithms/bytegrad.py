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
        error_feedback: keep each bucket's residual of this rank's own
            quantisation, ``e = (g + e) - decompress(compress(g + e))``, and
            add it to the next step's gradients before compressing (EF-SGD;
            the quantisation of the reduced chunk before the gather is not
            fed back). One element of the gradients' dtype per bucket
            element; saved in ``state_dict()`` as ``bagua.step_state.<i>``.
    """

    core_type = core.ByteGrad

    def __init__(self, hierarchical: bool = True, average: bool = True, error_feedback: bool = False):
        super().__init__(hierarchical=hierarchical, average=average, error_feedback=error_feedback)
