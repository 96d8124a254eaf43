"""``bagua.torch_api.algorithms.local_steps``: :class:`bagua_torch.algorithms.LocalStepsAlgorithm`."""

from bagua_torch.algorithms import LocalStepsAlgorithm

__all__ = ["LocalStepsAlgorithm"]
