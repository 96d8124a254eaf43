"""Low-precision decentralized SGD: after the optimizer step, weights move
towards the ring neighbours' average with 8-bit compressed differences."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class LowPrecisionDecentralizedAlgorithm(Algorithm):
    """Decentralized SGD on a ring with MinMaxUInt8-compressed differences,
    run after ``optimizer.step()``. Its replicas of the neighbours' weights are
    checkpointed by ``bagua_ddp.state_dict()``."""

    core_type = core.LowPrecisionDecentralized
