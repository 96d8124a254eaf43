"""Local steps with an outer optimizer (local SGD / DiLoCo)."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class LocalStepsAlgorithm(Algorithm):
    """Each rank runs its optimizer (any torch optimizer) ``sync_interval``
    steps on its own, communicating nothing; then the weights' movement since
    the last synchronisation is averaged over the ranks and applied to the
    common anchor by an outer SGD with (Nesterov) momentum, in the engine.
    The anchor and the outer momentum (and the residual of error feedback)
    are checkpointed with the wrapper's state."""

    core_type = core.LocalSteps
