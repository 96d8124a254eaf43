"""``bagua.torch_api.model_parallel.moe.sharded_moe``: the gate and the expert-parallel layer
(:mod:`bagua_torch.moe.gating`, :mod:`bagua_torch.moe.layer`), with Bagua 0.9.2's
signatures for the gating functions."""

from __future__ import annotations

from typing import Optional

import torch

from bagua_torch.moe import gating
from bagua_torch.moe.gating import TopKGate
from bagua_torch.moe.layer import MOELayer


def top1gating(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    used_token: Optional[torch.Tensor] = None,
    noisy_gate_policy: Optional[str] = None,
):
    """(l_aux, combine_weights, dispatch_mask, exp_counts) of top-1 gating."""
    cap = gating.capacity(logits.shape[0], logits.shape[1], 1, capacity_factor, min_capacity)
    routing = logits + gating.gumbel(logits.shape, logits.device) if noisy_gate_policy == "RSample" else None
    return tuple(gating.top1gating(logits, cap, used_token, routing_logits=routing))


def top2gating(logits: torch.Tensor, capacity_factor: float):
    """(l_aux, combine_weights, dispatch_mask, exp_counts) of top-2 gating."""
    cap = gating.capacity(logits.shape[0], logits.shape[1], 2, capacity_factor, 0)
    return tuple(gating.top2gating(logits, cap))


__all__ = ["MOELayer", "TopKGate", "top1gating", "top2gating"]
