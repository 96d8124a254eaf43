"""Decentralized SGD: weights averaged with peers concurrently with forward and
backward; the average replaces the weights before the optimizer step, which
then applies the local gradient: x_{t+1} = avg(x_t) - lr * g(x_t)."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class DecentralizedAlgorithm(Algorithm):
    """Decentralized synchronous SGD, full precision."""

    core_type = core.Decentralized
