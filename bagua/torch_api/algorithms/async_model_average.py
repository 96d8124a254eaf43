"""``bagua.torch_api.algorithms.async_model_average``: asynchronous model
average. bagua_torch's class once it is built; until then constructing it
raises ``NotImplementedError``."""

try:
    from bagua_torch.algorithms import AsyncModelAverageAlgorithm
except ImportError:
    from bagua.torch_api._not_built import not_built

    AsyncModelAverageAlgorithm = not_built("AsyncModelAverageAlgorithm", __name__)

__all__ = ["AsyncModelAverageAlgorithm"]
