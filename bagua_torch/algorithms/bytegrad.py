"""ByteGrad: gradients averaged with MinMaxUInt8 compression (scatter-reduce-
gather of 8-bit codes). Buckets are padded to a multiple of the group size."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class ByteGradAlgorithm(Algorithm):
    """Centralized low-precision synchronous data parallelism. The residual of
    ``error_feedback`` is saved in ``state_dict()`` as ``bagua.step_state.<i>``."""

    core_type = core.ByteGrad
