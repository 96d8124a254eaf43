"""Low-rank compressed gradient averaging (PowerSGD, as torch's
``powerSGD_hook``): gradients travel as rank-r factors P and Q."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class LowRankAlgorithm(Algorithm):
    """PowerSGD gradient compression with warm start and error feedback (see
    :class:`bagua_core.algorithms.LowRank`); the error memory and the Q
    matrices are checkpointed by the wrapper's ``state_dict()``.

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

    core_type = core.LowRank

    def __init__(self, rank: int = 4, start_iter: int = 1000, min_compression_rate: float = 2.0,
                 orthogonalization_epsilon: float = 0.0, error_feedback: bool = True, warm_start: bool = True,
                 seed: int = 0):
        super().__init__(rank=rank, start_iter=start_iter, min_compression_rate=min_compression_rate,
                         orthogonalization_epsilon=orthogonalization_epsilon, error_feedback=error_feedback,
                         warm_start=warm_start, seed=seed)
