"""The base of a frontend's algorithm classes (``bagua_torch.algorithms``,
``bagua_jax.algorithms``): the original class names and defaults over the
descriptions of this package, so both frontends derive their registries from
one list and never repeat a default or a check.

A frontend defines one base class with its own ``_registry = {}``; each
subclass sets ``core_type`` (the description dataclass) and is registered
under the description's name.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List

from bagua_core.algorithms._base import is_description


# Bagua 0.9's registered names. One not built here yet raises NotImplementedError
# from init(), so that a script written for Bagua 0.9 learns what is missing.
ORIGINAL_NAMES = ("gradient_allreduce", "bytegrad", "decentralized", "low_precision_decentralized", "qadam",
                  "async")


class FrontendAlgorithm:
    """An algorithm under its original name: its constructor arguments are the
    description's fields, validated by the description."""

    core_type: type = None
    _registry: Dict[str, type] = None  # set by each frontend's base class
    frontend = "bagua"  # module shown in error messages, e.g. "bagua_torch.algorithms"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.core_type is None:
            return
        if cls._registry is None:
            raise TypeError(f"{cls.__name__}: its frontend base class must define _registry = {{}}")
        name = cls.core_type.name
        if name in cls._registry:
            raise ValueError(f"an algorithm named {name!r} is already registered ({cls._registry[name].__name__})")
        cls._registry[name] = cls

    def __init__(self, **hyperparameters):
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
    def from_core(cls, description) -> "FrontendAlgorithm":
        """This frontend's algorithm for a :mod:`bagua_core.algorithms` description."""
        for algo_cls in cls._registry.values():
            if type(description) is algo_cls.core_type:
                return algo_cls.from_description(description)
        raise TypeError(f"no {cls.frontend} algorithm for {description!r}")

    @classmethod
    def from_description(cls, description) -> "FrontendAlgorithm":
        """This class built from its own description's fields; algorithms that
        need more than the description (QAdam: its optimizer) refuse."""
        return cls(**dataclasses.asdict(description))

    @classmethod
    def init(cls, name: str, **hyperparameters) -> "FrontendAlgorithm":
        """The algorithm registered as ``name`` (see :meth:`registered`)."""
        try:
            algo_cls = cls._registry[name]
        except KeyError:
            if name in ORIGINAL_NAMES:
                raise NotImplementedError(
                    f"algorithm {name!r} of Bagua 0.9 is not built in this Bagua yet; available: "
                    f"{', '.join(sorted(cls._registry))}") from None
            raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(sorted(cls._registry))}") from None
        return algo_cls(**hyperparameters)

    @classmethod
    def registered(cls) -> List[str]:
        return sorted(cls._registry)

    @classmethod
    def coerce(cls, algorithm, *, accept_names: bool) -> "FrontendAlgorithm":
        """An instance of this frontend's algorithms from an instance, a
        description or (with ``accept_names``) a registered name."""
        if isinstance(algorithm, cls):
            return algorithm
        if is_description(algorithm):
            return cls.from_core(algorithm)
        if isinstance(algorithm, type):
            raise TypeError(f"algorithm must be an instance: pass {algorithm.__name__}(), not the class")
        if isinstance(algorithm, str):
            if accept_names:
                return cls.init(algorithm)
            raise TypeError(f"algorithm must be a {cls.frontend}.Algorithm, got the string {algorithm!r}; "
                            f"use Algorithm.init({algorithm!r}, ...) to build one by name")
        accepted = [f"a {cls.frontend}.Algorithm (e.g. GradientAllReduceAlgorithm())",
                    "a bagua_core.algorithms description"]
        if accept_names:
            accepted.append(f"one of the names {', '.join(cls.registered())}")
        accepted = ", ".join(accepted[:-1]) + " or " + accepted[-1]
        raise TypeError(f"algorithm must be {accepted}; got {type(algorithm).__name__}")

    def __eq__(self, other):
        return type(self) is type(other) and self._description == other._description

    def __hash__(self):
        return hash((type(self), self._description))

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self._description, f.name)!r}"
                           for f in dataclasses.fields(self._description))
        return f"{type(self).__name__}({fields})"
