"""What every algorithm description shares: the plan, the registry of names,
and the checks of hyperparameter types."""

from __future__ import annotations

import dataclasses
import operator
from typing import Dict, Mapping, Optional, Tuple, Union

# Phases of a training step in which a plan's tensors travel.
BACKWARD = "backward"  # each tensor as backward produces it; the step ends with backward
FORWARD_START = "forward_start"  # all at once when forward starts; results applied after backward
AFTER_OPTIMIZER_STEP = "after_optimizer_step"
BACKGROUND = "background"  # by a background loop while training runs (asynchronous model average)

GRADIENTS = "gradients"
WEIGHTS = "weights"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a frontend does with an algorithm.

    Attributes:
      step: name of the engine step (``bagua_core.algorithm_steps.names()``).
      params: the step's parameters (bool, int or str values).
      communicates: ``"gradients"`` or ``"weights"``.
      phase: :data:`BACKWARD`, :data:`FORWARD_START`, :data:`AFTER_OPTIMIZER_STEP`
        or :data:`BACKGROUND`.
      one_bucket_per_dtype: all tensors of a dtype in one bucket (weights),
        else buckets of ``BAGUA_BUCKET_SIZE`` bytes in backward order.
      counts_steps: the step number decides what happens (communication
        interval, rotating peers), so it is algorithm state to checkpoint.
      optimizer_state: the name of the optimizer's per-parameter state the
        step's state holds (QAdam: ``"exp_avg"``, the momentum); the frontend
        makes the optimizer and the step share it. None: the step's state, if
        any, is the algorithm's own.
    """

    step: str
    params: Mapping[str, Union[bool, int, str]]
    communicates: str = GRADIENTS
    phase: str = BACKWARD
    one_bucket_per_dtype: bool = False
    counts_steps: bool = False
    optimizer_state: Optional[str] = None

    @property
    def state_per_rank(self) -> bool:
        """The ranks' state differs between exchanges: weights averaged only
        now and then (with the optimizer state that moved them) or an
        error-feedback residual. A torch checkpoint then keeps every rank's."""
        return self.communicates == WEIGHTS or self.params.get("error_feedback") is True

    def params_text(self) -> str:
        """The parameters as the engine's ``key=value;...`` form."""

        def text(v):
            return ("true" if v else "false") if isinstance(v, bool) else str(v)

        return ";".join(f"{k}={text(v)}" for k, v in sorted(self.params.items()))


_BY_NAME: Dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: makes a description known by its ``name``."""
    if cls.name in _BY_NAME:
        raise ValueError(f"an algorithm named {cls.name!r} is already registered")
    _BY_NAME[cls.name] = cls
    return cls


def description_type(name: str) -> type:
    """The description class registered as ``name`` (see :func:`names`)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(names())}") from None


def by_name(name: str, **hyperparameters):
    """The description called ``name`` (see :func:`names`), built from ``hyperparameters``."""
    return description_type(name)(**hyperparameters)


def names() -> Tuple[str, ...]:
    """The registered algorithms' names, sorted: the one list of algorithms,
    from which the frontends derive theirs."""
    return tuple(sorted(_BY_NAME))


def is_description(value) -> bool:
    return type(value) in _BY_NAME.values()


def as_description(algorithm):
    """A description from a description or a registered name."""
    if is_description(algorithm):
        return algorithm
    if isinstance(algorithm, str):
        return by_name(algorithm)
    if isinstance(algorithm, type) and algorithm in _BY_NAME.values():
        raise TypeError(f"pass an instance, e.g. {algorithm.__name__}(), not the class")
    raise TypeError(
        f"expected a bagua_core.algorithms description (e.g. ByteGrad()) or one of the names "
        f"{', '.join(names())}; got {type(algorithm).__name__}"
    )


def check_tensors(description, shapes) -> None:
    """Checks the shapes of the tensors a frontend will communicate against
    the description's constraints (``description.check_tensors``, where it
    has one; LowRank: its rank); ValueError naming the problem. Every frontend
    calls it when it binds an algorithm to a model."""
    check = getattr(description, "check_tensors", None)
    if check is not None:
        check([tuple(s) for s in shapes])


def check_bool(cls: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{cls}: {name} must be a bool, got {value!r}")


def check_int(cls: str, name: str, value, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{cls}: {name} must be an int, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{cls}: {name} must be an int, got {value!r}") from None
    if value < minimum:
        raise ValueError(f"{cls}: {name} must be >= {minimum}, got {value}")
    return int(value)


def check_choice(cls: str, name: str, value, choices: Tuple[str, ...]) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{cls}: {name} must be a str, got {value!r}")
    if value not in choices:
        raise ValueError(f"{cls}: unknown {name} {value!r} (use one of {', '.join(choices)})")
