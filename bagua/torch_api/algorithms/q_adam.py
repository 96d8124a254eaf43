"""``bagua.torch_api.algorithms.q_adam``: bagua_torch's QAdam."""

from bagua_torch.algorithms import QAdamAlgorithm, QAdamOptimizer

__all__ = ["QAdamAlgorithm", "QAdamOptimizer"]
