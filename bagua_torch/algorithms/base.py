"""The torch side of an algorithm: which tensors it communicates, how they are
bucketed, which engine ops run on a bucket, and what the training hooks do.

An :class:`Algorithm` is a description (hyperparameters, convertible to and
from :mod:`bagua_core.algorithms`); ``reify(process_group)`` gives the
:class:`AlgorithmImpl` bound to one wrapped model. The wrapper
(:class:`bagua_torch.distributed.BaguaDistributedDataParallel`) calls the
impl's hooks; the engine does all communication and arithmetic.

The default impl communicates gradients: each gradient is marked ready by its
post-accumulate-grad hook (so buckets communicate while backward runs) and the
step is finished (``engine.wait()``) at the end of backward.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict, List, Type

from bagua_core.engine import Bucket, Engine

if TYPE_CHECKING:  # pragma: no cover
    from bagua_torch.distributed import BaguaDistributedDataParallel

_REGISTRY: Dict[str, Type["Algorithm"]] = {}


class Algorithm:
    """Base of the torch algorithms. Subclasses set ``core_type`` (the
    :mod:`bagua_core.algorithms` dataclass) and ``impl_type``; their
    constructor arguments are the description's fields."""

    core_type: type = None
    impl_type: type = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.core_type is not None:
            name = cls.core_type.name
            if name in _REGISTRY:
                raise ValueError(f"an algorithm named {name!r} is already registered ({_REGISTRY[name].__name__})")
            _REGISTRY[name] = cls

    def __init__(self, **hyperparameters):
        # Validated by the framework-neutral description.
        self._description = self.core_type(**hyperparameters)

    def __getattr__(self, name):
        # hyperparameters read through the description (algo.hierarchical, ...)
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return getattr(self.__dict__["_description"], name)
        except (KeyError, AttributeError):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}") from None

    @property
    def name(self) -> str:
        return self.core_type.name

    def to_core(self):
        """The framework-neutral :mod:`bagua_core.algorithms` description."""
        return self._description

    @classmethod
    def from_core(cls, description) -> "Algorithm":
        """The torch algorithm for a :mod:`bagua_core.algorithms` description."""
        for algo_cls in _REGISTRY.values():
            if type(description) is algo_cls.core_type:
                return algo_cls(**dataclasses.asdict(description))
        raise TypeError(f"no torch algorithm for {description!r}")

    @staticmethod
    def init(name: str, **hyperparameters) -> "Algorithm":
        """The algorithm registered as ``name`` ("gradient_allreduce",
        "bytegrad", "decentralized")."""
        try:
            cls = _REGISTRY[name]
        except KeyError:
            raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(sorted(_REGISTRY))}") from None
        return cls(**hyperparameters)

    def reify(self, process_group) -> "AlgorithmImpl":
        return self.impl_type(self, process_group)

    def __eq__(self, other):
        return type(self) is type(other) and self._description == other._description

    def __hash__(self):
        return hash((type(self), self._description))

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self._description, f.name)!r}"
                           for f in dataclasses.fields(self._description))
        return f"{type(self).__name__}({fields})"


def as_algorithm(algorithm) -> Algorithm:
    """Accepts a torch :class:`Algorithm` or a :mod:`bagua_core.algorithms` description."""
    if isinstance(algorithm, Algorithm):
        return algorithm
    if any(type(algorithm) is cls.core_type for cls in _REGISTRY.values()):
        return Algorithm.from_core(algorithm)
    raise TypeError(
        f"algorithm must be a bagua_torch.algorithms.Algorithm (e.g. GradientAllReduceAlgorithm()) or a "
        f"bagua_core.algorithms description, got {type(algorithm).__name__}"
    )


def registered() -> List[str]:
    return sorted(_REGISTRY)


class AlgorithmImpl:
    """An algorithm bound to a process group and one wrapped model."""

    # "gradients": buckets hold parameter gradients; "weights": the parameters.
    communicates = "gradients"

    def __init__(self, algorithm: Algorithm, process_group):
        self.algorithm = algorithm
        self.description = algorithm.to_core()
        self.process_group = process_group

    @property
    def hierarchical(self) -> bool:
        return self.description.hierarchical

    def check(self) -> None:
        """Raises for settings the group cannot run, before anything is sent.
        Runs on every rank, so every rank raises alike."""

    # ---- buckets ----
    def bucket_alignment(self) -> int:
        return 1

    def one_bucket_per_dtype(self) -> bool:
        """All tensors of a dtype in one bucket (weights), else the size plan."""
        return False

    def make_engine(self) -> Engine:
        return Engine.for_group(self.process_group, hierarchical=self.hierarchical)

    def append_ops(self, bucket: Bucket) -> None:
        raise NotImplementedError

    # ---- hooks ----
    def on_forward_start(self, ddp: "BaguaDistributedDataParallel") -> None:
        """Training forward (grad enabled, not in no_sync)."""

    def on_gradient_ready(self, ddp: "BaguaDistributedDataParallel", name: str) -> None:
        ddp.mark_gradient_ready(name)

    def on_backward_end(self, ddp: "BaguaDistributedDataParallel") -> None:
        missing = ddp.mark_unused_gradients_ready()
        ddp.finish_step()
        ddp.check_unused(missing)

    def after_wait(self, ddp: "BaguaDistributedDataParallel") -> None:
        """After engine.wait(): results into the tensors torch uses."""
        ddp.copy_slots_to_gradients()
