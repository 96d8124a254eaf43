"""The torch side of an algorithm: its original name and defaults, and the
state of one wrapped model's run of it.

An :class:`Algorithm` is a description (hyperparameters; ``.to_core()`` gives
the framework-neutral :mod:`bagua_core.algorithms` description, whose plan says
what travels, when, and which engine step runs). ``reify(process_group)``
gives the :class:`AlgorithmImpl` of one wrapped model: the plan and the
engine's step ops. The generic driver (:mod:`bagua_torch.distributed`) runs
any plan; an algorithm class only carries its original name, and takes its
signature, defaults, argument docs and checks from its description
(:mod:`bagua_core.algorithms.frontend`).
"""

from __future__ import annotations

import numbers
from typing import List

from bagua_core.algorithms.frontend import FrontendAlgorithm


class Algorithm(FrontendAlgorithm):
    """Base of the torch algorithms. Subclasses set ``core_type`` (the
    :mod:`bagua_core.algorithms` dataclass); their constructor arguments are
    the description's fields, with its defaults."""

    _classes: dict = {}
    frontend = "bagua_torch.algorithms"

    def reify(self, process_group) -> "AlgorithmImpl":
        return AlgorithmImpl(self, process_group)


def as_algorithm(algorithm) -> Algorithm:
    """Accepts a torch :class:`Algorithm` or a :mod:`bagua_core.algorithms` description."""
    return Algorithm.coerce(algorithm, accept_names=False)


def registered() -> List[str]:
    """The registered algorithms' names (:func:`bagua_core.algorithms.names`)."""
    return Algorithm.registered()


class AlgorithmImpl:
    """An algorithm bound to a process group and one wrapped model: its plan
    (:class:`bagua_core.algorithms.Plan`) and the engine's step ops (one per
    bucket, set by the driver)."""

    def __init__(self, algorithm: Algorithm, process_group):
        self.algorithm = algorithm
        self.description = algorithm.to_core()
        self.plan = self.description.plan()
        self.process_group = process_group
        self.ops: list = []

    @property
    def step(self) -> int:
        """Training steps the engine's step has seen (its communication counter)."""
        return self.ops[0].step if self.ops else 0

    @property
    def keeps_state(self) -> bool:
        """Whether the engine's step keeps state spans (e.g. replicas)."""
        return any(op.num_state > 0 for op in self.ops)

    def _expected_keys(self) -> list:
        keys = ["step"] if self.plan.counts_steps else []
        return keys + (["step_state"] if self.keeps_state else [])

    # The step counter decides which steps communicate (communication_interval)
    # and, for shift_one, the partner: a resumed run must continue it. Steps
    # with state (low-precision decentralized's replicas) save it too, one
    # tensor of shape (num_state, bucket numel) per bucket.
    def state_dict(self) -> dict:
        """State a resumed run needs to continue exactly: the step counter
        as an int, the steps' state as torch tensors (copies)."""
        import torch

        state = {"step": self.step} if self.plan.counts_steps else {}
        if self.keeps_state:
            state["step_state"] = [torch.from_dlpack(op.state_view()).clone() for op in self.ops]
        return state

    def load_state_dict(self, state: dict) -> None:
        import torch

        name = type(self.algorithm).__name__
        expected = self._expected_keys()
        if not expected:
            if state:
                raise ValueError(f"{name} keeps no state, got {sorted(state)}")
            return
        if sorted(state) != sorted(expected):
            raise ValueError(f"{name} state needs exactly the keys {expected}, got {sorted(state)}")
        if self.keeps_state:
            saved = state["step_state"]
            if not isinstance(saved, (list, tuple)) or len(saved) != len(self.ops):
                raise ValueError(f"{name} state: 'step_state' must list one tensor per bucket ({len(self.ops)})")
            views = [torch.from_dlpack(op.state_view()) for op in self.ops]
            for i, (view, t) in enumerate(zip(views, saved)):
                if not isinstance(t, torch.Tensor) or t.shape != view.shape or t.dtype != view.dtype:
                    raise ValueError(
                        f"{name} state: 'step_state'[{i}] must be a {view.dtype} tensor of shape "
                        f"{tuple(view.shape)}, got {t!r:.80}"
                    )
            for view, t in zip(views, saved):
                view.copy_(t)
        if not self.plan.counts_steps:
            return
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise ValueError(f"{name} state: 'step' must be an int >= 0, got {step!r}")
        for op in self.ops:
            op.step = int(step)

    def __repr__(self) -> str:
        return f"<{self.algorithm!r} on {self.process_group!r}, step {self.step}>"
