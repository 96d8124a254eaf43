"""One wrapped model's autotuning across its ranks: who decides, when, and how
every rank learns the decision.

Rank 0 runs the :class:`~bagua_core.autotune.tuner.Tuner`; the others only
follow. Every ``BAGUA_AUTOTUNE_INTERVAL_STEPS`` steps (a *decision point*,
at the start of a step, before its forward) rank 0 publishes in the store,
under ``<prefix>/decision/<n>`` for the n-th decision point::

    {"step": S, "previous": P0, "plan": {"id": P, "bucket_bytes": B, "order": [...]} or null,
     "completed": bool}

meaning "plan P replaces plan P0 from step S" (``plan`` null: keep the current
one). Every rank reads it at its own n-th decision point, checks that it is at
step S and runs plan P0, applies plan P, and acknowledges under
``<prefix>/ack/<n>/<rank>``; rank 0 checks those acknowledgements at the next
decision point. A rank that disagrees (another step, another plan, another
interval) raises :class:`AutotuneMismatchError` naming both sides, rather
than training with buckets that pair the wrong tensors. After the
``completed`` decision nobody consults the store any more.

``order`` lists tensor positions (in the declaration order the session was
built with) sorted by when rank 0 saw them become ready in the last step;
every rank then plans buckets of ``bucket_bytes`` over that order with
:func:`bagua_core.engine.plan_buckets`, which gives the same buckets
everywhere. When the tuner goes back to the default plan (to measure it
against its candidate, or to keep it), ``order`` is null: the default is
exactly the plan training started with.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

from bagua_core import config, log
from bagua_core.autotune.tuner import Tuner
from bagua_core.errors import MismatchError


class AutotuneMismatchError(MismatchError):
    """Ranks disagree about the autotuned bucket plan or the step it starts at."""


class Plan(NamedTuple):
    id: int
    bucket_bytes: int
    order: Optional[Tuple[int, ...]]  # positions in declaration order; None: declaration order


def log_path(model: str) -> str:
    """Where rank 0 writes the autotune log of ``model`` (BAGUA_IS_OUTPUT_AUTOTUNE_LOG)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
    return os.path.join(tempfile.gettempdir(), f"bagua_autotune_{safe}.log")


class AutotuneSession:
    """``decls``: ``(name, numel, dtype)`` of the communicated tensors, in the
    order the default plan uses; ``store``: the job's store (None when alone);
    ``prefix``: a store key prefix equal on every rank and unique to this
    model (e.g. the engine's group name)."""

    def __init__(
        self,
        decls: Sequence[Tuple[str, int, object]],
        default_bucket_bytes: int,
        store,
        prefix: str,
        rank: int,
        world_size: int,
        model: str,
        settings: Optional[config.Settings] = None,
        planner: Optional[Callable] = None,
    ):
        from bagua_core.engine import plan_buckets

        s = settings or config.load()
        self.decls = list(decls)
        self.names = [d[0] for d in self.decls]
        self.store = store
        self.prefix = f"bagua_autotune/{prefix}"
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.model = model
        self.interval = s.autotune_interval_steps
        self.timeout_s = s.timeout_s
        self.plan = Plan(0, int(default_bucket_bytes), None)
        self.completed = False
        self.switches: List[Tuple[int, Plan]] = []  # (step, plan) applied here
        self._planner = planner or plan_buckets
        self._decisions = 0
        self._last_time: Optional[float] = None
        self._last_step: Optional[int] = None
        self._order: Optional[Tuple[int, ...]] = None
        self.tuner: Optional[Tuner] = None
        self.log_path: Optional[str] = None
        if self.rank == 0:
            self.log_path = log_path(model) if s.autotune_log else None
            payload = sum(int(n) * _itemsize(d) for _, n, d in self.decls)
            self.tuner = Tuner(
                default_bucket_bytes,
                payload,
                s.autotune_max_samples,
                s.autotune_warmup_time_s,
                s.autotune_sampling_confidence_time_s,
                self._partition,
                self.log_path,
                confirm_pairs=s.autotune_confirm_pairs,
            )

    # ---- plans ----
    def buckets(self, plan: Optional[Plan] = None) -> List[List[str]]:
        """The tensor names of each bucket of ``plan`` (default: the current one)."""
        plan = plan or self.plan
        order = plan.order if plan.order is not None else range(len(self.decls))
        return self._planner([self.decls[i] for i in order], plan.bucket_bytes)

    def ordered_decls(self, plan: Optional[Plan] = None) -> list:
        plan = plan or self.plan
        order = plan.order if plan.order is not None else range(len(self.decls))
        return [self.decls[i] for i in order]

    def _partition(self, bucket_bytes: int) -> tuple:
        return tuple(tuple(b) for b in self.buckets(Plan(-1, bucket_bytes, self._order)))

    # ---- the step hook ----
    def on_step_start(self, step: int, ready_order: Callable[[], Sequence[str]]) -> Optional[Plan]:
        """Called by every rank at the start of each communicating step
        (``step`` = steps completed so far, equal on every rank). Returns the
        plan to switch to before this step runs, or None."""
        if self.completed:
            return None
        now = time.monotonic()
        if self.tuner is not None:
            if self._last_step is None:
                self.tuner.started(now)
            elif self._last_time is not None and self._last_step == step - 1:
                self.tuner.observe_step(now - self._last_time)
            self._last_time, self._last_step = now, step
        if step == 0 or step % self.interval:
            return None
        n = self._decisions
        self._decisions += 1
        if self.rank == 0:
            message = self._decide(n, step, now, ready_order)
        else:
            message = self._read(n, step)
        plan = message["plan"]
        self.completed = bool(message["completed"])
        if plan is None:
            return None
        new = Plan(
            int(plan["id"]),
            int(plan["bucket_bytes"]),
            None if plan["order"] is None else tuple(int(i) for i in plan["order"]),
        )
        self.plan = new
        self.switches.append((step, new))
        log.logger.info(
            "autotune %s: plan %d (buckets of %d bytes, %d bucket(s)) from step %d%s",
            self.model,
            new.id,
            new.bucket_bytes,
            len(self.buckets(new)),
            step,
            " (final)" if self.completed else "",
        )
        if self.tuner is not None:
            self._last_time = None  # this step re-buckets: not a step of either plan
        return new

    def _key(self, what: str, n: int, rank: Optional[int] = None) -> str:
        return f"{self.prefix}/{what}/{n}" + ("" if rank is None else f"/{rank}")

    def _decide(self, n: int, step: int, now: float, ready_order) -> dict:
        if self.store is not None and n > 0:
            self._check_acks(n - 1)
        size = self.tuner.decide(now, step)
        if self.tuner.completed and not self.completed and self.tuner.verdict is not None:  # just settled
            v = self.tuner.verdict
            log.logger.info(
                "autotune %s: %s %d-byte buckets: %s",
                self.model,
                "switches to" if v.switched else "keeps the default plan, not",
                v.candidate_bytes,
                v.reason,
            )
        plan = None
        if size is not None:
            if self._order is None:
                position = {name: i for i, name in enumerate(self.names)}
                self._order = tuple(position[name] for name in ready_order() if name in position)
                if len(self._order) != len(self.names):
                    self._order = None  # readiness unknown: keep the declaration order
            # the default plan, when the tuner goes back to it, is exactly the plan training started with
            order = None if self.tuner.current_is_default or self._order is None else list(self._order)
            plan = {"id": self.tuner.current_id, "bucket_bytes": size, "order": order}
        message = {"step": step, "previous": self.plan.id, "plan": plan, "completed": self.tuner.completed}
        if self.store is not None:
            self.store.set(self._key("decision", n), json.dumps(message).encode())
        return message

    def _read(self, n: int, step: int) -> dict:
        raw = self.store.get(self._key("decision", n), self.timeout_s)
        message = json.loads(raw.decode())
        if message["step"] != step or message["previous"] != self.plan.id:
            raise AutotuneMismatchError(
                f"autotune of {self.model}: rank 0's decision #{n} switches from plan {message['previous']} at "
                f"step {message['step']}, but rank {self.rank} runs plan {self.plan.id} at step {step} (every "
                "rank must run the same steps with the same BAGUA_AUTOTUNE_INTERVAL_STEPS)"
            )
        new_id = message["plan"]["id"] if message["plan"] else self.plan.id
        ack = {"step": step, "plan": new_id}
        self.store.set(self._key("ack", n, self.rank), json.dumps(ack).encode())
        return message

    def _check_acks(self, n: int) -> None:
        keys = [self._key("ack", n, r) for r in range(1, self.world_size)]
        self.store.wait(keys, self.timeout_s)
        for r, key in enumerate(keys, start=1):
            ack = json.loads(self.store.get(key, self.timeout_s).decode())
            if ack["plan"] != self.plan.id:
                raise AutotuneMismatchError(
                    f"autotune of {self.model}: rank {r} reports plan {ack['plan']} at step {ack['step']} after "
                    f"decision #{n}, but rank 0 runs plan {self.plan.id}"
                )


_ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}


def _itemsize(dtype) -> int:
    from bagua_core.dtypes import as_dtype

    return _ITEMSIZE[as_dtype(dtype).name]
