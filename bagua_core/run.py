"""``bagua-run`` / ``python -m bagua_core.run``: launches the workers of one node.

Usage::

    bagua-run [--nproc-per-node N] [--nnodes M] [--node-rank K]
              [--master-addr ADDR] [--master-port PORT] [--grace-period S]
              [--no-prefix] (SCRIPT | -m MODULE) [ARGS...]

Standard library only (no torch, jax or extension import), see
``bagua_core.launcher`` for the parts.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from bagua_core.launcher.cli import parse_args
from bagua_core.launcher.supervisor import Supervisor


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the launcher with ``argv`` (default ``sys.argv[1:]``); returns its exit code."""
    cfg, warnings = parse_args(argv)
    for w in warnings:
        print(f"bagua-run: warning: {w}", file=sys.stderr, flush=True)
    return Supervisor(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
