"""Asynchronous model average: after a warm-up of gradient allreduce, the
weights of every rank are averaged by a background loop (in the engine, on
its own clone of the group) while each rank trains at its own pace.
``abort(model)`` stops it with the same weights on every rank; ``resume(model)``
restarts it."""

from __future__ import annotations

import numbers

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm, AlgorithmImpl

NEW, RUNNING, STOPPED = "new", "running", "stopped"


def _ddp_of(model):
    """The BaguaDistributedDataParallel of a wrapped module, of a
    ``bagua_torch.DistributedDataParallel`` or itself."""
    from bagua_torch.distributed import BaguaDistributedDataParallel

    if isinstance(model, BaguaDistributedDataParallel):
        return model
    inner = getattr(model, "inner", None)
    if isinstance(inner, BaguaDistributedDataParallel):
        return inner
    ddp = getattr(model, "__dict__", {}).get("bagua_ddp")
    if ddp is None:
        raise TypeError(
            f"expected a model wrapped with with_bagua(...) or bagua_torch.DistributedDataParallel, "
            f"got {type(model).__name__}"
        )
    return ddp


class AsyncModelAverageAlgorithm(Algorithm):
    """Asynchronous model average.

    The loop starts at the first training forward after the warm-up. Every
    rank must call :meth:`abort` when training stops (before evaluation,
    checkpointing or exit) and :meth:`resume` before training again. Needs
    ``do_flatten=True``. Module buffers (BatchNorm statistics) are not
    broadcast before each forward once the loop runs (that would make every
    rank wait for the slowest); :meth:`abort` broadcasts rank 0's.
    """

    core_type = core.AsyncModelAverage

    def reify(self, process_group) -> "AsyncModelAverageImpl":
        return AsyncModelAverageImpl(self, process_group)

    def abort(self, model) -> None:
        """Stops the background averaging of ``model`` (every rank calls it):
        returns once every rank did, after a last round that leaves every
        rank with the same weights. Idempotent. Raises ``CommTimeoutError``
        when some rank did not call it within the timeout (BAGUA_TIMEOUT);
        the averaging then goes on: call it again on every rank."""
        _ddp_of(model).impl.abort()

    def resume(self, model) -> None:
        """Restarts the background averaging of ``model`` after :meth:`abort`
        (every rank calls it). Idempotent."""
        _ddp_of(model).impl.resume()


class AsyncModelAverageImpl(AlgorithmImpl):
    """The run of asynchronous model average on one wrapped model: the engine
    plan of the warm-up (``plan``), the background plan, the training-step
    counter and the background loop (:class:`bagua_core.averager.AsyncAverager`,
    set by the driver)."""

    def __init__(self, algorithm, process_group):
        super().__init__(algorithm, process_group)
        self.plan = self.description.warmup_plan()
        self.background_plan = self.description.plan()
        self.warmup_steps = self.description.warmup_steps
        self.forward_steps = 0
        self.status = NEW
        self.averager = None
        self.after_abort = None  # the driver's: buffers broadcast once the loop stopped

    @property
    def step(self) -> int:
        return self.forward_steps

    @property
    def in_warmup(self) -> bool:
        return self.forward_steps < self.warmup_steps

    def before_forward(self) -> None:
        """A training forward: starts the loop at the first one after the
        warm-up, then holds the weights until the optimizer step ends."""
        if not self.in_warmup:
            if self.status == NEW:
                self.averager.start()
                self.status = RUNNING
            self.averager.lock()
        self.forward_steps += 1

    # model.bagua_algorithm.abort(model), as Bagua 0.9 scripts call it
    def abort(self, model=None) -> None:
        if self.status == RUNNING:
            self.averager.abort()
            self.status = STOPPED
            if self.after_abort is not None:
                self.after_abort()

    def resume(self, model=None) -> None:
        if self.status == STOPPED:
            self.averager.start()
            self.status = RUNNING

    def close(self) -> None:
        if self.averager is not None:
            self.averager.close()

    def state_dict(self) -> dict:
        return {"step": self.forward_steps}

    def load_state_dict(self, state: dict) -> None:
        name = type(self.algorithm).__name__
        if sorted(state) != ["step"]:
            raise ValueError(f"{name} state needs exactly the keys ['step'], got {sorted(state)}")
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise ValueError(f"{name} state: 'step' must be an int >= 0, got {step!r}")
        if self.status != NEW and step < self.warmup_steps:
            raise ValueError(
                f"{name} state: the background averaging has started; cannot go back into the "
                f"warm-up (step {step} < warmup_steps {self.warmup_steps})"
            )
        self.forward_steps = int(step)
