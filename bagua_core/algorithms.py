"""Framework-neutral descriptions of Bagua's algorithms.

Each is a frozen dataclass holding an algorithm's hyperparameters, validated
when built (``TypeError`` for a wrong type, ``ValueError`` for a wrong value).
The frontends turn a description into hooks and engine ops:
``bagua_torch.algorithms`` accepts these (and converts its own classes to and
from them); the JAX frontend accepts them too, so one description gives the
same numbers in both frameworks.

What each algorithm communicates, and when:

* :class:`GradientAllReduce`: gradients, allreduced (mean or sum) bucket by
  bucket while backward runs.
* :class:`ByteGrad`: gradients, MinMaxUInt8-compressed scatter-reduce-gather
  (buckets padded to a multiple of the group size).
* :class:`Decentralized`: weights, averaged with peers ("all": everyone;
  "shift_one": one rotating partner) concurrently with forward/backward, the
  average replacing the weights before the optimizer step; every
  ``communication_interval`` steps.

``hierarchical=True`` communicates within each node first (to a node leader),
then among node leaders, then back within the node.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Union

PEER_SELECTION_MODES = ("all", "shift_one")


def _check_bool(cls: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{cls}: {name} must be a bool, got {value!r}")


@dataclasses.dataclass(frozen=True)
class GradientAllReduce:
    """Centralized full-precision gradient allreduce (mean when ``average``)."""

    hierarchical: bool = False
    average: bool = True

    name = "gradient_allreduce"

    def __post_init__(self):
        _check_bool("GradientAllReduce", "hierarchical", self.hierarchical)
        _check_bool("GradientAllReduce", "average", self.average)


@dataclasses.dataclass(frozen=True)
class ByteGrad:
    """Centralized gradient averaging with MinMaxUInt8 compression (8 bits per
    element on the wire; each element is quantised twice)."""

    hierarchical: bool = True
    average: bool = True

    name = "bytegrad"

    def __post_init__(self):
        _check_bool("ByteGrad", "hierarchical", self.hierarchical)
        _check_bool("ByteGrad", "average", self.average)


@dataclasses.dataclass(frozen=True)
class Decentralized:
    """Decentralized SGD: weights averaged with peers every
    ``communication_interval`` steps. ``shift_one`` pairs peers, so it needs an
    even number of them (processes, or nodes when ``hierarchical``)."""

    hierarchical: bool = True
    peer_selection_mode: str = "all"
    communication_interval: int = 1

    name = "decentralized"

    def __post_init__(self):
        _check_bool("Decentralized", "hierarchical", self.hierarchical)
        if not isinstance(self.peer_selection_mode, str):
            raise TypeError(f"Decentralized: peer_selection_mode must be a str, got {self.peer_selection_mode!r}")
        if self.peer_selection_mode not in PEER_SELECTION_MODES:
            raise ValueError(
                f"Decentralized: unknown peer_selection_mode {self.peer_selection_mode!r} "
                f"(use one of {', '.join(PEER_SELECTION_MODES)})"
            )
        interval = self.communication_interval
        if isinstance(interval, bool):
            raise TypeError(f"Decentralized: communication_interval must be an int, got {interval!r}")
        try:
            interval = operator.index(interval)
        except TypeError:
            raise TypeError(f"Decentralized: communication_interval must be an int, got {interval!r}") from None
        if interval < 1:
            raise ValueError(f"Decentralized: communication_interval must be >= 1, got {interval}")
        object.__setattr__(self, "communication_interval", int(interval))

    def check_peers(self, peers: int) -> None:
        """Raises ValueError when ``shift_one`` cannot pair ``peers`` peers (the
        group size, or the number of nodes when hierarchical)."""
        if self.peer_selection_mode == "shift_one" and peers % 2:
            where = (" nodes (hierarchical mode exchanges between nodes: use an even node count, "
                     "or hierarchical=False)") if self.hierarchical else " processes"
            raise ValueError(
                f"Decentralized: peer_selection_mode='shift_one' pairs peers, so it needs an even "
                f"number of them; got {peers}{where}"
            )


AlgorithmDescription = Union[GradientAllReduce, ByteGrad, Decentralized]

_BY_NAME = {cls.name: cls for cls in (GradientAllReduce, ByteGrad, Decentralized)}


def by_name(name: str, **hyperparameters) -> AlgorithmDescription:
    """The description called ``name`` ("gradient_allreduce", "bytegrad",
    "decentralized"), built from ``hyperparameters``."""
    try:
        cls = _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(sorted(_BY_NAME))}") from None
    return cls(**hyperparameters)


def names():
    return sorted(_BY_NAME)
