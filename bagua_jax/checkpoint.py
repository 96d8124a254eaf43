"""Checkpoints of a JAX training state through orbax-checkpoint that a kill
never leaves in use half written: :func:`save_checkpoint` and
:func:`load_checkpoint`. Every rank calls both, at the same step.

Layout under ``directory``: ``rank_{r}/``, rank r's own orbax
``CheckpointManager`` directory (the state of Bagua's transforms is per rank:
error-feedback residuals, low-rank memories, decentralized replicas), with a
step directory ``{step}/`` per checkpoint (orbax writes it under a temporary
name and renames it when complete) and beside it ``{step}.manifest.json``:
every file of the step with its size and CRC-32, written last and atomically
(``bagua_core.checkpoint_files``). A step without its manifest was never
finished, on that rank, and is not used.

Saves: once every rank has written its step and manifest, the ``keep_last``
newest steps stay. A rank that cannot write makes every rank raise OSError;
the earlier checkpoints stay.

Loads: the newest step that every rank has with a manifest; each rank checks
its files against the manifest. When any rank finds one missing, truncated or
altered, every rank warns (RuntimeWarning naming the rank, file and why) and
falls back to the step before, and so on. Nothing to load: ``(None,
target)``. The state restores into ``target``'s structure (e.g. the state
``tx.init`` and the model's init give). Each manifest records the number of
ranks that saved it; a checkpoint whose newest step was saved by another
number of ranks is refused (ValueError on every rank, naming both numbers)
unless ``world_size_policy="from_rank0"``: every rank then loads rank 0's
state (from ``rank_0/``, which every rank must reach). That is exact for what
every rank holds alike (params, optimizer state, the state of
GradientAllReduce, ByteGrad's and QAdam's shared parts, LocalSteps' anchor
and outer momentum); per-rank state (error-feedback residuals, low-rank
memories, decentralized replicas) becomes rank 0's on every rank, as in a
live job's rebuild (:mod:`bagua_jax.live`). A transform's per-bucket state (``BaguaState.step_state``) restores as
saved, so one saved under another ``BAGUA_BUCKET_SIZE`` loads too: the first
``update`` lays it out for the current buckets.

Needs ``orbax-checkpoint`` (installed with flax).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from typing import Any, List, Optional, Tuple

import jax
import numpy as np

from bagua_core import checkpoint_files, comm as core_comm, preemption

__all__ = ["save_checkpoint", "load_checkpoint", "PreemptionGuard"]

_MANIFEST = re.compile(r"^(\d+)\.manifest\.json$")
_WORLD_SIZE_POLICIES = ("refuse", "from_rank0")


def save_checkpoint(directory: str, step: int, state: Any, *, keep_last: int = 3, group=None) -> None:
    """Saves the pytree ``state`` (params, optimizer state with Bagua's, any
    arrays) as ``step`` on every rank; keeps the ``keep_last`` newest."""
    if int(step) < 0 or int(keep_last) < 1:
        raise ValueError(f"bagua_jax.save_checkpoint: step must be >= 0 and keep_last >= 1, got {step}, {keep_last}")
    group = _group(group, "save_checkpoint")
    jax.effects_barrier()  # the steps in flight write the state being saved
    mine = _rank_dir(directory, group)

    def write():
        with _manager(mine) as manager:
            manager.save(int(step), args=_ocp().args.StandardSave(state), force=True)
            manager.wait_until_finished()
        entries = checkpoint_files.tree_entries(os.path.join(mine, str(int(step))))
        body = {"step": int(step), "rank": group.rank, "world_size": group.size, "files": entries}
        body = json.dumps(body, sort_keys=True).encode()
        checkpoint_files.write_bytes(os.path.join(mine, f"{int(step)}.manifest.json"), body)

    _on_every_rank(
        write,
        group,
        lambda failed, why: OSError(
            f"bagua_jax.save_checkpoint: step {step} was not written on ranks {failed}{why}; the earlier checkpoints stay"
        ),
    )
    for old in _steps(mine)[int(keep_last) :]:
        if old != int(step):
            _remove(mine, old)


def load_checkpoint(
    directory: str, target: Any, *, group=None, world_size_policy: str = "refuse"
) -> Tuple[Optional[int], Any]:
    """``(step, state)`` of the newest checkpoint every rank holds intact,
    restored into ``target``'s structure; ``(None, target)`` when there is
    none. RuntimeError when checkpoints exist but none is intact everywhere.
    ``world_size_policy``: "refuse" or "from_rank0", for a checkpoint saved by
    another number of ranks (see the module docstring)."""
    if world_size_policy not in _WORLD_SIZE_POLICIES:
        raise ValueError(
            f"bagua_jax.load_checkpoint: world_size_policy must be one of {_WORLD_SIZE_POLICIES}, "
            f"got {world_size_policy!r}"
        )
    group = _group(group, "load_checkpoint")
    jax.effects_barrier()
    mine = _rank_dir(directory, group)
    saved_by = core_comm.broadcast_object(
        _saved_world_size(_rank_dir(directory, group, rank=0)) if group.rank == 0 else None, 0, group.control_group
    )
    if saved_by is not None and saved_by != group.size:
        if world_size_policy == "refuse":
            raise ValueError(
                f"bagua_jax.load_checkpoint: the newest checkpoint under {directory} was saved by {saved_by} ranks "
                f"and this group has {group.size}; load it with world_size_policy='from_rank0' (every rank takes "
                "rank 0's state) or on the number of ranks that saved it"
            )
        mine = _rank_dir(directory, group, rank=0)
    steps = _steps(mine) if os.path.isdir(mine) else []
    below = None  # the next candidate is older than this
    problems: List[str] = []
    while True:
        newest = max((s for s in steps if below is None or s < below), default=-1)
        candidate = int(_allreduce(newest, core_comm.ReduceOp.MIN, group))
        if candidate < 0:
            if problems or _allreduce(len(steps), core_comm.ReduceOp.MAX, group) > 0:
                raise RuntimeError(
                    f"bagua_jax.load_checkpoint: no checkpoint under {directory} is intact on every rank"
                    + (": " + "; ".join(problems) if problems else " (the ranks hold different steps)")
                )
            return None, target
        problem = _problem(mine, candidate) if candidate in steps else f"step {candidate} is missing"
        reports = _gather_problems(problem, group)
        bad = [(r, p) for r, p in enumerate(reports) if p]
        if not bad:
            return candidate, _restore(mine, candidate, target, group)
        for r, p in bad:
            message = f"step {candidate} on rank {r}: {p}"
            problems.append(message)
            warnings.warn(
                f"bagua_jax.load_checkpoint: {message}; falling back to the step before", RuntimeWarning, stacklevel=2
            )
        below = candidate


class PreemptionGuard(preemption.PreemptionGuard):
    """``bagua_core.preemption.PreemptionGuard`` for JAX: a SIGTERM to any rank
    makes ``should_stop()`` true on every rank at the same call, to save and
    stop. Its collective first waits for the jitted steps in flight
    (``jax.effects_barrier``), a pause per call: ``every=N`` checks every N-th."""

    def _settle(self) -> None:
        jax.effects_barrier()


def _restore(mine: str, step: int, target: Any, group) -> Any:
    def restore():
        with _manager(mine) as manager:
            saved = _as_saved(target, manager.item_metadata(step))
            return manager.restore(step, args=_ocp().args.StandardRestore(saved))

    return _on_every_rank(
        restore,
        group,
        lambda failed, why: RuntimeError(
            f"bagua_jax.load_checkpoint: step {step} did not restore into the target on ranks {failed}{why}: "
            "is the target the state this checkpoint was saved from (same model, algorithm and ranks)?"
        ),
    )


def _as_saved(target: Any, metadata) -> Any:
    """``target`` with each transform state's per-bucket arrays shaped as the
    checkpoint holds them (their number and sizes follow the bucket size it
    was saved under)."""
    from bagua_jax._src.transform import BaguaState

    saved = {}
    for leaf in jax.tree_util.tree_leaves(getattr(metadata, "tree", metadata)):
        if hasattr(leaf, "name") and hasattr(leaf, "shape"):
            saved[str(leaf.name)] = leaf

    def shaped(path, node):
        if not isinstance(node, BaguaState) or not node.step_state:
            return node
        prefix = ".".join(_key_name(k) for k in path) + ".step_state."
        held = sorted(
            (
                (int(name[len(prefix) :]), m)
                for name, m in saved.items()
                if name.startswith(prefix) and name[len(prefix) :].isdigit()
            ),
            key=lambda km: km[0],
        )
        if not held:
            return node
        sharding = getattr(node.step_state[0], "sharding", None)
        arrays = []
        for _, m in held:
            zeros = np.zeros(tuple(m.shape), np.dtype(m.dtype))
            arrays.append(jax.device_put(zeros, sharding) if sharding is not None else zeros)
        return node._replace(step_state=tuple(arrays))

    return jax.tree_util.tree_map_with_path(shaped, target, is_leaf=lambda x: isinstance(x, BaguaState))


def _key_name(key) -> str:
    """A pytree key as orbax names it in a saved array's path."""
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _on_every_rank(work, group, failure):
    """``work()``'s result; when it raised on any rank, every rank raises
    ``failure(failed ranks, " (this rank's error)" or "")``."""
    result, why = None, ""
    try:
        result = work()
    except Exception as e:  # noqa: BLE001 - orbax raises many kinds; every rank must hear of it
        why = f" (rank {group.rank}: {type(e).__name__}: {e})"
    flags = np.zeros(group.size, dtype=np.int64)
    core_comm.allgather(np.array([1 if why else 0], dtype=np.int64), flags, group.control_group)
    failed = [r for r in range(group.size) if flags[r]]
    if failed:
        raise failure(failed, why)
    return result


def _problem(mine: str, step: int) -> Optional[str]:
    """Why this rank's step is not intact (None: it is)."""
    try:
        with open(os.path.join(mine, f"{step}.manifest.json"), "rb") as f:
            entries = json.loads(f.read())["files"]
    except (OSError, ValueError, KeyError) as e:
        return f"its manifest is unreadable ({e})"
    return checkpoint_files.problem_of_tree(os.path.join(mine, str(step)), entries)


def _steps(mine: str) -> List[int]:
    """This rank's finished steps (those with a manifest), newest first."""
    found = []
    for name in os.listdir(mine) if os.path.isdir(mine) else []:
        m = _MANIFEST.match(name)
        if m and os.path.isdir(os.path.join(mine, m.group(1))):
            found.append(int(m.group(1)))
    return sorted(found, reverse=True)


def _remove(mine: str, step: int) -> None:
    os.remove(os.path.join(mine, f"{step}.manifest.json"))  # first: the step is no longer finished
    shutil.rmtree(os.path.join(mine, str(step)), ignore_errors=True)


def _rank_dir(directory: str, group, rank: Optional[int] = None) -> str:
    return os.path.join(os.path.abspath(directory), f"rank_{group.rank if rank is None else rank}")


def _saved_world_size(mine: str) -> Optional[int]:
    """The number of ranks that saved this directory's newest finished step
    (None: none, or a manifest from before the number was recorded)."""
    for step in _steps(mine):
        try:
            with open(os.path.join(mine, f"{step}.manifest.json"), "rb") as f:
                return json.loads(f.read()).get("world_size")
        except (OSError, ValueError):
            continue  # a damaged manifest: the load's checks report it
    return None


def _manager(mine: str):
    ocp = _ocp()
    # each rank is its own primary host: the state is per rank, also under jax.distributed
    me = jax.process_index()
    os.makedirs(mine, exist_ok=True)  # orbax creates no directory for a process of its own
    options = ocp.CheckpointManagerOptions(
        create=False,
        enable_async_checkpointing=False,
        multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me}),
    )
    return ocp.CheckpointManager(mine, options=options, item_handlers=ocp.StandardCheckpointHandler())


def _ocp():
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:
        raise ImportError(
            "bagua_jax.checkpoint needs orbax-checkpoint: pip install orbax-checkpoint (flax brings it)"
        ) from e
    return ocp


def _group(group, what: str):
    from bagua_jax._src import groups

    return groups.process_group(group, f"bagua_jax.{what}")


def _allreduce(value: int, op, group) -> int:
    buffer = np.array([value], dtype=np.int64)
    core_comm.allreduce_inplace(buffer, op, group.control_group)
    return int(buffer[0])


def _gather_problems(problem: Optional[str], group) -> List[Optional[str]]:
    """Every rank's ``problem``, in rank order (each rank broadcasts its own)."""
    return [
        core_comm.broadcast_object(problem if r == group.rank else None, r, group.control_group)
        for r in range(group.size)
    ]
