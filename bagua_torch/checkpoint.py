"""Checkpoints in Bagua 0.9.2's layout: ``save_checkpoint`` / ``load_checkpoint``.

Layout under ``checkpoints_path``: ``latest_checkpointed_iteration.txt`` (the
last saved iteration) and ``iter_{iteration:07d}/mp_rank_00_model_states.pt``,
a ``torch.save`` of ``{"iteration", "model", "optimizer", "lr_scheduler"}``
(state dicts; the last two may be None). Rank 0 writes; every rank waits at a
barrier, so all ranks may load right after. A wrapped model's state dict
carries the algorithm's state (see :class:`bagua_torch.DistributedDataParallel`).
Not built: the per-expert files of Bagua 0.9's MoE models.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from torch.optim.lr_scheduler import LRScheduler

import bagua_core

TRACKER = "latest_checkpointed_iteration.txt"


def checkpoint_file(checkpoints_path: str, iteration: int) -> str:
    return os.path.join(checkpoints_path, f"iter_{iteration:07d}", "mp_rank_00_model_states.pt")


def _barrier() -> None:
    if bagua_core.is_initialized():
        bagua_core.barrier()


def _rank() -> int:
    return bagua_core.get_rank() if bagua_core.is_initialized() else 0


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
    if _rank() == 0:
        path = checkpoint_file(checkpoints_path, iteration)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        state = {
            "iteration": iteration,
            "model": model.state_dict(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "lr_scheduler": None if lr_scheduler is None else lr_scheduler.state_dict(),
        }
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)  # a crash never leaves half a checkpoint under the real name
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
    model.load_state_dict(state["model"], strict=strict)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if lr_scheduler is not None and state["lr_scheduler"] is not None:
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    _barrier()
    return iteration


__all__ = ["save_checkpoint", "load_checkpoint"]
