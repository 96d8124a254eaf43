"""``bagua.torch_api.algorithms.decentralized``: bagua_torch's decentralized
algorithms, full and low precision."""

from bagua_torch.algorithms import DecentralizedAlgorithm, LowPrecisionDecentralizedAlgorithm

__all__ = ["DecentralizedAlgorithm", "LowPrecisionDecentralizedAlgorithm"]
