"""The phase of a plan (:mod:`bagua_core.algorithms`: when in a training step
the engine gets its tensors) as a small driver of the wrapper
(:class:`bagua_torch.distributed.BaguaDistributedDataParallel`): each driver
says what the wrapper's hooks do at forward start, per ready gradient, at
backward's end and after the optimizer step, and how a weight plan's results
go back into the weights. The wrapper picks its driver when it takes a plan
(at wrap time; asynchronous model average again when it leaves its warm-up
for the background loop), so the hooks do not branch on the phase.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from bagua_core.algorithms import AFTER_OPTIMIZER_STEP, BACKWARD, FORWARD_START
from bagua_torch import _optimizers

if TYPE_CHECKING:
    from bagua_torch.distributed import BaguaDistributedDataParallel


class PhaseDriver:
    """A phase in which nothing is communicated at any of these points."""

    broadcasts_buffers = True  # each training forward broadcasts rank 0's buffers

    def check_optimizers(self, ddp: "BaguaDistributedDataParallel") -> None:
        """At wrap time: what the phase requires of the optimizers."""

    def forward_start(self, ddp: "BaguaDistributedDataParallel") -> None:
        """A training forward starts (gradients attached, buffers broadcast)."""

    def gradient_ready(self, ddp: "BaguaDistributedDataParallel", name: str) -> None:
        """Backward accumulated the gradient of ``name``."""

    def backward_end(self, ddp: "BaguaDistributedDataParallel") -> List[str]:
        """Backward ended: the parameters that got no gradient and are not allowed to."""
        return []

    def before_optimizer_step(self, ddp: "BaguaDistributedDataParallel") -> None:
        """A wrapped optimizer is about to step (the wrapper is open)."""

    def after_optimizer_step(self, ddp: "BaguaDistributedDataParallel") -> None:
        """A wrapped optimizer stepped (the wrapper is open, outside no_sync())."""

    def apply_weights(self, ddp: "BaguaDistributedDataParallel") -> None:
        """After engine.wait() of a weight plan: the steps copy their results
        back into the weights' slots, then into the weights torch uses."""
        stream = ddp._stream()
        copied = [op.copy_back(stream) for op in ddp.impl.ops]
        if any(copied):
            ddp.copy_slots_to_weights()


class BackwardDriver(PhaseDriver):
    """:data:`BACKWARD`: each gradient goes to the engine as backward
    produces it (its bucket communicates while backward still runs); the
    step ends with backward."""

    def gradient_ready(self, ddp: "BaguaDistributedDataParallel", name: str) -> None:
        ddp.mark_gradient_ready(name)

    def backward_end(self, ddp: "BaguaDistributedDataParallel") -> List[str]:
        return ddp.mark_unused_gradients_ready()


class ForwardStartDriver(PhaseDriver):
    """:data:`FORWARD_START` (Decentralized): the weights go to the engine as
    forward starts; the step averages a copy on the comm thread while
    forward and backward read them, and its results are applied after
    backward."""

    def forward_start(self, ddp: "BaguaDistributedDataParallel") -> None:
        ddp.copy_weights_to_slots()
        ddp.engine.mark_all_ready(ddp._stream())
        ddp.step_pending = True


class AfterOptimizerStepDriver(PhaseDriver):
    """:data:`AFTER_OPTIMIZER_STEP` (low-precision decentralized, local
    steps): the updated weights go to the engine after each step of the one
    optimizer, which waits for them; the step decides whether this step
    communicates."""

    def check_optimizers(self, ddp: "BaguaDistributedDataParallel") -> None:
        _optimizers.check_one_optimizer_updates_all(ddp)

    def after_optimizer_step(self, ddp: "BaguaDistributedDataParallel") -> None:
        ddp.copy_weights_to_slots()
        ddp.engine.mark_all_ready(ddp._stream())
        ddp.step_pending = True
        ddp.finish_step()

    def apply_weights(self, ddp: "BaguaDistributedDataParallel") -> None:
        # in place on the weights' slots
        if any(op.last_communicated for op in ddp.impl.ops):
            ddp.copy_slots_to_weights()


class BackgroundDriver(PhaseDriver):
    """Asynchronous model average after its warm-up: a background loop
    averages the weights (bagua_core.averager), so the engine gets nothing
    and no buffers are broadcast per step (a collective per step would make
    every rank wait for the slowest; they are broadcast at abort); the
    weights are held during each optimizer step, which never sees half an
    average."""

    broadcasts_buffers = False

    def before_optimizer_step(self, ddp: "BaguaDistributedDataParallel") -> None:
        ddp.averager.lock()


_AT_WRAP = {BACKWARD: BackwardDriver, FORWARD_START: ForwardStartDriver, AFTER_OPTIMIZER_STEP: AfterOptimizerStepDriver}


def for_plan(plan, algorithm) -> PhaseDriver:
    """The driver of ``plan``'s phase; NotImplementedError for a phase the
    wrapper cannot start with."""
    driver = _AT_WRAP.get(plan.phase)
    if driver is None:
        raise NotImplementedError(f"{algorithm!r}: phase {plan.phase!r} is not supported yet")
    return driver()
