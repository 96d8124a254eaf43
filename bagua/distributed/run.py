"""``python -m bagua.distributed.run``: Bagua 0.9.2's torchrun-style launcher, on ``bagua-run``.

Flags as there (torch elastic's plus Bagua's): ``--nnodes`` (``N`` or a fixed
``N:N``), ``--nproc_per_node`` (a number, or ``auto``/``cpu``: the CPU count),
``--node_rank``, ``--master_addr``, ``--master_port``, ``--rdzv_endpoint``
(``HOST[:PORT]``, used as the master address), ``--standalone`` (one node on
localhost), ``-m/--module``, ``--no_python``, ``--log_dir``,
``--bagua_service_port``, ``--default_bucket_size``, the autotune flags. Accepted without effect
(a notice each): ``--rdzv_backend``, ``--rdzv_id``, ``--rdzv_conf``,
``--max_restarts`` (no restarts: a failed worker stops the job),
``--monitor_interval``, ``--start_method``, ``--role``, ``--run_path``,
``-r/--redirects``, ``-t/--tee`` and ``--use_env``.
Elastic ranges (``--nnodes 1:4``) are refused: the job size is fixed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from bagua.distributed import _flags

_ELASTIC = "this launcher is not elastic: a fixed set of workers, no restarts"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bagua.distributed.run",
        allow_abbrev=False,
        description="Bagua 0.9.2's torchrun-style launcher (through bagua-run).",
    )
    p.add_argument("--nnodes", default="1", help="N, or N:N (elastic ranges are not supported)")
    p.add_argument("--nproc_per_node", "--nproc-per-node", default="1", help="a number, or auto / cpu")
    p.add_argument("--node_rank", "--node-rank", type=int, default=0)
    p.add_argument("--master_addr", "--master-addr", default="127.0.0.1")
    p.add_argument("--master_port", "--master-port", type=int, default=None)
    p.add_argument("--rdzv_endpoint", "--rdzv-endpoint", default="", help="HOST[:PORT] of the master")
    p.add_argument("--standalone", action="store_true", help="one node on localhost")
    p.add_argument("-m", "--module", action="store_true")
    p.add_argument("--no_python", "--no-python", action="store_true")
    p.add_argument("--log_dir", "--log-dir", default=None)
    for flag in (
        "--rdzv_backend",
        "--rdzv_id",
        "--rdzv_conf",
        "--max_restarts",
        "--monitor_interval",
        "--start_method",
        "--role",
        "-r",
        "-t",
    ):
        long = {"-r": "--redirects", "-t": "--tee"}.get(flag)
        names = [flag, long] if long else [flag, flag.replace("_", "-")]
        p.add_argument(*names, default=None, help="accepted, no effect")
    p.add_argument(
        "--run_path", "--run-path", action="store_const", const=True, default=None, help="accepted, no effect"
    )
    p.add_argument(
        "--use_env",
        "--use-env",
        action="store_const",
        const=True,
        default=None,
        help="accepted, no effect (the environment is always set)",
    )
    _flags.add_bagua_flags(p)
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def _nnodes(p: argparse.ArgumentParser, text: str) -> int:
    lo, _, hi = text.partition(":")
    try:
        n, m = int(lo), int(hi or lo)
    except ValueError:
        p.error(f"--nnodes {text!r} is not N or N:N")
    if n != m:
        p.error(f"--nnodes {text}: {_ELASTIC}; give a fixed number of nodes")
    if n < 1:
        p.error(f"--nnodes must be >= 1, got {n}")
    return n


def _nproc(p: argparse.ArgumentParser, text: str) -> int:
    if text in ("auto", "cpu"):
        return os.cpu_count() or 1
    try:
        n = int(text)
    except ValueError:
        p.error(f"--nproc_per_node {text!r} is not a number, auto or cpu")
    if n < 1:
        p.error(f"--nproc_per_node must be >= 1, got {n}")
    return n


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    addr, port = a.master_addr, a.master_port
    if a.rdzv_endpoint:
        host, _, rport = a.rdzv_endpoint.rpartition(":") if ":" in a.rdzv_endpoint else (a.rdzv_endpoint, "", "")
        addr = host
        if rport:
            try:
                port = int(rport)
            except ValueError:
                p.error(f"--rdzv_endpoint {a.rdzv_endpoint!r}: the port is not a number")
    nnodes = _nnodes(p, a.nnodes)
    if a.standalone:
        nnodes, addr, port = 1, "127.0.0.1", None
    if a.module and a.no_python:
        p.error("--no_python and --module are mutually exclusive")
    more = {
        name: _ELASTIC
        for name in ("rdzv_backend", "rdzv_id", "rdzv_conf", "max_restarts", "monitor_interval", "start_method", "role")
    }
    more.update(
        redirects="output is prefixed with the rank (or in --log_dir)",
        tee="output is prefixed with the rank (or in --log_dir)",
        run_path="the script runs in a fresh interpreter",
        use_env="the environment is always set",
    )
    return _flags.run(
        p,
        _flags.notices(p.prog, a, more),
        nproc_per_node=_nproc(p, a.nproc_per_node),
        nnodes=nnodes,
        node_rank=a.node_rank,
        master_addr=addr,
        master_port=port,
        module=a.module,
        script=a.training_script,
        script_args=a.training_script_args,
        no_python=a.no_python,
        log_dir=a.log_dir,
        extra_env=_flags.bagua_env(a),
    )


if __name__ == "__main__":
    sys.exit(main())
