"""``bagua.torch_api.algorithms``: :mod:`bagua_torch.algorithms` under Bagua
0.9.2's module names. ``Algorithm.init(name, **kwargs)`` builds one by its
registered name (the six of Bagua 0.9: "gradient_allreduce", "bytegrad",
"decentralized", "low_precision_decentralized", "qadam", "async", and
"local_steps")."""

from bagua.torch_api.algorithms import (async_model_average, base, bytegrad, decentralized, gradient_allreduce,
                                        local_steps, q_adam)
from bagua.torch_api.algorithms.async_model_average import AsyncModelAverageAlgorithm
from bagua.torch_api.algorithms.base import Algorithm, AlgorithmImpl
from bagua.torch_api.algorithms.bytegrad import ByteGradAlgorithm
from bagua.torch_api.algorithms.decentralized import DecentralizedAlgorithm, LowPrecisionDecentralizedAlgorithm
from bagua.torch_api.algorithms.gradient_allreduce import GradientAllReduceAlgorithm
from bagua.torch_api.algorithms.local_steps import LocalStepsAlgorithm
from bagua.torch_api.algorithms.q_adam import QAdamAlgorithm, QAdamOptimizer

__all__ = [
    "Algorithm", "AlgorithmImpl", "GradientAllReduceAlgorithm", "ByteGradAlgorithm", "DecentralizedAlgorithm",
    "LowPrecisionDecentralizedAlgorithm", "QAdamAlgorithm", "QAdamOptimizer", "AsyncModelAverageAlgorithm",
    "LocalStepsAlgorithm", "base", "gradient_allreduce", "bytegrad", "decentralized", "q_adam", "async_model_average", "local_steps",
]
