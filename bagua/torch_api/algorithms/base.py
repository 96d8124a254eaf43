"""``bagua.torch_api.algorithms.base``: the base classes of :mod:`bagua_torch.algorithms`."""

from bagua_torch.algorithms.base import Algorithm, AlgorithmImpl

__all__ = ["Algorithm", "AlgorithmImpl"]
