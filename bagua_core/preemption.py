"""``PreemptionGuard``: a preemption notice (SIGTERM) becomes a checkpoint
at the next step boundary, taken by every rank at the same step.

A signal arrives at each rank at its own moment, mid-step; saving there
would cut into the step's collectives. The guard only notes the signal;
``should_stop()``, called by every rank once per step, tells all of them
at once (one 8-byte allreduce over Bagua's world group; with
``every=N`` only every N-th call communicates). The loop then saves and
returns::

    guard = PreemptionGuard()
    for step in range(start, steps):
        train_step()
        if guard.should_stop():
            save_checkpoint(step + 1, path, model, optimizer)
            break

Framework-agnostic; ``bagua_torch.checkpoint`` exports it, and
``bagua_jax.checkpoint`` a subclass that first waits for the jitted steps in
flight (their collectives share the group).
"""

from __future__ import annotations

import signal
from typing import Dict, Sequence

import numpy as np

import bagua_core


class PreemptionGuard:
    def __init__(self, signals: Sequence[int] = (signal.SIGTERM,), every: int = 1):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        self.every = every
        self.requested = False  # this rank got the signal
        self._calls = 0
        self._previous: Dict[int, object] = {}
        for s in signals:
            self._previous[s] = signal.signal(s, self._note)

    def _note(self, signum, frame) -> None:
        self.requested = True

    def should_stop(self) -> bool:
        """True on every rank at the same call once any rank got the signal."""
        self._calls += 1
        if self._calls % self.every:
            return False
        if not bagua_core.is_initialized() or bagua_core.get_world_size() == 1:
            return self.requested
        from bagua_core import comm

        self._settle()

        flag = np.array([1 if self.requested else 0], dtype=np.int64)
        comm.allreduce_inplace(flag, op=comm.ReduceOp.MAX, group=bagua_core.get_default_group().control_group)
        return bool(flag[0])

    def _settle(self) -> None:
        """Waits for what must reach the group before the guard's collective."""

    def close(self) -> None:
        """Puts the previous signal handlers back."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
        self._previous = {}

    def __enter__(self) -> "PreemptionGuard":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
