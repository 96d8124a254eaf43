"""``save_checkpoint`` / ``load_checkpoint`` (see :mod:`bagua_torch.checkpoint`)."""

from __future__ import annotations

import io
import os
import random
import re
import warnings
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch.optim.lr_scheduler import LRScheduler

import bagua_core
from bagua_torch.checkpoint import files, moe


def _barrier() -> None:
    if bagua_core.is_initialized():
        bagua_core.barrier()


def _rank() -> int:
    return bagua_core.get_rank() if bagua_core.is_initialized() else 0


def _world() -> int:
    return bagua_core.get_world_size() if bagua_core.is_initialized() else 1


def _failed_ranks(failed: bool) -> List[int]:
    """The ranks for which ``failed`` is True (every rank calls it)."""
    if _world() == 1:
        return [0] if failed else []
    from bagua_core import comm

    flags = np.from_dlpack(comm.allgather(np.array([1 if failed else 0], dtype=np.int64)))
    return [r for r, f in enumerate(flags.reshape(-1)) if f]


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    iteration: int,
    checkpoints_path: str,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    lr_scheduler: Optional[LRScheduler] = None,
    *,
    keep_last: Optional[int] = None,
    sampler=None,
) -> None:
    """Saves the states at ``iteration`` (every rank calls it; see the package doc).
    ``keep_last=K`` then removes all but the K newest iterations. ``sampler``: a
    sampler with a position (:class:`bagua_torch.contrib.ResumableDistributedSampler`,
    :class:`~bagua_torch.contrib.LoadBalancingDistributedSampler`) saved with it."""
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be an int >= 0, got {iteration!r}")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
        raise ValueError(f"keep_last must be None or an int >= 1, got {keep_last!r}")
    _barrier()
    rank = _rank()
    directory = files.iteration_dir(checkpoints_path, iteration)
    entries: Dict[str, Dict[str, int]] = {}
    error: Optional[BaseException] = None
    try:
        layers = moe.moe_layers(model)
        model_state = model.state_dict()
        optimizer_state = None if optimizer is None else optimizer.state_dict()
        if layers:  # every rank writes its experts and its optimizer state
            experts, model_state = moe.split_experts(model_state, layers, rank)
            for g, part in experts.items():
                entries[os.path.basename(files.expert_file(checkpoints_path, iteration, g))] = files.save(
                    part, files.expert_file(checkpoints_path, iteration, g)
                )
            path = files.optimizer_file(checkpoints_path, iteration, rank)
            entries[os.path.basename(path)] = files.save({"optimizer": optimizer_state}, path)
            optimizer_state = None
        path = files.rng_file(checkpoints_path, iteration, rank)
        entries[os.path.basename(path)] = files.save(_rng_state(), path)
        if rank != 0 and not layers and _state_per_rank(model):
            path = files.rank_states_file(checkpoints_path, iteration, rank)
            own = {"model": model_state, "optimizer": optimizer_state, "algorithm": _algorithm_state(model)}
            entries[os.path.basename(path)] = files.save(own, path)
        if rank == 0:
            state = {
                "iteration": iteration,
                "model": model_state,
                "optimizer": optimizer_state,
                "algorithm": _algorithm_state(model),
                "lr_scheduler": None if lr_scheduler is None else lr_scheduler.state_dict(),
                "sampler": None if sampler is None else sampler.state_dict(),
                "bagua_version": bagua_core.__version__,
            }
            path = files.checkpoint_file(checkpoints_path, iteration)
            entries[os.path.basename(path)] = files.save(state, path)
        files.write_manifest(directory, rank, entries)
    except (OSError, RuntimeError) as e:  # a directory that cannot be written, a full disk
        error = e
    failed = _failed_ranks(error is not None)
    if failed:  # the tracker keeps naming the last good checkpoint
        if error is not None:
            raise OSError(f"save_checkpoint({iteration}) failed on rank {rank}: {error}") from error
        raise OSError(f"save_checkpoint({iteration}) failed on rank(s) {failed}; the last good checkpoint is kept")
    if rank == 0:
        files.write_tracker(checkpoints_path, iteration)
        if keep_last is not None:
            files.prune(checkpoints_path, keep_last, iteration)
    _barrier()


def _wrapped(model):
    """The model's BaguaDistributedDataParallel: ``model.bagua_ddp`` of
    ``with_bagua``, or the inner one of a
    :class:`bagua_torch.DistributedDataParallel`; None for a plain model."""
    from bagua_torch.data_parallel import DistributedDataParallel

    return model.inner if isinstance(model, DistributedDataParallel) else model.__dict__.get("bagua_ddp")


def _algorithm_state(model):
    """The algorithm's state where the model's own state dict lacks it
    (``with_bagua``; a DistributedDataParallel's carries it as ``bagua.*``)."""
    ddp = model.__dict__.get("bagua_ddp")
    return None if ddp is None else ddp.state_dict()


def _state_per_rank(model) -> bool:
    """The wrapped model's algorithm keeps state that differs per rank
    (:attr:`bagua_core.algorithms.Plan.state_per_rank`)."""
    ddp = _wrapped(model)
    return ddp is not None and ddp.impl.description.plan().state_per_rank


def _needed(checkpoints_path: str, iteration: int, model, optimizer, rank: int, world: int) -> List[str]:
    """The files this rank reads to load ``iteration``."""
    needed = [files.checkpoint_file(checkpoints_path, iteration)]
    layers = moe.moe_layers(model)
    if layers:
        for g in moe.expert_numbers(checkpoints_path, iteration, layers, rank, world):
            needed.append(files.expert_file(checkpoints_path, iteration, g))
        if optimizer is not None:
            directory = files.iteration_dir(checkpoints_path, iteration)
            saved_by = len(
                [f for f in os.listdir(directory) if re.match(r"expp_rank_\d+_mp_rank_00_optim_states.pt$", f)]
            )
            if saved_by != world:
                raise ValueError(
                    f"the checkpoint at {checkpoints_path} (iteration {iteration}) holds the optimizer state of "
                    f"{saved_by} ranks, this job has {world}: the experts' optimizer state is per rank; "
                    "load with optimizer=None to take the model alone onto another number of ranks"
                )
            needed.append(files.optimizer_file(checkpoints_path, iteration, rank))
    return needed


def _read(paths: List[str], manifest: Optional[dict]) -> Tuple[Dict[str, bytes], List[str]]:
    """The files' bytes, and what is wrong with them (against the manifest, when there is one)."""
    data, problems = {}, []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data[path] = f.read()
        except OSError as e:
            problems.append(f"{os.path.basename(path)} cannot be read ({e.strerror})")
            continue
        if manifest is not None:
            why = files.problem_of_bytes(os.path.basename(path), data[path], manifest.get(os.path.basename(path)))
            if why:
                problems.append(why)
    return data, problems


def load_checkpoint(
    checkpoints_path: str,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    lr_scheduler: Optional[LRScheduler] = None,
    strict: bool = True,
    *,
    load_rng: bool = True,
    sampler=None,
) -> int:
    """Loads the latest good checkpoint into the given objects and returns its
    iteration; 0 when there is none yet (see the package doc). ``sampler`` takes
    the saved position, also on another number of ranks (it re-shards)."""
    rank, world = _rank(), _world()
    try:
        latest = files.read_tracker(checkpoints_path)
    except ValueError as e:
        warnings.warn(f"{e}; looking for the newest good checkpoint instead", RuntimeWarning, stacklevel=2)
        latest = max(files.iterations(checkpoints_path), default=None)
    if latest is None:
        return 0
    candidates = [latest] + [it for it in files.iterations(checkpoints_path) if it < latest]
    reasons = []
    for iteration in candidates:
        manifest = files.manifest(files.iteration_dir(checkpoints_path, iteration))
        needed = _needed(checkpoints_path, iteration, model, optimizer, rank, world)
        if (
            manifest is not None
            and load_rng
            and os.path.basename(files.rng_file(checkpoints_path, iteration, rank)) in manifest
        ):
            needed.append(files.rng_file(checkpoints_path, iteration, rank))
        saved_world = files.saved_world(files.iteration_dir(checkpoints_path, iteration))
        own = files.rank_states_file(checkpoints_path, iteration, rank)
        if manifest is not None and os.path.basename(own) in manifest and saved_world == world:
            needed.append(own)  # this rank's own state (an algorithm with per-rank state saved it)
        data, problems = _read(needed, manifest)
        failed = _failed_ranks(bool(problems))
        if not failed:
            break
        why = "; ".join(problems) if problems else f"rank(s) {failed} found damaged files"
        reasons.append(f"iteration {iteration}: {why}")
        warnings.warn(
            f"checkpoint {files.iteration_dir(checkpoints_path, iteration)} is damaged ({why}); "
            "trying the one before it",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        raise RuntimeError(f"no good checkpoint under {checkpoints_path}: " + " | ".join(reasons))
    if manifest is None:
        warnings.warn(
            f"checkpoint {files.iteration_dir(checkpoints_path, iteration)} has no manifest (written by Bagua "
            "0.9.2?): loaded without verification",
            RuntimeWarning,
            stacklevel=2,
        )

    def read(path: str):
        return torch.load(io.BytesIO(data[path]), map_location="cpu", weights_only=False)

    state = read(files.checkpoint_file(checkpoints_path, iteration))
    own = files.rank_states_file(checkpoints_path, iteration, rank)
    if own in data:  # this rank's own weights, optimizer and algorithm state
        state.update(read(own))
    elif rank == 0 and saved_world != world and os.path.exists(files.rank_states_file(checkpoints_path, iteration, 1)):
        warnings.warn(
            f"checkpoint {files.iteration_dir(checkpoints_path, iteration)} holds the per-rank state of "
            f"{saved_world} ranks and this job has {world}: "
            "every rank takes rank 0's (its weights, optimizer and algorithm state, e.g. error-feedback residuals)",
            RuntimeWarning,
            stacklevel=2,
        )
    layers = moe.moe_layers(model)
    if layers:
        state["model"].update(moe.load_experts(checkpoints_path, iteration, layers, rank, read))
        if optimizer is not None:
            state["optimizer"] = read(files.optimizer_file(checkpoints_path, iteration, rank))["optimizer"]
    model.load_state_dict(state["model"], strict=strict)
    ddp = model.__dict__.get("bagua_ddp")
    if state.get("algorithm") is not None and ddp is not None:
        if state["algorithm"]["algorithm"] == ddp.algorithm.name:
            ddp.load_state_dict(state["algorithm"])
        elif rank == 0:  # resuming with another algorithm is allowed: the model and optimizer carry over
            warnings.warn(
                f"checkpoint {files.iteration_dir(checkpoints_path, iteration)} holds the state of algorithm "
                f"{state['algorithm']['algorithm']!r}; this model trains with {ddp.algorithm.name!r}, "
                "whose state starts afresh",
                RuntimeWarning,
                stacklevel=2,
            )
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if lr_scheduler is not None and state.get("lr_scheduler") is not None:
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    if sampler is not None and state.get("sampler") is not None:
        sampler.load_state_dict(state["sampler"])
    rng = files.rng_file(checkpoints_path, iteration, rank)
    if load_rng and rng in data:
        _set_rng_state(read(rng))
    _barrier()
    return iteration
