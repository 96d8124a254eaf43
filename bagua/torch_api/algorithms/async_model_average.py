"""``bagua.torch_api.algorithms.async_model_average``: bagua_torch's asynchronous model average."""

from bagua_torch.algorithms import AsyncModelAverageAlgorithm

__all__ = ["AsyncModelAverageAlgorithm"]
