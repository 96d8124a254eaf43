"""The experts one rank holds: ``num_local_experts`` independent copies of
the user's expert module, their parameters marked ``expert = True`` (and
``allreduce = False``, DeepSpeed's mark) so that data-parallel wrappers
leave them alone: each rank trains its own experts."""

from __future__ import annotations

import copy

import torch


def is_moe_param(param: torch.Tensor) -> bool:
    """True for the parameters of an MoE layer's experts (Bagua 0.9.2's test)."""
    return bool(getattr(param, "expert", False))


class Experts(torch.nn.Module):
    def __init__(self, expert: torch.nn.Module, num_local_experts: int = 1):
        super().__init__()
        self.bagua_experts = torch.nn.ModuleList([copy.deepcopy(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for e in self.bagua_experts:
            for p in e.parameters():
                p.expert = True  # type: ignore[attr-defined]
                p.allreduce = False  # type: ignore[attr-defined]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """``inputs`` [ranks, local experts, capacity, model dim]: local expert
        j processes slice j of dimension 1 (an expert returning a tuple gives
        its first element, as in Bagua 0.9.2)."""
        outputs = []
        for chunk, expert in zip(inputs.chunk(self.num_local_experts, dim=1), self.bagua_experts):
            out = expert(chunk)
            outputs.append(out[0] if isinstance(out, tuple) else out)
        return torch.cat(outputs, dim=1)
