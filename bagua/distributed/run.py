"""``python -m bagua.distributed.run``: Bagua 0.9.2's torchrun-style launcher, on ``bagua-run``.

Flags as there (torch elastic's plus Bagua's): ``--nnodes`` (``N`` or
``MIN:MAX``), ``--nproc_per_node`` (a number, or ``auto``/``cpu``: the CPU
count), ``--node_rank``, ``--master_addr``, ``--master_port``,
``--rdzv_endpoint`` (``HOST[:PORT]``), ``--rdzv_backend`` (``static`` or
``c10d``), ``--rdzv_id``, ``--rdzv_conf``, ``--max_restarts``,
``--monitor_interval``, ``--standalone`` (one node on localhost),
``-m/--module``, ``--no_python``, ``--log_dir``, ``--bagua_service_port``,
``--default_bucket_size``, the autotune flags. An elastic job (a range of
nodes, restarts, or the c10d rendezvous) runs under torch elastic's agent,
with torchrun's meaning of these flags (:mod:`bagua.distributed.elastic`);
a fixed one on ``bagua-run``'s supervisor. Accepted without effect (a notice
each): ``--start_method``, ``--role``, ``--run_path``, ``-r/--redirects``,
``-t/--tee`` and ``--use_env``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from bagua.distributed import _flags
from bagua_core.launcher.cli import (
    RDZV_BACKENDS,
    int_at_least,
    is_elastic,
    nnodes_range,
    positive_seconds,
    rdzv_conf,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bagua.distributed.run",
        allow_abbrev=False,
        description="Bagua 0.9.2's torchrun-style launcher (through bagua-run).",
    )
    p.add_argument("--nnodes", type=nnodes_range, default="1", help="N, or MIN:MAX (elastic)")
    p.add_argument("--nproc_per_node", "--nproc-per-node", default="1", help="a number, or auto / cpu")
    p.add_argument("--node_rank", "--node-rank", type=int, default=0)
    p.add_argument("--master_addr", "--master-addr", default="127.0.0.1")
    p.add_argument("--master_port", "--master-port", type=int, default=None)
    p.add_argument("--rdzv_endpoint", "--rdzv-endpoint", default="", help="HOST[:PORT] of the rendezvous")
    p.add_argument("--rdzv_backend", "--rdzv-backend", default="static", choices=RDZV_BACKENDS)
    p.add_argument("--rdzv_id", "--rdzv-id", default="none")
    p.add_argument("--rdzv_conf", "--rdzv-conf", type=rdzv_conf, default="", help="key=value,... for the rendezvous")
    p.add_argument("--max_restarts", "--max-restarts", type=int_at_least(0, "--max_restarts"), default=0)
    p.add_argument("--monitor_interval", "--monitor-interval", type=positive_seconds, default=0.1)
    p.add_argument("--standalone", action="store_true", help="one node on localhost")
    p.add_argument("-m", "--module", action="store_true")
    p.add_argument("--no_python", "--no-python", action="store_true")
    p.add_argument("--log_dir", "--log-dir", default=None)
    for flag in ("--start_method", "--role", "-r", "-t"):
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
    min_nodes, nnodes = a.nnodes
    elastic = is_elastic(min_nodes, nnodes, a.max_restarts, a.rdzv_backend)
    if a.rdzv_endpoint and not elastic:  # a fixed job: the endpoint is the master's address
        host, _, rport = a.rdzv_endpoint.rpartition(":") if ":" in a.rdzv_endpoint else (a.rdzv_endpoint, "", "")
        addr = host
        if rport:
            try:
                port = int(rport)
            except ValueError:
                p.error(f"--rdzv_endpoint {a.rdzv_endpoint!r}: the port is not a number")
    if a.standalone:
        min_nodes, nnodes, addr, port = 1, 1, "127.0.0.1", None
    if a.module and a.no_python:
        p.error("--no_python and --module are mutually exclusive")
    more = {name: "torch elastic's default is used" for name in ("start_method", "role")}
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
        min_nodes=min_nodes,
        max_restarts=a.max_restarts,
        rdzv_backend=a.rdzv_backend,
        rdzv_endpoint=a.rdzv_endpoint if elastic else "",
        rdzv_id=a.rdzv_id,
        rdzv_conf=a.rdzv_conf,
        monitor_interval=a.monitor_interval,
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
