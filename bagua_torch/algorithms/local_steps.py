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
    are checkpointed with the wrapper's state.

    Args:
        sync_interval: optimizer steps between synchronisations (H).
        outer_lr: the outer SGD's learning rate (1 with ``outer_momentum=0``:
            plain weight averaging).
        outer_momentum: the outer SGD's momentum, in [0, 1).
        nesterov: Nesterov momentum for the outer step.
        warmup_steps: the first steps average the weights after every
            optimizer step.
        hierarchical: average within each node first.
        compression: ``"none"``, or ``"minmax_uint8"``: the pseudo-gradient
            is averaged 8-bit compressed (ByteGrad's scatter-reduce-gather);
            the warm-up averages stay uncompressed.
        error_feedback: with compression, each rank's residual of its own
            quantisation is added to its next pseudo-gradient (one more copy
            of the weights' memory).
    """

    core_type = core.LocalSteps

    def __init__(self, sync_interval: int = 8, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True, warmup_steps: int = 0, hierarchical: bool = False, compression: str = "none",
                 error_feedback: bool = False):
        super().__init__(sync_interval=sync_interval, outer_lr=outer_lr, outer_momentum=outer_momentum,
                         nesterov=nesterov, warmup_steps=warmup_steps, hierarchical=hierarchical,
                         compression=compression, error_feedback=error_feedback)
