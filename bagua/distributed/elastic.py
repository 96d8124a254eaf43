"""Elastic launch: the workers of one node run under torch elastic's agent
(``torch.distributed.elastic``) and its rendezvous, as torchrun runs them.

Chosen by ``bagua-run`` (:mod:`bagua.run`, and ``bagua.distributed.run``)
when the job is elastic: ``--nnodes MIN:MAX`` with MIN < MAX,
``--max-restarts N`` > 0, or ``--rdzv-backend c10d``; otherwise the
supervisor of :mod:`bagua_core.launcher.supervisor` runs a fixed set of
workers. It lives outside ``bagua_core``, which imports neither torch nor jax. The flags
mean what torchrun's mean: on a worker's failure the agent stops this node's
workers and, while restarts remain, every node meets again at the
rendezvous and starts a new worker group (``TORCHELASTIC_RESTART_COUNT``
counts them; ``WORLD_SIZE`` is the new group's size); nodes may join and
leave between ``MIN`` and ``MAX``. Workers get torchrun's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``,
``TORCHELASTIC_RESTART_COUNT``, ...) plus the settings given as Bagua flags.

Only this launcher process imports torch (here, when the job is elastic); a
worker script need not (a JAX script runs the same way).
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` is the default: with the store
shared between rendezvous and workers, a restarted group of torch 2.13 could
fail to connect and hang.
"""

from __future__ import annotations

import os
import sys
from typing import List

from bagua_core import config
from bagua_core.launcher.cli import LaunchConfig


def _entrypoint(cfg: LaunchConfig) -> List[str]:
    extra = ["--local_rank=${local_rank}"] if cfg.local_rank_arg else []  # torch elastic fills it in
    if cfg.no_python:
        return [cfg.script, *cfg.script_args, *extra]
    target = ["-m", cfg.script] if cfg.module else [cfg.script]
    return [sys.executable, "-u", *target, *cfg.script_args, *extra]


def _environment(cfg: LaunchConfig) -> None:
    """What every worker inherits from this process (torch elastic passes the environment on)."""
    os.environ.update(cfg.extra_env)
    os.environ["PYTHONUNBUFFERED"] = "1"
    if cfg.store_secret and not os.environ.get(config.STORE_SECRET_ENV):
        os.environ[config.STORE_SECRET_ENV] = cfg.store_secret
    if cfg.nproc_per_node > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


def run(cfg: LaunchConfig) -> int:
    """Runs this node's workers under torch elastic's agent; returns the exit code."""
    try:
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig as ElasticConfig, elastic_launch
    except ImportError as e:
        print(
            f"bagua-run: an elastic launch (--nnodes MIN:MAX, --max-restarts, --rdzv-backend c10d) runs on "
            f"torch elastic, which does not import here ({e}): pip install 'bagua[torch]'",
            file=sys.stderr,
            flush=True,
        )
        return 2
    _environment(cfg)
    endpoint = cfg.rdzv_endpoint or f"{cfg.master_addr}:{cfg.master_port}"
    rdzv_configs = dict(cfg.rdzv_conf)
    if cfg.rdzv_backend == "static":
        rdzv_configs.setdefault("rank", cfg.node_rank)
    elastic = ElasticConfig(
        min_nodes=cfg.min_nodes,
        max_nodes=cfg.nnodes,
        nproc_per_node=cfg.nproc_per_node,
        logs_specs=DefaultLogsSpecs(
            log_dir=cfg.log_dir, redirects=Std.ALL if cfg.log_dir else Std.NONE, tee=Std.ALL if cfg.prefix else Std.NONE
        ),
        run_id=cfg.rdzv_id,
        rdzv_endpoint=endpoint,
        rdzv_backend=cfg.rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=cfg.max_restarts,
        monitor_interval=cfg.monitor_interval,
        start_method="spawn",
        log_line_prefix_template="[rank ${rank}] " if cfg.prefix else None,
    )
    entrypoint, *args = _entrypoint(cfg)
    try:
        elastic_launch(elastic, entrypoint)(*args)
    except ChildFailedError as e:
        first = min(e.failures.items(), key=lambda kv: kv[1].timestamp)[1] if e.failures else None
        code = first.exitcode if first is not None else 1
        print(
            f"bagua-run: {e.name} failed after the allowed restarts ({cfg.max_restarts}): {first}",
            file=sys.stderr,
            flush=True,
        )
        return code if code > 0 else 128 - code if code < 0 else 1
    except Exception as e:  # noqa: BLE001 - the rendezvous' own errors (timeouts, unreachable endpoint)
        cause = f" ({str(e.__cause__).splitlines()[0]})" if e.__cause__ is not None and str(e.__cause__) else ""
        print(
            f"bagua-run: elastic launch failed at the rendezvous {endpoint} ({cfg.rdzv_backend}): "
            f"{type(e).__name__}: {e}{cause}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0
