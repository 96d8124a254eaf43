"""``python -m bagua.distributed.launch``: Bagua 0.9.2's launcher, on ``bagua-run``.

Same flags: ``--nproc_per_node``, ``--nnodes``, ``--node_rank``,
``--master_addr``, ``--master_port``, ``-m/--module``, ``--no_python``,
``--logdir`` (each worker's output in ``node_{n}_local_rank_{r}_stdout`` /
``_stderr`` there), ``--set_additional_flag`` (append ``--local_rank=N`` to
the script's arguments), ``--bagua_service_port`` and ``--default_bucket_size``
(passed to the workers as ``BAGUA_SERVICE_PORT`` / ``BAGUA_DEFAULT_BUCKET_SIZE``),
the autotune flags (as ``BAGUA_AUTOTUNE``, ``BAGUA_AUTOTUNE_MAX_SAMPLES``, ...).
``--report_metrics``, ``--enable_bagua_net``, ``--host_list``
and ``--ssh_port`` are accepted and have no effect (one notice each).

Differences: without ``--master_port`` a single node picks a free port (as
``bagua-run`` does; 29500 with several nodes), and workers' lines are prefixed
with their rank (not with ``--logdir``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from bagua.distributed import _flags


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bagua.distributed.launch",
        allow_abbrev=False,
        description="Bagua 0.9.2's launcher (runs the workers of one node through bagua-run).",
    )
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node_rank", type=int, default=0)
    p.add_argument("--nproc_per_node", type=int, default=1)
    p.add_argument("--master_addr", default="127.0.0.1")
    p.add_argument(
        "--master_port", type=int, default=None, help="default: a free port on a single node, 29500 with several"
    )
    p.add_argument("--set_additional_flag", action="store_true", help="append --local_rank=N to the script's arguments")
    p.add_argument("-m", "--module", action="store_true", help="run the script as a module, like python -m")
    p.add_argument("--no_python", action="store_true", help="run the script as a program, not through Python")
    p.add_argument("--logdir", default=None, help="write each worker's stdout and stderr to files here")
    p.add_argument("--host_list", default=None, help="accepted, no effect (one node per launcher)")
    p.add_argument("--ssh_port", default=None, help="accepted, no effect")
    _flags.add_bagua_flags(p)
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    for flag, value, minimum in (
        ("--nnodes", a.nnodes, 1),
        ("--nproc_per_node", a.nproc_per_node, 1),
        ("--node_rank", a.node_rank, 0),
    ):
        if value < minimum:
            p.error(f"{flag} must be >= {minimum}, got {value}")
    if a.module and a.no_python:
        p.error("--no_python and --module are mutually exclusive")
    more = {
        "host_list": "this launcher starts one node; baguarun starts several over ssh",
        "ssh_port": "this launcher starts one node; baguarun starts several over ssh",
    }
    return _flags.run(
        p,
        _flags.notices(p.prog, a, more),
        nproc_per_node=a.nproc_per_node,
        nnodes=a.nnodes,
        node_rank=a.node_rank,
        master_addr=a.master_addr,
        master_port=a.master_port,
        module=a.module,
        script=a.training_script,
        script_args=a.training_script_args,
        no_python=a.no_python,
        local_rank_arg=a.set_additional_flag,
        log_dir=a.logdir,
        extra_env=_flags.bagua_env(a),
    )


if __name__ == "__main__":
    sys.exit(main())
