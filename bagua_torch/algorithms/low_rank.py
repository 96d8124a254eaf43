"""Low-rank compressed gradient averaging (PowerSGD, as torch's
``powerSGD_hook``): gradients travel as rank-r factors P and Q."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class LowRankAlgorithm(Algorithm):
    """PowerSGD gradient compression with warm start and error feedback (see
    :class:`bagua_core.algorithms.LowRank`); the error memory and the Q
    matrices are checkpointed by the wrapper's ``state_dict()``."""

    core_type = core.LowRank
