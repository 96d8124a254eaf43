"""Bagua's algorithms for JAX, under the original names and defaults (the
same classes as ``bagua_torch.algorithms``; arguments, defaults, their docs
and checks come from the :mod:`bagua_core.algorithms` descriptions). Pass one
to :func:`bagua_jax.transform`; a description or a registered name
(``"bytegrad"``, ...) works too. There is one class per registered
description; ``__all__`` lists them from that registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bagua_core import algorithms as core
from bagua_core.algorithms.frontend import FrontendAlgorithm


class Algorithm(FrontendAlgorithm):
    """Base of the JAX algorithms; ``Algorithm.init(name, **kwargs)`` builds one by name."""

    _classes: dict = {}
    frontend = "bagua_jax.algorithms"


class GradientAllReduceAlgorithm(Algorithm):
    """Gradients allreduced (mean, or sum with ``average=False``): a gradient
    algorithm, before the optimizer in the chain."""

    core_type = core.GradientAllReduce


class ByteGradAlgorithm(Algorithm):
    """Gradients averaged with MinMaxUInt8 compression (8-bit
    scatter-reduce-gather): a gradient algorithm, before the optimizer in the
    chain. The residual of ``error_feedback`` lives in the transform's state
    (``BaguaState.step_state``), zero after ``init``."""

    core_type = core.ByteGrad


class HalfGradAlgorithm(Algorithm):
    """Gradients averaged over a 16-bit wire (float16 or bfloat16), summed in
    float32: a gradient algorithm, before the optimizer in the chain."""

    core_type = core.HalfGrad


class DecentralizedAlgorithm(Algorithm):
    """Decentralized SGD: weights averaged with peers ("all", or one rotating
    partner with "shift_one") every ``communication_interval`` steps. A weight
    algorithm: it goes *after* the optimizer in the chain and needs ``params``."""

    core_type = core.Decentralized


class LowPrecisionDecentralizedAlgorithm(Algorithm):
    """Low-precision decentralized SGD: after the optimizer step, weights move
    towards the ring neighbours' average with MinMaxUInt8-compressed
    differences, every ``communication_interval`` steps. A weight algorithm of
    the after-optimizer phase: it goes *after* the optimizer in the chain and
    needs ``params``; its replicas live in the transform's state."""

    core_type = core.LowPrecisionDecentralized


class LocalStepsAlgorithm(Algorithm):
    """Local steps with an outer optimizer (local SGD / DiLoCo): each rank
    runs its optax chain ``sync_interval`` steps on its own; then the
    weights' movement since the last synchronisation is averaged and applied
    to the common anchor by an outer SGD with (Nesterov) momentum. A weight
    algorithm of the after-optimizer phase: it goes *after* the optimizer in
    the chain and needs ``params``; the anchor, the outer momentum and the
    residual of ``error_feedback`` live in the transform's state."""

    core_type = core.LocalSteps


class LowRankAlgorithm(Algorithm):
    """Low-rank compressed gradient averaging (PowerSGD, as torch's
    ``powerSGD_hook``; see :class:`bagua_core.algorithms.LowRank`): a
    gradient algorithm, before the optimizer in the chain; its error memory
    and Q matrices live in the transform's state. Each leaf of two or more
    dimensions is the matrix of ``shape[0]`` rows: leaves in torch's layouts
    (a linear layer's weight ``(out, in)``) give the torch frontend's numbers."""

    core_type = core.LowRank


class QAdamAlgorithm(Algorithm):
    """QAdam's communication for ``q_adam_optimizer`` (what
    :func:`bagua_jax.qadam` returns): ``bagua_jax.transform(QAdamAlgorithm(tx))``
    is then the whole optimizer (communication and update; use it in place of
    ``tx``). Gradients are averaged while ``t < warmup_steps``, then the
    momentum is updated with the local gradient and averaged with MinMaxUInt8
    compression.

    Args:
        q_adam_optimizer: what :func:`bagua_jax.qadam` returns; its
            ``warmup_steps`` and ``b1`` are the algorithm's.
    """

    core_type = core.QAdam
    derived_fields = ("warmup_steps", "beta1")  # the optimizer's

    def __init__(self, q_adam_optimizer, **fields):
        from bagua_jax._src.qadam import hyperparameters_of

        hp = hyperparameters_of(q_adam_optimizer)
        self.optimizer = q_adam_optimizer
        super().__init__(warmup_steps=hp.warmup_steps, beta1=hp.b1, **fields)

    @classmethod
    def from_description(cls, description):
        raise TypeError("QAdam needs its optimizer: pass QAdamAlgorithm(bagua_jax.qadam(...)), not a description")

    def __repr__(self) -> str:
        return f"QAdamAlgorithm(q_adam_optimizer=<bagua_jax.qadam>, hierarchical={self._description.hierarchical!r})"


class AsyncModelAverageAlgorithm(Algorithm):
    """Asynchronous model average: after ``warmup_steps`` steps that average
    the optimizer's updates, a background loop averages every rank's weights
    every ``sync_interval_ms`` while each rank trains at its own pace. A
    weight algorithm: it goes *after* the optimizer in the chain, needs
    ``params``; its update runs eagerly or inside ``jax.jit`` (see
    ``bagua_jax._src.async_average``). ``init`` binds this object to the
    weights it is given (a later ``init`` rebinds it); every rank calls
    :meth:`abort` when training stops and :meth:`resume` before training
    again."""

    core_type = core.AsyncModelAverage

    def _bind(self, binding) -> None:
        old = self.__dict__.get("_binding")
        if old is not None:
            old.close()
        self.__dict__["_binding"] = binding

    def _binding_of(self, what: str):
        binding = self.__dict__.get("_binding")
        if binding is None:
            raise RuntimeError(f"{what}: call init(params) first")
        return binding

    def abort(self, params=None):
        """Stops the background averaging (every rank calls it) and returns the
        weights, averaged once more with training stopped everywhere: the same
        pytree on every rank. Idempotent. Waits for the training steps
        already dispatched first. ``params`` is accepted for symmetry with the
        torch ``abort(model)`` and not used."""
        binding = self._binding_of(f"{type(self).__name__}.abort")
        binding.settle()
        binding.averager.abort()  # a no-op unless the loop runs
        return binding.tree()

    def resume(self, params=None) -> None:
        """Restarts the background averaging after :meth:`abort` (every rank
        calls it), from ``params`` when given (the weights the next update
        gets; equal on every rank, e.g. what abort returned). Before the
        warm-up ended nothing restarts: the first step after it starts the
        loop."""
        binding = self._binding_of(f"{type(self).__name__}.resume")
        binding.settle()
        if params is not None:
            leaves = binding.leaves_of(params, f"{type(self).__name__}.resume")
            with binding.averager.weights_locked():
                binding.write(leaves)
        if binding.started:
            binding.averager.start()  # a no-op while it runs


def as_algorithm(algorithm) -> Algorithm:
    """A JAX algorithm from an instance, a ``bagua_core.algorithms`` description or a name."""
    return Algorithm.coerce(algorithm, accept_names=True)


if not TYPE_CHECKING:  # type checkers cannot read a computed __all__; without one they see every class
    __all__ = ["Algorithm", *Algorithm.classes(), "as_algorithm"]
