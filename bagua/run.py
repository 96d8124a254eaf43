"""``bagua-run`` / ``python -m bagua.run``: launches the workers of one node.

Usage::

    bagua-run [--nproc-per-node N] [--nnodes M|MIN:MAX] [--node-rank K]
              [--master-addr ADDR] [--master-port PORT] [--grace-period S]
              [--max-restarts N] [--rdzv-backend static|c10d] [--rdzv-endpoint HOST[:PORT]]
              [--rdzv-id ID] [--rdzv-conf K=V,...] [--monitor-interval S]
              [--no-prefix] (SCRIPT | -m MODULE) [ARGS...]

A fixed job runs on :mod:`bagua_core.run`'s supervisor (standard library
only); an elastic one under torch elastic's agent
(:mod:`bagua.distributed.elastic`, which imports torch, here only).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from bagua_core import run as core_run
from bagua_core.launcher.cli import LaunchConfig


def launch(cfg: LaunchConfig) -> int:
    """Runs the workers to the end: torch elastic's agent for an elastic job, the supervisor otherwise."""
    if cfg.elastic:
        from bagua.distributed import elastic

        return elastic.run(cfg)
    return core_run.run_fixed(cfg)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the launcher with ``argv`` (default ``sys.argv[1:]``); returns its exit code."""
    return core_run.main(argv, launch)


if __name__ == "__main__":
    sys.exit(main())
