"""``MoE``: a mixture-of-experts layer with its experts spread over the ranks
(expert parallelism), under Bagua 0.9.2's name and signature.

Contract: ``MoE(hidden_size, expert, num_local_experts=1, k=1, ...)`` holds
``num_local_experts`` copies of ``expert`` on each rank, so the job has
``num_experts = num_local_experts * world_size`` experts; rank r holds
experts ``r * num_local_experts + j``. ``forward(hidden_states,
used_token=None)`` returns ``(output, l_aux, exp_counts)``: the output has
the input's shape; each token is gated to its top-1 or top-2 experts (see
:mod:`bagua_torch.moe.gating`), travels to the rank holding the expert and
back with an all-to-all through Bagua's engine (Gloo on CPU, NCCL on GPU)
whose backward is the same all-to-all. Every rank must call forward (and
backward) in the same order: they are collectives over the world group.

The capacity (slots per expert) comes from each rank's token count; the
ranks agree on the largest with one small allreduce per forward, so ranks
with different batch sizes exchange chunks of one size. The layer's
configuration is checked to be the same on every rank at construction
(a collective): a rank that differs, or any invalid argument, gives every
rank a ValueError there, never a hang in the all-to-all.

Expert parameters carry ``expert = True``: ``with_bagua`` neither
broadcasts nor averages them, so their gradient is the sum, over every
rank's loss, of that loss's gradient (each token's gradient reaches its
expert once), while the other parameters' gradients are averaged.
``disable_alltoall=True`` skips the exchange (for measuring its cost): the
tokens for expert ``g * num_local_experts + j`` are then processed by this
rank's local expert j.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

import bagua_core
from bagua_core import agreement
from bagua_torch import communication as comm
from bagua_torch.moe.experts import Experts
from bagua_torch.moe.gating import NOISY_GATE_POLICIES, TopKGate


class _AllToAll(torch.autograd.Function):
    """Equal chunks of dimension 0, chunk j to rank j; its own adjoint."""

    @staticmethod
    def forward(ctx: Any, group, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        comm.alltoall(x, out, comm=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        return None, _AllToAll.apply(ctx.group, grad)


class MOELayer(torch.nn.Module):
    """Gate, dispatch, all-to-all, local experts, all-to-all, combine."""

    def __init__(
        self,
        gate: TopKGate,
        experts: Experts,
        num_local_experts: int,
        group=None,
        disable_alltoall: bool = False,
    ) -> None:
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.group = group
        self.world_size = 1 if group is None else group.size
        self.num_local_experts = num_local_experts
        self.disable_alltoall = bool(disable_alltoall)
        self.l_aux: Optional[torch.Tensor] = None
        self.exp_counts: Optional[torch.Tensor] = None

    def _exchanges(self) -> bool:
        return self.world_size > 1 and not self.disable_alltoall

    def _agreed_capacity(self, num_tokens: int) -> int:
        cap = self.gate.capacity(num_tokens)
        if self._exchanges():
            c = torch.tensor([cap], dtype=torch.int64)
            comm.allreduce_inplace(c, op=comm.ReduceOp.MAX, comm=self.group.control_group)
            cap = int(c.item())
        return cap

    def forward(self, hidden_states: torch.Tensor, used_token: Optional[torch.Tensor] = None) -> torch.Tensor:
        d_model = hidden_states.shape[-1]
        tokens = hidden_states.reshape(-1, d_model)
        gating = self.gate(tokens, used_token, self._agreed_capacity(tokens.shape[0]))
        self.l_aux, self.exp_counts = gating.l_aux, gating.exp_counts
        dispatched = torch.einsum("sec,sm->ecm", gating.dispatch_mask.type_as(tokens), tokens)
        if self._exchanges():
            dispatched = _AllToAll.apply(self.group, dispatched)
        # [experts of the job, C, M] -> [source rank, local expert, C, M]
        out = self.experts(dispatched.reshape(self.world_size, self.num_local_experts, -1, d_model))
        if self._exchanges():
            out = _AllToAll.apply(self.group, out)
        out = out.reshape(self.world_size * self.num_local_experts, -1, d_model)
        combined = torch.einsum("sec,ecm->sm", gating.combine_weights.type_as(tokens), out)
        return combined.reshape(hidden_states.shape)


def _check_arguments(hidden_size, expert, num_local_experts, k, output_dropout_prob, capacity_factor,
                     eval_capacity_factor, min_capacity, noisy_gate_policy) -> None:  # fmt: skip
    def whole(name, v, lowest):
        if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
            raise ValueError(f"MoE: {name} must be an integer >= {lowest}, got {v!r}")

    whole("hidden_size", hidden_size, 1)
    whole("num_local_experts", num_local_experts, 1)
    whole("min_capacity", min_capacity, 0)
    if not isinstance(expert, torch.nn.Module):
        raise ValueError(f"MoE: expert must be a torch.nn.Module, got {type(expert).__name__}")
    if k not in (1, 2) or isinstance(k, bool):
        raise ValueError(f"MoE: k must be 1 or 2 (top-1 or top-2 gating), got {k!r}")
    for name, v in (("capacity_factor", capacity_factor), ("eval_capacity_factor", eval_capacity_factor)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"MoE: {name} must be a number > 0, got {v!r}")
    if isinstance(output_dropout_prob, bool) or not isinstance(output_dropout_prob, (int, float)):
        raise ValueError(f"MoE: output_dropout_prob must be a number in [0, 1), got {output_dropout_prob!r}")
    if not 0 <= output_dropout_prob < 1:
        raise ValueError(f"MoE: output_dropout_prob must be in [0, 1), got {output_dropout_prob!r}")
    if noisy_gate_policy not in NOISY_GATE_POLICIES + ("None",):
        raise ValueError(f"MoE: noisy_gate_policy must be None, 'Jitter' or 'RSample', got {noisy_gate_policy!r}")
    _check_expert_shape(hidden_size, expert)


def _check_expert_shape(hidden_size: int, expert: torch.nn.Module) -> None:
    """Runs a copy of the expert on the meta device (no memory, no compute,
    no side effects): it must map [..., hidden_size] to [..., hidden_size]."""
    import copy

    try:
        probe = copy.deepcopy(expert).to("meta")
        out = probe(torch.empty(2, 1, 3, hidden_size, device="meta"))
    except NotImplementedError:
        return  # an operation without a meta kernel: the first forward will tell
    except (RuntimeError, ValueError, TypeError) as e:
        raise ValueError(f"MoE: the expert does not take inputs of hidden_size {hidden_size}: {e}") from None
    out = out[0] if isinstance(out, tuple) else out
    if not isinstance(out, torch.Tensor) or out.shape[-1] != hidden_size:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"MoE: the expert must map [..., {hidden_size}] to [..., {hidden_size}] (hidden_size), "
            f"it gives {got} for an input of shape (2, 1, 3, {hidden_size})"
        )


class MoE(torch.nn.Module):
    """A mixture-of-experts layer with experts sharded over the ranks (see the module doc).

    Args:
        hidden_size: the model dimension, the input's and output's last dimension.
        expert: the expert module (copied ``num_local_experts`` times on each rank).
        num_local_experts: experts per rank.
        k: 1 or 2, experts per token.
        output_dropout_prob: dropout on the output.
        capacity_factor, eval_capacity_factor: slots per expert, relative to an even share of the tokens.
        min_capacity: the least capacity of top-1 gating.
        noisy_gate_policy: None, ``"Jitter"`` or ``"RSample"``.
        disable_alltoall: skip the exchange (see the module doc).
    """

    def __init__(
        self,
        hidden_size: int,
        expert: torch.nn.Module,
        num_local_experts: int = 1,
        k: int = 1,
        output_dropout_prob: float = 0.0,
        capacity_factor: float = 1.0,
        eval_capacity_factor: float = 1.0,
        min_capacity: int = 4,
        noisy_gate_policy: Optional[str] = None,
        disable_alltoall: bool = False,
    ) -> None:
        super().__init__()
        world = bagua_core.get_world_size()
        if world > 1 and not bagua_core.is_initialized():
            raise RuntimeError("MoE in a job of several processes: call init_process_group() first")
        group = bagua_core.get_default_group() if bagua_core.is_initialized() else None
        arguments = (hidden_size, expert, num_local_experts, k, output_dropout_prob, capacity_factor,
                     eval_capacity_factor, min_capacity, noisy_gate_policy)  # fmt: skip
        error: Optional[ValueError] = None
        try:
            _check_arguments(*arguments)
        except ValueError as e:
            error = e
        if group is not None and group.size > 1:
            # every rank learns of a rank whose layer differs (or is invalid) here, not in a hung all-to-all
            agreement.check_same_everywhere(
                [("MoE", "arguments", str(error) if error else "valid", *map(repr, arguments[2:]), hidden_size)]
                + [("expert parameter", n, tuple(p.shape), str(p.dtype)) for n, p in expert.named_parameters()],
                group,
                "the MoE layer",
            )
        if error is not None:
            raise error
        self.num_experts = num_local_experts * (1 if group is None else group.size)
        self.num_local_experts = num_local_experts
        gate = TopKGate(
            hidden_size,
            self.num_experts,
            k,
            capacity_factor,
            eval_capacity_factor,
            min_capacity,
            noisy_gate_policy,
        )
        self.bagua_moe = MOELayer(gate, Experts(expert, num_local_experts), num_local_experts, group, disable_alltoall)
        self.dropout = torch.nn.Dropout(output_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, used_token: Optional[torch.Tensor] = None):
        """(output, l_aux, exp_counts): see the module doc."""
        output = self.dropout(self.bagua_moe(hidden_states, used_token))
        return output, self.bagua_moe.l_aux, self.bagua_moe.exp_counts
