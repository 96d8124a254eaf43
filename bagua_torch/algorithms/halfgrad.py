"""HalfGrad: gradients averaged over a 16-bit wire (float16 or bfloat16),
summed in float32. Buckets are padded to a multiple of the group size."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class HalfGradAlgorithm(Algorithm):
    """Centralized synchronous data parallelism with 16-bit gradients on the
    wire (torch's ``fp16_compress_hook`` / ``bf16_compress_hook``, but summed
    in float32). Gradients of any floating dtype; the result keeps it."""

    core_type = core.HalfGrad
