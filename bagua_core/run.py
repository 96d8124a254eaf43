"""``bagua-run`` / ``python -m bagua_core.run``: launches the workers of one node.

Usage::

    bagua-run [--nproc-per-node N] [--nnodes M|MIN:MAX] [--node-rank K]
              [--master-addr ADDR] [--master-port PORT] [--grace-period S]
              [--max-restarts N] [--rdzv-backend static|c10d] [--rdzv-endpoint HOST[:PORT]]
              [--rdzv-id ID] [--rdzv-conf K=V,...] [--monitor-interval S]
              [--no-prefix] (SCRIPT | -m MODULE) [ARGS...]

A fixed job runs on the standard library only (no torch, jax or extension
import); an elastic one on torch elastic (see ``bagua_core.launcher``).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from bagua_core.launcher import elastic
from bagua_core.launcher.cli import LaunchConfig, parse_args
from bagua_core.launcher.supervisor import Supervisor


def launch(cfg: LaunchConfig) -> int:
    """Runs the workers to the end: torch elastic's agent for an elastic job, the supervisor otherwise."""
    return elastic.run(cfg) if cfg.elastic else Supervisor(cfg).run()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the launcher with ``argv`` (default ``sys.argv[1:]``); returns its exit code."""
    cfg, warnings = parse_args(argv)
    for w in warnings:
        print(f"bagua-run: warning: {w}", file=sys.stderr, flush=True)
    return launch(cfg)


if __name__ == "__main__":
    sys.exit(main())
