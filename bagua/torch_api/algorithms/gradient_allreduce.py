"""``bagua.torch_api.algorithms.gradient_allreduce`` (:mod:`bagua_torch.algorithms.gradient_allreduce`)."""

from bagua_torch.algorithms.gradient_allreduce import GradientAllReduceAlgorithm

__all__ = ["GradientAllReduceAlgorithm"]
