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


class LowPrecisionDecentralizedAlgorithm(Algorithm):
    """Low-precision decentralized SGD: after the optimizer step, weights move
    towards the ring neighbours' average with MinMaxUInt8-compressed
    differences, every ``communication_interval`` steps. A weight algorithm of
    the after-optimizer phase: it goes *after* the optimizer in the chain and
    needs ``params``; its replicas live in the transform's state."""

    core_type = core.LowPrecisionDecentralized

    def __init__(self, hierarchical: bool = True, communication_interval: int = 1):
        super().__init__(hierarchical=hierarchical, communication_interval=communication_interval)


class QAdamAlgorithm(Algorithm):
    """QAdam's communication for ``q_adam_optimizer`` (what
    :func:`bagua_jax.qadam` returns): ``bagua_jax.transform(QAdamAlgorithm(tx))``
    is then the whole optimizer (communication and update; use it in place of
    ``tx``). Gradients are averaged while ``t < warmup_steps``, then the
    momentum is updated with the local gradient and averaged with MinMaxUInt8
    compression."""

    core_type = core.QAdam

    def __init__(self, q_adam_optimizer, hierarchical: bool = True):
        from bagua_jax._src.qadam import hyperparameters_of

        hp = hyperparameters_of(q_adam_optimizer)
        self.optimizer = q_adam_optimizer
        super().__init__(hierarchical=hierarchical, warmup_steps=hp.warmup_steps, beta1=hp.b1)

    @classmethod
    def from_description(cls, description):
        raise TypeError("QAdam needs its optimizer: pass QAdamAlgorithm(bagua_jax.qadam(...)), not a description")

    def __repr__(self) -> str:
        return f"QAdamAlgorithm(q_adam_optimizer=<bagua_jax.qadam>, hierarchical={self._description.hierarchical!r})"


def as_algorithm(algorithm) -> Algorithm:
    """A JAX algorithm from an instance, a ``bagua_core.algorithms`` description or a name."""
    return Algorithm.coerce(algorithm, accept_names=True)


__all__ = ["Algorithm", "ByteGradAlgorithm", "DecentralizedAlgorithm", "GradientAllReduceAlgorithm",
           "LowPrecisionDecentralizedAlgorithm", "QAdamAlgorithm", "as_algorithm"]
