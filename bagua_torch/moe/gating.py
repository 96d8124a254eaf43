"""The gate of a mixture-of-experts layer: which expert(s) each token goes
to, at which slot of the expert's capacity, with which weight.

Contract (Bagua 0.9.2's, after DeepSpeed's MoE of 2021 and GShard):
``top1gating`` / ``top2gating`` take the gate's float32 logits ``[S, E]``
(S tokens, E experts in the whole job) and a capacity C (slots per expert
on this rank), and return ``(l_aux, combine_weights [S, E, C],
dispatch_mask [S, E, C], exp_counts [E])``:

- top-1: each token's expert is the argmax of its softmax (of the noisy
  logits with ``RSample``); an expert chosen by more than C tokens keeps C of
  them, drawn at random (``selection_noise``), the others are dropped (their
  output is zero); the weight is the token's softmax probability.
- top-2: the first expert as top-1; the second the argmax of the logits plus
  Gumbel noise with the first masked out; slots fill in token order, first
  choices before second ones, and a choice past the capacity is dropped; the
  two weights are renormalised to sum to one.
- ``l_aux`` = E * sum over experts of (mean gate probability) * (fraction of
  tokens whose first choice it is): the load-balancing loss. ``exp_counts``:
  first choices per expert, before dropping (a CPU int64 tensor).
- ``used_token`` (0/1 per token): tokens with 0 choose no expert.

The noise is passed in, so that a test can replay it; :class:`TopKGate` draws
it from torch's default generator.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F


class Gating(NamedTuple):
    l_aux: torch.Tensor
    combine_weights: torch.Tensor
    dispatch_mask: torch.Tensor
    exp_counts: torch.Tensor


def capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float, min_capacity: int) -> int:
    """Slots per expert: ceil(k * S / E * factor); top-1 raises it to ``min_capacity`` (as Bagua 0.9.2)."""
    c = math.ceil(k * num_tokens / num_experts * capacity_factor)
    return max(c, min_capacity) if k == 1 else c


def _used(mask: torch.Tensor, used_token: Optional[torch.Tensor]) -> torch.Tensor:
    if used_token is None:
        return mask
    if used_token.shape != mask.shape[:1]:
        raise ValueError(
            f"used_token must hold one value per token ({mask.shape[0]}), got shape {tuple(used_token.shape)}"
        )
    return mask * used_token.to(device=mask.device, dtype=mask.dtype).unsqueeze(1)


def _combine(weights: torch.Tensor, mask: torch.Tensor, slot: torch.Tensor, cap: int) -> torch.Tensor:
    """[S, E, C]: ``weights`` [S] of each token's choice ``mask`` [S, E] at its slot [S]."""
    slots = F.one_hot(slot, num_classes=cap).to(weights.dtype) if cap else weights.new_zeros(slot.shape[0], 0)
    return (weights.unsqueeze(1) * mask.to(weights.dtype)).unsqueeze(2) * slots.unsqueeze(1)


def top1gating(
    logits: torch.Tensor,
    cap: int,
    used_token: Optional[torch.Tensor] = None,
    selection_noise: Optional[torch.Tensor] = None,
    routing_logits: Optional[torch.Tensor] = None,
) -> Gating:
    """Top-1 gating (see the module doc). ``selection_noise`` [S, E] in [0, 1)
    picks the tokens an over-full expert keeps (default: uniform draws);
    ``routing_logits`` (RSample: logits plus Gumbel noise) choose the expert
    instead of the probabilities."""
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    choice = torch.argmax(gates if routing_logits is None else routing_logits, dim=1)
    mask = _used(F.one_hot(choice, num_classes=num_experts), used_token)
    exp_counts = mask.sum(dim=0).detach().to("cpu")
    l_aux = torch.sum(gates.mean(dim=0) * mask.float().mean(dim=0)) * num_experts
    if selection_noise is None:
        selection_noise = torch.rand(mask.shape, device=logits.device)
    # an over-full expert keeps the `cap` tokens of largest noise among those that chose it
    keep = torch.zeros_like(mask)
    if cap > 0 and num_tokens > 0:
        _, kept = torch.topk(mask * selection_noise, k=min(cap, num_tokens), dim=0)
        keep.scatter_(0, kept, 1)
    mask = mask * keep
    slot = ((torch.cumsum(mask, dim=0) - 1) * mask).sum(dim=1)
    weights = (gates * mask.float()).sum(dim=1)
    combine = _combine(weights, mask, slot, cap)
    return Gating(l_aux, combine, combine.bool(), exp_counts)


def top2gating(
    logits: torch.Tensor,
    cap: int,
    used_token: Optional[torch.Tensor] = None,
    second_noise: Optional[torch.Tensor] = None,
) -> Gating:
    """Top-2 gating (see the module doc). ``second_noise`` [S, E]: the Gumbel
    noise added to the logits to pick the second expert (default: drawn)."""
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    first = _used(F.one_hot(torch.argmax(gates, dim=1), num_classes=num_experts), used_token)
    if second_noise is None:
        second_noise = gumbel(logits.shape, logits.device)
    others = (logits + second_noise).masked_fill(first.bool(), float("-inf"))
    second = _used(F.one_hot(torch.argmax(others, dim=1), num_classes=num_experts), used_token)
    slot1 = torch.cumsum(first, dim=0) - 1
    slot2 = torch.cumsum(second, dim=0) - 1 + first.sum(dim=0, keepdim=True)  # after every first choice
    exp_counts = first.sum(dim=0).detach().to("cpu")
    l_aux = torch.mean(gates.mean(dim=0) * first.float().mean(dim=0)) * num_experts * num_experts
    first = first * (slot1 < cap)
    second = second * (slot2 < cap)
    w1 = (gates * first.float()).sum(dim=1)
    w2 = (gates * second.float()).sum(dim=1)
    denom = torch.clamp(w1 + w2, min=torch.finfo(w1.dtype).eps)
    combine = _combine(w1 / denom, first, (slot1 * first).sum(dim=1), cap) + _combine(
        w2 / denom, second, (slot2 * second).sum(dim=1), cap
    )
    return Gating(l_aux, combine, combine.bool(), exp_counts)


def gumbel(shape, device) -> torch.Tensor:
    u = torch.rand(shape, device=device)
    tiny = torch.finfo(u.dtype).tiny
    return -torch.log(-torch.log(u.clamp(min=tiny)).clamp(min=tiny))


NOISY_GATE_POLICIES = (None, "Jitter", "RSample")


class TopKGate(torch.nn.Module):
    """``wg`` (a bias-free float32 Linear from the model dimension to the E
    experts) and the gating above. ``noisy_gate_policy``: ``"Jitter"``
    multiplies the input by U(0.99, 1.01) in training, ``"RSample"`` routes
    top-1 by the logits plus Gumbel noise in training; None (or "None"): no
    noise. In eval mode ``eval_capacity_factor`` replaces ``capacity_factor``."""

    def __init__(
        self,
        model_dim: int,
        num_experts: int,
        k: int = 1,
        capacity_factor: float = 1.0,
        eval_capacity_factor: float = 1.0,
        min_capacity: int = 4,
        noisy_gate_policy: Optional[str] = None,
    ) -> None:
        super().__init__()
        if k not in (1, 2):
            raise ValueError(f"k must be 1 or 2 (top-1 or top-2 gating), got {k!r}")
        if noisy_gate_policy == "None":
            noisy_gate_policy = None
        if noisy_gate_policy not in NOISY_GATE_POLICIES:
            raise ValueError(f"noisy_gate_policy must be None, 'Jitter' or 'RSample', got {noisy_gate_policy!r}")
        self.wg = torch.nn.Linear(model_dim, num_experts, bias=False).float()
        self.k = k
        self.capacity_factor = float(capacity_factor)
        self.eval_capacity_factor = float(eval_capacity_factor)
        self.min_capacity = int(min_capacity)
        self.noisy_gate_policy = noisy_gate_policy

    def capacity(self, num_tokens: int) -> int:
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        return capacity(num_tokens, self.wg.out_features, self.k, factor, self.min_capacity)

    def forward(self, x: torch.Tensor, used_token: Optional[torch.Tensor] = None, cap: Optional[int] = None) -> Gating:
        """Gating of the tokens ``x`` [S, model_dim]; ``cap`` overrides the capacity
        (the layer passes the one every rank agreed on)."""
        if self.wg.weight.dtype != torch.float32:
            self.wg.float()
        x = x.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            x = x * torch.empty_like(x).uniform_(1.0 - 1e-2, 1.0 + 1e-2)
        logits = self.wg(x)
        if cap is None:
            cap = self.capacity(x.shape[0])
        if self.k == 1:
            routing = None
            if self.noisy_gate_policy == "RSample" and self.training:
                routing = logits + gumbel(logits.shape, logits.device)
            return top1gating(logits, cap, used_token, routing_logits=routing)
        return top2gating(logits, cap, used_token)
