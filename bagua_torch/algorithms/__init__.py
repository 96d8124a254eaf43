"""Bagua's algorithms for PyTorch, under the original names and defaults.

Each is built from (and converts to, with ``.to_core()``) a framework-neutral
description in :mod:`bagua_core.algorithms`, which gives it its arguments,
their defaults, docs and checks; ``with_bagua`` accepts either. There is one
class per registered description (:func:`bagua_core.algorithms.names`);
``__all__`` lists them from that registry.
"""

from bagua_torch.algorithms.async_model_average import AsyncModelAverageAlgorithm
from bagua_torch.algorithms.base import Algorithm, AlgorithmImpl, as_algorithm, registered
from bagua_torch.algorithms.bytegrad import ByteGradAlgorithm
from bagua_torch.algorithms.decentralized import DecentralizedAlgorithm
from bagua_torch.algorithms.gradient_allreduce import GradientAllReduceAlgorithm
from bagua_torch.algorithms.halfgrad import HalfGradAlgorithm
from bagua_torch.algorithms.local_steps import LocalStepsAlgorithm
from bagua_torch.algorithms.low_precision_decentralized import LowPrecisionDecentralizedAlgorithm
from bagua_torch.algorithms.low_rank import LowRankAlgorithm
from bagua_torch.algorithms.q_adam import QAdamAlgorithm, QAdamOptimizer

__all__ = ["Algorithm", "AlgorithmImpl", "as_algorithm", "registered", *Algorithm.classes(), "QAdamOptimizer"]
