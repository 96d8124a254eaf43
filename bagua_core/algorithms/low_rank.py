"""Low-rank compressed gradient averaging: PowerSGD (Vogels et al. 2019) as
torch's ``powerSGD_hook`` runs it, one power iteration per step with warm
start and error feedback (``csrc/ops/low_rank.h``)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Iterable, Sequence

from bagua_core.algorithms._base import GRADIENTS, Plan, check_bool, check_int, register


def _check_decimal(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"LowRank: {name} must be a float, got {value!r}")
    if not (math.isfinite(float(value)) and float(value) >= 0.0):
        raise ValueError(f"LowRank: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


@register
@dataclasses.dataclass(frozen=True)
class LowRank:
    """Gradients averaged through rank-``rank`` approximations.

    Each gradient of two or more dimensions is the matrix M of ``shape[0]``
    rows; it is compressed, with rank ``min(rank, rows, columns)`` as torch
    caps it, when ``(rows + columns) * rank * min_compression_rate < rows *
    columns``; 1-D tensors and matrices that do not pass travel uncompressed
    (mean). For the compressed ones each step makes one power iteration: ``P =
    M Q`` (summed over ranks, orthogonalised), ``Q = M^T P`` (averaged), and
    the gradient becomes ``P Q^T``. Q is kept between steps (``warm_start``;
    its first value is a seeded function of ``seed``, equal on every rank),
    and with ``error_feedback`` each rank adds what compression lost to its
    next gradient. Orthogonalisation and P, Q are float32 also for 16-bit
    gradients.

    The state per bucket (checkpointed): the error memory (the bucket's size,
    float32, float64 for float64 gradients; none without ``error_feedback``)
    and every compressed matrix's Q (columns x rank). Wrapping a model
    raises ValueError when ``rank`` exceeds the smaller side of every matrix
    of the model: no tensor could be compressed at that rank.

    Equal settings as torch's ``PowerSGDState(matrix_approximation_rank=rank,
    start_powerSGD_iter=start_iter, min_compression_rate=...,
    orthogonalization_epsilon=..., use_error_feedback=error_feedback,
    warm_start=warm_start)`` give the same numbers up to float rounding when
    the hook starts from the same Q.

    Args:
        rank: rank of the approximation of each matrix (torch's
            ``matrix_approximation_rank``; capped per matrix as torch does).
        start_iter: steps of uncompressed allreduce first (torch's
            ``start_powerSGD_iter``, same default).
        min_compression_rate: a matrix is compressed only when it shrinks by
            more than this factor.
        orthogonalization_epsilon: added to each column's norm when
            orthogonalising.
        error_feedback: add what compression lost to the next gradient.
        warm_start: keep Q between steps (else a fresh seeded Q every step).
        seed: the seed of the initial Q (equal on every rank).
    """

    rank: int = 4
    start_iter: int = 1000
    min_compression_rate: float = 2.0
    orthogonalization_epsilon: float = 0.0
    error_feedback: bool = True
    warm_start: bool = True
    seed: int = 0

    name = "low_rank"
    # what a live job's members take on a membership change (docs/fault-tolerance.md's table)
    on_membership_change = (
        "Live. The model and optimizer state are common; rank 0's `Q` and error-feedback memory become every member's."
    )

    def __post_init__(self):
        object.__setattr__(self, "rank", check_int("LowRank", "rank", self.rank, 1))
        object.__setattr__(self, "start_iter", check_int("LowRank", "start_iter", self.start_iter, 0))
        object.__setattr__(self, "seed", check_int("LowRank", "seed", self.seed, 0))
        object.__setattr__(
            self, "min_compression_rate", _check_decimal("min_compression_rate", self.min_compression_rate)
        )
        object.__setattr__(
            self,
            "orthogonalization_epsilon",
            _check_decimal("orthogonalization_epsilon", self.orthogonalization_epsilon),
        )
        check_bool("LowRank", "error_feedback", self.error_feedback)
        check_bool("LowRank", "warm_start", self.warm_start)

    def plan(self) -> Plan:
        return Plan(
            step="low_rank",
            params={
                "rank": self.rank,
                "start_iter": self.start_iter,
                "min_compression_rate": repr(self.min_compression_rate),
                "orthogonalization_epsilon": repr(self.orthogonalization_epsilon),
                "error_feedback": self.error_feedback,
                "warm_start": self.warm_start,
                "seed": self.seed,
            },
            communicates=GRADIENTS,
            counts_steps=True,
        )

    def check_tensors(self, shapes: Iterable[Sequence[int]]) -> None:
        """Raises ValueError when ``rank`` exceeds the smaller side of every
        matrix (tensor of two or more dimensions) among ``shapes``."""
        sides = []
        for shape in shapes:
            shape = tuple(int(d) for d in shape)
            if len(shape) >= 2 and math.prod(shape) > 0:
                sides.append(min(shape[0], math.prod(shape) // shape[0]))
        if sides and self.rank > max(sides):
            raise ValueError(
                f"LowRank: rank {self.rank} is larger than the smaller side of every matrix of the "
                f"model (the largest is {max(sides)}), so no gradient would be compressed at that "
                f"rank; choose rank <= {max(sides)}"
            )
