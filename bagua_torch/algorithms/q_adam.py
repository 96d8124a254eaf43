"""QAdam: :class:`QAdamOptimizer` (Adam whose moments freeze after a warm-up)
and :class:`QAdamAlgorithm`, which communicates its gradients during the
warm-up and its compressed momentum afterwards."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm


class QAdamOptimizer(torch.optim.Optimizer):
    """Adam for QAdam. Optimizer step ``t`` (1-based): ``g = grad + weight_decay
    * param``; while ``t < warmup_steps`` the moments update as Adam's
    (``exp_avg``, ``exp_avg_sq``); from ``t = warmup_steps`` on they are left
    as they are (wrapped with :class:`QAdamAlgorithm`, the engine updates
    ``exp_avg`` with the local gradient and averages it, compressed; the
    parameters it does not communicate, such as MoE experts, update their
    ``exp_avg`` from their own gradient, uncompressed); then
    ``param -= lr / (1 - beta1^t) * exp_avg / (sqrt(exp_avg_sq) / sqrt(1 - beta2^t) + eps)``.
    With ``warmup_steps`` beyond the number of steps it is Adam."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        warmup_steps: int = 100,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas must be a pair of floats, got {betas!r}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps <= 0:
            raise ValueError(f"Invalid warmup_steps parameter, must be an int larger than 0: {warmup_steps!r}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, warmup_steps=warmup_steps, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        # set by with_bagua: the buffers (storage addresses) of the momentum its engine updates
        # after the warm-up; parameters it does not communicate (MoE experts) update theirs here
        self.momentum_by_engine: Optional[set] = None

    def step_id(self) -> int:
        """Steps taken so far (``state["step"]`` of the first parameter)."""
        for group in self.param_groups:
            for p in group["params"]:
                return int(self.state[p]["step"]) if "step" in self.state[p] else 0
        return 0

    def init_state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps, wd, warmup = group["lr"], group["eps"], group["weight_decay"], group["warmup_steps"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.init_state(p)
                state["step"] += 1
                t = state["step"]
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                if t < warmup:
                    g = p.grad.add(p, alpha=wd) if wd != 0 else p.grad
                    exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
                    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                elif (
                    self.momentum_by_engine is not None
                    and exp_avg.untyped_storage().data_ptr() not in self.momentum_by_engine
                ):
                    exp_avg.mul_(beta1).add_(p.grad, alpha=1 - beta1)  # what the engine does, uncompressed
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**t))
        return loss


class QAdamAlgorithm(Algorithm):
    """QAdam's communication for ``q_adam_optimizer`` (the one optimizer passed
    to ``with_bagua``): gradients allreduced while ``t < warmup_steps``, then
    the momentum (``exp_avg``, shared with the engine) updated with the local
    gradient and averaged with MinMaxUInt8 compression.

    Args:
        q_adam_optimizer: a :class:`QAdamOptimizer`; its ``warmup_steps`` and
            first beta are the algorithm's.
    """

    core_type = core.QAdam
    derived_fields = ("warmup_steps", "beta1")  # the optimizer's

    def __init__(self, q_adam_optimizer: QAdamOptimizer, **fields):
        if not isinstance(q_adam_optimizer, QAdamOptimizer):
            raise TypeError(f"QAdamAlgorithm needs a QAdamOptimizer, got {type(q_adam_optimizer).__name__}")
        groups = q_adam_optimizer.param_groups
        for key in ("warmup_steps", "betas"):
            if any(g[key] != groups[0][key] for g in groups):
                raise ValueError(f"QAdamAlgorithm: every parameter group of the optimizer must share {key}")
        self.optimizer = q_adam_optimizer
        super().__init__(warmup_steps=groups[0]["warmup_steps"], beta1=float(groups[0]["betas"][0]), **fields)

    @classmethod
    def from_description(cls, description):
        raise TypeError("QAdam needs its optimizer: pass QAdamAlgorithm(q_adam_optimizer), not a description")

    def __repr__(self) -> str:
        return f"QAdamAlgorithm(q_adam_optimizer=<QAdamOptimizer>, hierarchical={self._description.hierarchical!r})"
