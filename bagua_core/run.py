"""``python -m bagua_core.run``: launches the workers of one node of a fixed job.

Usage::

    python -m bagua_core.run [--nproc-per-node N] [--nnodes M] [--node-rank K]
              [--master-addr ADDR] [--master-port PORT] [--grace-period S]
              [--no-prefix] (SCRIPT | -m MODULE) [ARGS...]

Standard library only (no torch, jax or extension import), see
``bagua_core.launcher`` for the parts. ``bagua-run`` (:mod:`bagua.run`) is
this launcher plus elastic jobs (``--nnodes MIN:MAX``, ``--max-restarts``,
``--rdzv-backend c10d``), which run on torch elastic; here they are refused
with a pointer to it.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

from bagua_core.launcher.cli import LaunchConfig, parse_args
from bagua_core.launcher.supervisor import Supervisor

Launch = Callable[[LaunchConfig], int]


def run_fixed(cfg: LaunchConfig) -> int:
    """Runs a fixed set of workers to the end under the supervisor."""
    return Supervisor(cfg).run()


def main(argv: Optional[Sequence[str]] = None, launch: Optional[Launch] = None) -> int:
    """Runs the launcher with ``argv`` (default ``sys.argv[1:]``); returns its exit code.
    ``launch`` runs the parsed job (default: the supervisor, fixed jobs only)."""
    cfg, warnings = parse_args(argv)
    if cfg.elastic and launch is None:
        print(
            "bagua-run: an elastic job (--nnodes MIN:MAX, --max-restarts, --rdzv-backend c10d) runs on torch "
            "elastic: start it with bagua-run (python -m bagua.run); python -m bagua_core.run runs fixed jobs",
            file=sys.stderr,
            flush=True,
        )
        return 2
    for w in warnings:
        print(f"bagua-run: warning: {w}", file=sys.stderr, flush=True)
    return (launch or run_fixed)(cfg)


if __name__ == "__main__":
    sys.exit(main())
