"""GradientAllReduce: gradients allreduced (mean or sum) bucket by bucket while
backward runs; the optimizer then steps on identical gradients everywhere."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class GradientAllReduceAlgorithm(Algorithm):
    """Centralized full-precision synchronous data parallelism (like DDP)."""

    core_type = core.GradientAllReduce
