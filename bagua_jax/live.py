"""Training that goes on, step by step, while replicas are lost or join, in
JAX: per-step fault tolerance on :mod:`bagua_core.live` (torchft's
Lighthouse; nothing here imports torch).

::

    def build():  # on every rebuilt group: a transform bound to it and the step using it
        tx = optax.chain(bagua_jax.transform("gradient_allreduce"), optax.sgd(0.1))
        return tx, jax.jit(functools.partial(train_step, tx))

    live = bagua_jax.live.LiveTraining(build, init=lambda tx: (params, tx.init(params)))
    while live.step < total_steps:
        with live.attempt():
            live.state = live.step_fn(live.state, batch(live.step, live.rank, live.world_size))
    live.close()

Each attempt first asks the Lighthouse who trains. When the membership changed
or a member's last attempt failed, the jitted steps in flight are waited for,
the group is rebuilt, ``build()`` makes a new transform and step on it, and
every member takes rank 0's state and step (one pickled broadcast over
Bagua's transport; rank 0 is a member at the highest committed step). When
rank 0 has no state yet (the job's start), every member calls ``init(tx)``
(a collective: the transform checks the params on every rank). The attempt
waits for ``live.state`` to be computed before the step counts, so that a lost
peer surfaces inside it: then (a ``PeerError`` or ``CommTimeoutError``, or
JAX's runtime error carrying one) ``live.state`` goes back to the last
committed one, the attempt ends without raising and the step runs again on
the new membership. One device per process.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp

import bagua_core
from bagua_core.live import Agreement, LiveLoop
from bagua_jax import _compat

_LOST_PEER_NAMES = ("PeerError", "CommTimeoutError")


class LiveTraining(LiveLoop):
    """A JAX training loop on a membership that changes while training (see
    the module docstring).

    ``build()``: returns ``(tx, step_fn)`` for the current group; ``init(tx)``:
    the first state (any pytree). Attributes: ``tx``, ``step_fn``, ``state``,
    and :class:`bagua_core.live.LiveLoop`'s (``step``, ``rank``,
    ``world_size``, ``changes``, ``failures``).
    """

    def __init__(
        self,
        build: Callable[[], Tuple[Any, Callable[..., Any]]],
        init: Callable[[Any], Any],
        *,
        lighthouse: Optional[str] = None,
        replica_id: Optional[str] = None,
        timeout_s: Optional[float] = None,
        max_failures: int = 3,
    ):
        self._build, self._init = build, init
        self.tx: Any = None
        self.step_fn: Optional[Callable[..., Any]] = None
        self.state: Any = None
        self._committed: Any = None  # the state after the last step that counted
        super().__init__(lighthouse=lighthouse, replica_id=replica_id, timeout_s=timeout_s, max_failures=max_failures)

    def _lost_peer(self, error: BaseException) -> bool:
        if super()._lost_peer(error):
            return True
        return isinstance(error, jax.errors.JaxRuntimeError) and any(n in str(error) for n in _LOST_PEER_NAMES)

    def _finish_attempt(self) -> None:
        jax.block_until_ready(self.state)  # a failure of this step's collectives surfaces here, in the attempt
        self._committed = self.state

    def _failed_attempt(self) -> None:
        self.state = self._committed  # the failed step's outputs hold its error, not numbers

    def _before_rebuild(self, agreement: Agreement) -> Any:
        try:
            jax.effects_barrier()  # nothing of the old group's may still run when it closes
        except jax.errors.JaxRuntimeError:
            pass  # a step that failed with the lost peer; its attempt already counted the failure
        _compat.reset_effect_tokens()  # else the failed step's token hands its error to every later step
        return jax.device_get(self.state) if agreement.rank == 0 and self.state is not None else None

    def _after_rebuild(self, agreement: Agreement, kept: Any) -> None:
        payload = bagua_core.broadcast_object({"step": self.step, "state": kept} if agreement.rank == 0 else None, 0)
        self.step = payload["step"]
        self.tx, self.step_fn = self._build()
        if payload["state"] is None:
            self.state = self._init(self.tx)  # every member: rank 0 had none either
        else:
            self.state = jax.tree_util.tree_map(jnp.asarray, payload["state"])
        self._committed = self.state
