"""Training that goes on, step by step, while replicas are lost or join:
per-step fault tolerance on :mod:`bagua_core.live` (torchft's Lighthouse).

::

    live = bagua_torch.live.LiveTraining(model, [optimizer], GradientAllReduceAlgorithm())
    while live.step < total_steps:
        with live.attempt():
            x, y = batch(live.step, live.rank, live.world_size)
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    live.close()

Each attempt first asks the Lighthouse who trains. When the membership changed
(a replica lost or joined) or a member's last attempt failed, every member
closes its wrapper, joins the rebuilt world group and wraps again, taking
rank 0's parameters, buffers, optimizer state (the wrap's broadcast),
algorithm state, step and ``state()`` (over Bagua's own transport, not from a
file); rank 0 is a member at the highest committed step, so a replica that
(re)starts heals from a peer and the others do not restart. A peer lost
inside the attempt (``PeerError``, ``CommTimeoutError``) ends the attempt
without raising: the step is not counted (``live.step`` stays) and the next
attempt, on the new membership, runs it again. ``max_failures`` failed
attempts in a row raise the last error; any other error propagates at once.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Union

import torch

import bagua_core
from bagua_core.live import Agreement, LiveLoop


class LiveTraining(LiveLoop):
    """``model.with_bagua(optimizers, algorithm)`` on a membership that
    changes while training (see the module docstring).

    ``state`` / ``load_state``: what else a healing replica takes from rank 0
    (e.g. an LR scheduler's or a sampler's state); ``lighthouse``,
    ``replica_id``, ``timeout_s``: :class:`bagua_core.live.Membership`'s;
    ``wrap``: more keyword arguments of ``with_bagua``. Attributes and
    ``attempt()``: :class:`bagua_core.live.LiveLoop`'s.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]],
        algorithm: Any,
        *,
        state: Optional[Callable[[], Any]] = None,
        load_state: Optional[Callable[[Any], None]] = None,
        lighthouse: Optional[str] = None,
        replica_id: Optional[str] = None,
        timeout_s: Optional[float] = None,
        max_failures: int = 3,
        wrap: Optional[dict] = None,
    ):
        if (state is None) != (load_state is None):
            raise ValueError("state and load_state go together: give both or neither")
        self.model = model
        self.optimizers: List[torch.optim.Optimizer] = (
            [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
        )
        self.algorithm = algorithm
        self._state, self._load_state = state, load_state
        self._wrap = dict(wrap or {})
        super().__init__(lighthouse=lighthouse, replica_id=replica_id, timeout_s=timeout_s, max_failures=max_failures)

    def _before_rebuild(self, agreement: Agreement) -> Any:
        ddp = self.model.__dict__.pop("bagua_ddp", None)
        saved = None
        if ddp is not None:
            if agreement.rank == 0:
                try:
                    saved = ddp.state_dict()
                except bagua_core.BaguaError:
                    saved = None  # the engine broke with its state: everyone starts the algorithm afresh
            ddp.close()
        return saved

    def _after_rebuild(self, agreement: Agreement, kept: Any) -> None:
        payload = None
        if agreement.rank == 0:
            payload = {"step": self.step, "algorithm": kept, "state": self._state() if self._state else None}
        payload = bagua_core.broadcast_object(payload, 0)
        if agreement.rank != 0 and self._load_state is not None:
            self._load_state(payload["state"])
        self.step = payload["step"]
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)  # a failed attempt's gradients are not this step's
        # wrapping broadcasts rank 0's parameters, buffers and optimizer state: the heal's bulk
        self.model.with_bagua(self.optimizers, self.algorithm, **self._wrap)
        if payload["algorithm"] is not None:
            self.model.bagua_ddp.load_state_dict(payload["algorithm"])

    def close(self) -> None:
        """Unwraps the model, leaves the membership and closes the group."""
        ddp = self.model.__dict__.pop("bagua_ddp", None)
        if ddp is not None:
            ddp.close()
        super().close()
