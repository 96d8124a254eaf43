"""Bagua 0.9's expert-parallel checkpoint layout for models holding
:class:`bagua_torch.moe.MoE` layers: one file per expert of the job, keys
naming the expert by its number in the job (rank * num_local_experts + j)."""

from __future__ import annotations

import glob
import os
import re
from typing import Callable, Dict, List, Tuple

import torch

from bagua_torch.checkpoint.files import expert_file, iteration_dir

_EXPERTS = "bagua_moe.experts.bagua_experts."


def moe_layers(model: torch.nn.Module) -> List[Tuple[str, int]]:
    """(state-dict prefix of the layer's experts, num_local_experts) per MoE layer."""
    from bagua_torch.moe import MoE

    return [
        ((name + "." if name else "") + _EXPERTS, m.num_local_experts)
        for name, m in model.named_modules()
        if isinstance(m, MoE)
    ]


def split_experts(state: dict, layers, rank: int) -> Tuple[Dict[int, dict], dict]:
    """({job expert number: its entries, renamed to that number}, the other entries)."""
    experts: Dict[int, dict] = {}
    rest = {}
    for key, value in state.items():
        for prefix, local in layers:
            m = re.match(re.escape(prefix) + r"(\d+)\.(.*)", key)
            if m:
                g = rank * local + int(m.group(1))
                experts.setdefault(g, {})[f"{prefix}{g}.{m.group(2)}"] = value
                break
        else:
            rest[key] = value
    return experts, rest


def expert_numbers(checkpoints_path: str, iteration: int, layers, rank: int, world: int) -> List[int]:
    """The job expert numbers this rank loads; ValueError when the checkpoint
    holds another number of experts than this job."""
    total = {local * world for _, local in layers}
    if len(total) > 1:
        raise ValueError(
            f"the model's MoE layers hold different numbers of experts ({sorted(total)}): their checkpoint "
            "files would share numbers; give every MoE layer the same num_local_experts"
        )
    pattern = os.path.join(iteration_dir(checkpoints_path, iteration), "expert_*_mp_rank_00_model_states.pt")
    saved = sorted(int(re.search(r"expert_(\d+)_mp", f).group(1)) for f in glob.glob(pattern))  # type: ignore[union-attr]
    if saved and max(saved) + 1 != max(total):
        raise ValueError(
            f"the checkpoint at {checkpoints_path} (iteration {iteration}) holds {max(saved) + 1} experts, this job "
            f"{max(total)} (world size {world} x num_local_experts): load it with the same number of experts"
        )
    return sorted({rank * local + j for _, local in layers for j in range(local)})


def load_experts(checkpoints_path: str, iteration: int, layers, rank: int, read: Callable[[str], dict]) -> dict:
    """This rank's experts' entries, renamed to their local numbers (``read`` loads a file)."""
    out = {}
    for prefix, local in layers:
        for j in range(local):
            g = rank * local + j
            for key, value in read(expert_file(checkpoints_path, iteration, g)).items():
                if key.startswith(f"{prefix}{g}."):
                    out[f"{prefix}{j}." + key[len(f"{prefix}{g}.") :]] = value
    return out
