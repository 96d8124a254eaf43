"""``bagua.torch_api.algorithms.q_adam``: QAdam. bagua_torch's classes once
they are built; until then constructing them raises ``NotImplementedError``."""

try:
    from bagua_torch.algorithms import QAdamAlgorithm, QAdamOptimizer
except ImportError:
    from bagua.torch_api._not_built import not_built

    QAdamAlgorithm = not_built("QAdamAlgorithm", __name__)
    QAdamOptimizer = not_built("QAdamOptimizer", __name__)

__all__ = ["QAdamAlgorithm", "QAdamOptimizer"]
