"""Bagua's algorithms for JAX, under the original names and defaults (the
same classes as ``bagua_torch.algorithms``). Pass one to
:func:`bagua_jax.transform`; a :mod:`bagua_core.algorithms` description or a
registered name (``"bytegrad"``, ...) works too."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_core.algorithms.frontend import FrontendAlgorithm


class Algorithm(FrontendAlgorithm):
    """Base of the JAX algorithms; ``Algorithm.init(name, **kwargs)`` builds one by name."""

    _registry: dict = {}
    frontend = "bagua_jax.algorithms"


class GradientAllReduceAlgorithm(Algorithm):
    """Gradients allreduced (mean, or sum with ``average=False``); with
    ``hierarchical`` within each node first, then among node leaders."""

    core_type = core.GradientAllReduce

    def __init__(self, hierarchical: bool = False, average: bool = True):
        super().__init__(hierarchical=hierarchical, average=average)


class ByteGradAlgorithm(Algorithm):
    """Gradients averaged with MinMaxUInt8 compression (8-bit scatter-reduce-gather)."""

    core_type = core.ByteGrad

    def __init__(self, hierarchical: bool = True, average: bool = True):
        super().__init__(hierarchical=hierarchical, average=average)


class DecentralizedAlgorithm(Algorithm):
    """Decentralized SGD: weights averaged with peers ("all", or one rotating
    partner with "shift_one") every ``communication_interval`` steps. A weight
    algorithm: it goes *after* the optimizer in the chain and needs ``params``."""

    core_type = core.Decentralized

    def __init__(self, hierarchical: bool = True, peer_selection_mode: str = "all",
                 communication_interval: int = 1):
        super().__init__(hierarchical=hierarchical, peer_selection_mode=peer_selection_mode,
                         communication_interval=communication_interval)


def as_algorithm(algorithm) -> Algorithm:
    """A JAX algorithm from an instance, a ``bagua_core.algorithms`` description or a name."""
    return Algorithm.coerce(algorithm, accept_names=True)


__all__ = ["Algorithm", "ByteGradAlgorithm", "DecentralizedAlgorithm", "GradientAllReduceAlgorithm", "as_algorithm"]
