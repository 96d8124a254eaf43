"""Checkpoints in Bagua 0.9.2's layout: ``save_checkpoint`` / ``load_checkpoint``.

Layout under ``checkpoints_path``: ``latest_checkpointed_iteration.txt`` (the
last saved iteration) and ``iter_{iteration:07d}/mp_rank_00_model_states.pt``,
a ``torch.save`` of ``{"iteration", "model", "optimizer", "lr_scheduler"}``
(state dicts; the last two may be None). Rank 0 writes; every rank waits at a
barrier, so all ranks may load right after. A wrapped model's state dict
carries the algorithm's state (see :class:`bagua_torch.DistributedDataParallel`).

A model holding :class:`bagua_torch.moe.MoE` layers is saved in Bagua 0.9's
expert-parallel layout instead (every rank calls both functions): in
``iter_{iteration:07d}/``, ``expert_{g}_mp_rank_00_model_states.pt`` holds
expert g's parameters (written by the rank holding it, keys naming the
expert by its number g in the job), ``expp_rank_{r}_mp_rank_00_optim_states.pt``
holds ``{"optimizer": ...}`` of rank r (the optimizer state of its experts
differs from the other ranks'), and ``mp_rank_00_model_states.pt`` (rank 0)
the rest of the model, the iteration and the LR scheduler. The tracker is
written once every rank's files are complete. Loading needs the same number
of experts in the job (world size × ``num_local_experts``), arranged over any
number of ranks; a checkpoint with another number is refused naming both.
The optimizer's state loads only onto as many ranks as saved it.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Optional, Tuple

import torch
from torch.optim.lr_scheduler import LRScheduler

import bagua_core

TRACKER = "latest_checkpointed_iteration.txt"


def checkpoint_file(checkpoints_path: str, iteration: int) -> str:
    return os.path.join(checkpoints_path, f"iter_{iteration:07d}", "mp_rank_00_model_states.pt")


def expert_file(checkpoints_path: str, iteration: int, expert: int) -> str:
    return os.path.join(checkpoints_path, f"iter_{iteration:07d}", f"expert_{expert}_mp_rank_00_model_states.pt")


def optimizer_file(checkpoints_path: str, iteration: int, rank: int) -> str:
    return os.path.join(checkpoints_path, f"iter_{iteration:07d}", f"expp_rank_{rank}_mp_rank_00_optim_states.pt")


def _save(obj, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)  # a crash never leaves half a file under the real name


# ---------------------------------------------------------------- MoE layout

_EXPERTS = "bagua_moe.experts.bagua_experts."


def _moe_layers(model: torch.nn.Module) -> List[Tuple[str, int]]:
    """(state-dict prefix of the layer's experts, num_local_experts) per MoE layer."""
    from bagua_torch.moe import MoE

    return [
        ((name + "." if name else "") + _EXPERTS, m.num_local_experts)
        for name, m in model.named_modules()
        if isinstance(m, MoE)
    ]


def _split_experts(state: dict, layers, rank: int) -> Tuple[Dict[int, dict], dict]:
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


def _load_experts(checkpoints_path: str, iteration: int, layers, rank: int, world: int) -> dict:
    """This rank's experts' entries, renamed to their local numbers."""
    total = {local * world for _, local in layers}
    saved = sorted(
        int(re.search(r"expert_(\d+)_mp", f).group(1))  # type: ignore[union-attr]  # the glob matched it
        for f in glob.glob(
            os.path.join(checkpoints_path, f"iter_{iteration:07d}", "expert_*_mp_rank_00_model_states.pt")
        )
    )
    if len(total) > 1:
        raise ValueError(
            f"the model's MoE layers hold different numbers of experts ({sorted(total)}): their checkpoint "
            "files would share numbers; give every MoE layer the same num_local_experts"
        )
    if saved and max(saved) + 1 != max(total):
        raise ValueError(
            f"the checkpoint at {checkpoints_path} (iteration {iteration}) holds {max(saved) + 1} experts, this job "
            f"{max(total)} (world size {world} x num_local_experts): load it with the same number of experts"
        )
    out = {}
    for prefix, local in layers:
        for j in range(local):
            g = rank * local + j
            path = expert_file(checkpoints_path, iteration, g)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{path} is missing: the checkpoint holds {len(saved)} experts, this job needs {local * world} "
                    f"(world size {world} x num_local_experts {local}); load it with the same number of experts"
                )
            for key, value in torch.load(path, map_location="cpu", weights_only=False).items():
                if key.startswith(f"{prefix}{g}."):
                    out[f"{prefix}{j}." + key[len(f"{prefix}{g}.") :]] = value
    return out


def _barrier() -> None:
    if bagua_core.is_initialized():
        bagua_core.barrier()


def _rank() -> int:
    return bagua_core.get_rank() if bagua_core.is_initialized() else 0


def _world() -> int:
    return bagua_core.get_world_size() if bagua_core.is_initialized() else 1


def save_checkpoint(
    iteration: int,
    checkpoints_path: str,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    lr_scheduler: Optional[LRScheduler] = None,
) -> None:
    """Saves the states at ``iteration`` (rank 0 writes; every rank calls it)."""
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be an int >= 0, got {iteration!r}")
    _barrier()
    layers = _moe_layers(model)
    rank = _rank()
    model_state = model.state_dict()
    optimizer_state = None if optimizer is None else optimizer.state_dict()
    if layers:  # every rank writes its experts and its optimizer state
        experts, model_state = _split_experts(model_state, layers, rank)
        for g, entries in experts.items():
            _save(entries, expert_file(checkpoints_path, iteration, g))
        _save({"optimizer": optimizer_state}, optimizer_file(checkpoints_path, iteration, rank))
        optimizer_state = None
        _barrier()  # the tracker names a checkpoint only once every rank's files are there
    if rank == 0:
        state = {
            "iteration": iteration,
            "model": model_state,
            "optimizer": optimizer_state,
            "lr_scheduler": None if lr_scheduler is None else lr_scheduler.state_dict(),
        }
        _save(state, checkpoint_file(checkpoints_path, iteration))
        with open(os.path.join(checkpoints_path, TRACKER), "w") as f:
            f.write(str(iteration))
    _barrier()


def load_checkpoint(
    checkpoints_path: str,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    lr_scheduler: Optional[LRScheduler] = None,
    strict: bool = True,
) -> int:
    """Loads the latest checkpoint into the given objects and returns its
    iteration; 0 when there is none yet."""
    tracker = os.path.join(checkpoints_path, TRACKER)
    if not os.path.isfile(tracker):
        return 0
    with open(tracker) as f:
        text = f.read().strip()
    try:
        iteration = int(text)
    except ValueError:
        raise ValueError(f"{tracker} holds {text!r}, not an iteration number") from None
    state = torch.load(checkpoint_file(checkpoints_path, iteration), map_location="cpu", weights_only=False)
    layers = _moe_layers(model)
    if layers:
        state["model"].update(_load_experts(checkpoints_path, iteration, layers, _rank(), _world()))
        if optimizer is not None:
            ranks = len(
                glob.glob(os.path.join(os.path.dirname(checkpoint_file(checkpoints_path, iteration)), "expp_rank_*"))
            )
            if ranks != _world():
                raise ValueError(
                    f"the checkpoint at {checkpoints_path} (iteration {iteration}) holds the optimizer state of "
                    f"{ranks} ranks, this job has {_world()}: the experts' optimizer state is per rank; "
                    "load with optimizer=None to take the model alone onto another number of ranks"
                )
            path = optimizer_file(checkpoints_path, iteration, _rank())
            state["optimizer"] = torch.load(path, map_location="cpu", weights_only=False)["optimizer"]
    model.load_state_dict(state["model"], strict=strict)
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if lr_scheduler is not None and state.get("lr_scheduler") is not None:
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    _barrier()
    return iteration


__all__ = ["save_checkpoint", "load_checkpoint"]
