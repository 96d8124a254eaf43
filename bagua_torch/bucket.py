"""``model.bagua_buckets``: the engine's buckets of a wrapped model, seen from torch.

A :class:`BaguaBucket` is the engine's :class:`bagua_core.engine.Bucket` (its
layout: ``name``, ``tensor_names``, ``numel``, ``flat_view()``, ...) with what
Bagua 0.9.2's ``BaguaBucket`` offered on top, as torch tensors: its tensors
and, for the algorithms that keep them, the peer weights. Every tensor here is
a zero-copy view of engine memory: read it between training steps (the engine
writes it while a step runs), and copy it to keep a value.
"""

from __future__ import annotations

from typing import List

import torch

from bagua_core.engine import Bucket

__all__ = ["BaguaBucket"]

# What each engine step keeps per bucket, for the errors of the attributes below.
_KEEPS = {
    "decentralized": "the peer-averaged weights (_peer_weight)",
    "low_precision_decentralized": "replicas of its own and its ring neighbours' weights (_weight, "
    "_left_peer_weight, _right_peer_weight)",
    "qadam": "the momentum, which is the optimizer's exp_avg",
    "low_rank": "its error memory and Q matrices (the wrapper's state_dict() holds them)",
}
_REPLICAS = {"_weight": 0, "_left_peer_weight": 1, "_right_peer_weight": 2}  # rows W, L, R of the step's state


class BaguaBucket(Bucket):
    """One bucket of a wrapped model (``model.bagua_buckets[i]``, in
    communication order).

    Attributes:
        name: the bucket's name (``"0"``, ``"1"``, ...: its position).
        tensors: the parameters whose gradients (gradient algorithms) or
            weights (weight algorithms) the bucket carries, in layout order
            (``tensor_names`` are their names), as in Bagua 0.9.2, where a
            bucket's tensors were the parameters.
    """

    def __init__(self, bucket: Bucket, op, tensors: List[torch.Tensor], algorithm_name: str, step: str):
        super().__init__(bucket.engine, bucket.index, bucket._core)
        self.tensors = list(tensors)
        self._op = op
        self._algorithm_name = algorithm_name
        self._step = step

    def flattened_tensor(self) -> torch.Tensor:
        """The bucket's memory as one 1-D tensor (padding included): the
        gradients or weights it communicates, back to back. A view, where
        Bagua 0.9.2 returned a copy."""
        return torch.from_dlpack(self.flat_view())

    def _missing(self, attr: str) -> AttributeError:
        keeps = _KEEPS.get(self._step, "no state per bucket")
        if self._step == "bytegrad" and self._op is not None and self._op.num_state:
            keeps = "its quantisation residual (error_feedback; in state_dict() as bagua.step_state.<i>)"
        return AttributeError(f"bucket {self.name!r} has no {attr}: {self._algorithm_name} keeps {keeps}")

    @property
    def _peer_weight(self) -> torch.Tensor:
        """DecentralizedAlgorithm: the average of the peers' weights computed
        by the last communicating step (the weights at the start of that
        step's forward; the bucket's layout, flattened), which then replaced
        this rank's weights before the optimizer step."""
        if self._op is None or not self._op.has_result:
            raise self._missing("_peer_weight")
        return torch.from_dlpack(self._op.result_view())

    def _replica(self, attr: str) -> torch.Tensor:
        if self._op is None or self._step != "low_precision_decentralized":
            raise self._missing(attr)
        return torch.from_dlpack(self._op.state_view())[_REPLICAS[attr]]

    @property
    def _weight(self) -> torch.Tensor:
        """LowPrecisionDecentralizedAlgorithm: this rank's replica of its own
        weights (flattened, the bucket's layout), which its ring neighbours
        replicate exactly. With ``hierarchical=True`` only node leaders keep
        replicas up to date (the ring runs among them)."""
        return self._replica("_weight")

    @property
    def _left_peer_weight(self) -> torch.Tensor:
        """LowPrecisionDecentralizedAlgorithm: the replica of the left ring
        neighbour's ``_weight`` (rank ``(r - 1) % n``)."""
        return self._replica("_left_peer_weight")

    @property
    def _right_peer_weight(self) -> torch.Tensor:
        """LowPrecisionDecentralizedAlgorithm: the replica of the right ring
        neighbour's ``_weight`` (rank ``(r + 1) % n``)."""
        return self._replica("_right_peer_weight")

    def __repr__(self) -> str:
        return (
            f"<BaguaBucket #{self.index} '{self.name}' {self.dtype.name} numel={self.numel} "
            f"tensors={len(self.tensors)}>"
        )
