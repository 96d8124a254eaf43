"""The files of a checkpoint: their names (Bagua 0.9.2's layout), writes
that a crash never leaves half done, the manifests that verify them, and
which iterations are there.

Every file is written to ``NAME.tmp``, flushed to disk (fsync), renamed, and
its directory synced; so a file under its real name is whole. Each rank
that wrote files of an iteration then writes ``manifest_rank_{r}.json``
(the same way): each file's size and CRC-32. The tracker file comes last.
"""

from __future__ import annotations

import glob
import io
import json
import os
import re
from typing import Dict, List, Optional

import torch

from bagua_core.checkpoint_files import problem_of_bytes, write_bytes  # noqa: F401 (re-exported)

TRACKER = "latest_checkpointed_iteration.txt"
_ITER = re.compile(r"iter_(\d{7})$")


def iteration_dir(checkpoints_path: str, iteration: int) -> str:
    return os.path.join(checkpoints_path, f"iter_{iteration:07d}")


def checkpoint_file(checkpoints_path: str, iteration: int) -> str:
    return os.path.join(iteration_dir(checkpoints_path, iteration), "mp_rank_00_model_states.pt")


def expert_file(checkpoints_path: str, iteration: int, expert: int) -> str:
    return os.path.join(iteration_dir(checkpoints_path, iteration), f"expert_{expert}_mp_rank_00_model_states.pt")


def optimizer_file(checkpoints_path: str, iteration: int, rank: int) -> str:
    return os.path.join(iteration_dir(checkpoints_path, iteration), f"expp_rank_{rank}_mp_rank_00_optim_states.pt")


def rank_states_file(checkpoints_path: str, iteration: int, rank: int) -> str:
    return os.path.join(iteration_dir(checkpoints_path, iteration), f"rank_{rank}_states.pt")


def saved_world(directory: str) -> int:
    """How many ranks wrote the iteration: one manifest each."""
    return len(glob.glob(os.path.join(directory, "manifest_rank_*.json")))


def rng_file(checkpoints_path: str, iteration: int, rank: int) -> str:
    return os.path.join(iteration_dir(checkpoints_path, iteration), f"rng_rank_{rank}.pt")


def save(obj, path: str) -> Dict[str, int]:
    """``torch.save(obj)`` to ``path`` as :func:`write_bytes` does; returns its manifest entry."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    return {"size": len(data), "crc32": write_bytes(path, data)}


def write_manifest(directory: str, rank: int, entries: Dict[str, Dict[str, int]]) -> None:
    """This rank's files of the iteration (names relative to ``directory``)."""
    body = json.dumps({"rank": rank, "files": entries}, sort_keys=True).encode()
    write_bytes(os.path.join(directory, f"manifest_rank_{rank}.json"), body)


def manifest(directory: str) -> Optional[Dict[str, Dict[str, int]]]:
    """Every file the iteration's manifests list; None when it has none (a
    checkpoint of Bagua 0.9.2, or one whose writers did not finish)."""
    paths = glob.glob(os.path.join(directory, "manifest_rank_*.json"))
    if not paths:
        return None
    files: Dict[str, Dict[str, int]] = {}
    for p in paths:
        with open(p, "rb") as f:
            files.update(json.loads(f.read())["files"])
    return files


def iterations(checkpoints_path: str) -> List[int]:
    """The iterations with a directory here, newest first."""
    found = []
    for d in glob.glob(os.path.join(checkpoints_path, "iter_*")):
        m = _ITER.search(d)
        if m and os.path.isdir(d):
            found.append(int(m.group(1)))
    return sorted(found, reverse=True)


def read_tracker(checkpoints_path: str) -> Optional[int]:
    """The tracker's iteration; None without a tracker. ValueError when it holds no number."""
    tracker = os.path.join(checkpoints_path, TRACKER)
    if not os.path.isfile(tracker):
        return None
    with open(tracker) as f:
        text = f.read().strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{tracker} holds {text!r}, not an iteration number") from None


def write_tracker(checkpoints_path: str, iteration: int) -> None:
    write_bytes(os.path.join(checkpoints_path, TRACKER), str(iteration).encode())


def prune(checkpoints_path: str, keep_last: int, current: int) -> None:
    """Removes the iteration directories older than the ``keep_last`` newest (never ``current``)."""
    import shutil

    for it in iterations(checkpoints_path)[keep_last:]:
        if it != current:
            shutil.rmtree(iteration_dir(checkpoints_path, it), ignore_errors=True)
