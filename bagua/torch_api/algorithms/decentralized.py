"""``bagua.torch_api.algorithms.decentralized`` (:mod:`bagua_torch.algorithms.decentralized`).
``LowPrecisionDecentralizedAlgorithm`` is bagua_torch's once it is built; until
then constructing it raises ``NotImplementedError``."""

from bagua_torch.algorithms.decentralized import DecentralizedAlgorithm

try:
    from bagua_torch.algorithms import LowPrecisionDecentralizedAlgorithm
except ImportError:
    from bagua.torch_api._not_built import not_built

    LowPrecisionDecentralizedAlgorithm = not_built("LowPrecisionDecentralizedAlgorithm", __name__)

__all__ = ["DecentralizedAlgorithm", "LowPrecisionDecentralizedAlgorithm"]
