"""``bagua.torch_api.algorithms``: :mod:`bagua_torch.algorithms` under Bagua
0.9.2's module names. ``Algorithm.init(name, **kwargs)`` builds one by its
registered name (:func:`bagua_core.algorithms.names`: the six of Bagua 0.9,
"gradient_allreduce", "bytegrad", "decentralized",
"low_precision_decentralized", "qadam", "async", and the ones added since).
Every algorithm class is here, listed from that registry; the submodules are
Bagua 0.9.2's (plus ``local_steps``)."""

from bagua.torch_api.algorithms import (
    async_model_average,
    base,
    bytegrad,
    decentralized,
    gradient_allreduce,
    local_steps,
    q_adam,
)
from bagua.torch_api.algorithms.base import Algorithm, AlgorithmImpl
from bagua.torch_api.algorithms.q_adam import QAdamOptimizer

# Every algorithm class (GradientAllReduceAlgorithm, ...), one per registered description.
_ALGORITHM_CLASSES = Algorithm.classes()
globals().update(_ALGORITHM_CLASSES)

__all__ = [
    "Algorithm",
    "AlgorithmImpl",
    *_ALGORITHM_CLASSES,
    "QAdamOptimizer",
    "base",
    "gradient_allreduce",
    "bytegrad",
    "decentralized",
    "q_adam",
    "async_model_average",
    "local_steps",
]
