"""What each worker gets: its environment (torchrun's contract) and its command line."""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Mapping, Tuple

from bagua_core import config
from bagua_core.launcher.cli import LaunchConfig


def worker_env(cfg: LaunchConfig, local_rank: int, base: Mapping[str, str]) -> Dict[str, str]:
    """``base`` (the launcher's environment) plus the contract for ``local_rank``."""
    env = dict(base)
    env.update(cfg.extra_env)
    env.update(
        RANK=str(cfg.rank(local_rank)),
        WORLD_SIZE=str(cfg.world_size),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(cfg.nproc_per_node),
        NODE_RANK=str(cfg.node_rank),
        GROUP_RANK=str(cfg.node_rank),
        MASTER_ADDR=cfg.master_addr,
        MASTER_PORT=str(cfg.master_port),
        PYTHONUNBUFFERED="1",  # prints show up promptly through the pipes
    )
    if cfg.store_secret and not env.get(config.STORE_SECRET_ENV):
        env[config.STORE_SECRET_ENV] = cfg.store_secret
    if cfg.nproc_per_node > 1:
        # As torchrun does: N workers each using every core would oversubscribe the machine.
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def worker_command(cfg: LaunchConfig, local_rank: int = 0) -> List[str]:
    extra = [f"--local_rank={local_rank}"] if cfg.local_rank_arg else []
    if cfg.no_python:
        return [cfg.script, *cfg.script_args, *extra]
    target = ["-m", cfg.script] if cfg.module else [cfg.script]
    return [sys.executable, *target, *cfg.script_args, *extra]


def log_paths(cfg: LaunchConfig, local_rank: int) -> Tuple[str, str]:
    """stdout and stderr files of a worker under ``cfg.log_dir`` (Bagua 0.9's names)."""
    base = os.path.join(cfg.log_dir, f"node_{cfg.node_rank}_local_rank_{local_rank}")
    return base + "_stdout", base + "_stderr"
