"""Mixture of experts with expert parallelism (Bagua 0.9.2's ``model_parallel.moe``):
:class:`MoE`, its gate and experts, and :func:`is_moe_param`. Checkpoints of
models holding MoE layers use Bagua 0.9's per-expert files
(:mod:`bagua_torch.checkpoint`)."""

from bagua_torch.moe.experts import Experts, is_moe_param
from bagua_torch.moe.gating import TopKGate, top1gating, top2gating
from bagua_torch.moe.layer import MoE, MOELayer

__all__ = ["MoE", "MOELayer", "TopKGate", "Experts", "top1gating", "top2gating", "is_moe_param"]
