"""Command-line arguments of ``bagua-run`` and their validation."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import secrets
from typing import List, Optional, Sequence, Tuple

from bagua_core import __version__, config
from bagua_core.launcher.ports import free_master_ports

MULTI_NODE_DEFAULT_PORT = 29500
DEFAULT_GRACE_PERIOD_S = 10.0

_EPILOG = """\
Every worker gets torchrun's environment contract: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT (and
PYTHONUNBUFFERED=1), and OMP_NUM_THREADS=1 unless it is set, with more than
one worker per node (as torchrun does: N workers each using every core would
oversubscribe the machine). Bagua's store listens on MASTER_PORT + 1 unless
BAGUA_STORE_PORT says otherwise. Everything after SCRIPT is passed to it
untouched. SIGINT/SIGTERM are forwarded to every worker; when one worker fails
the others are stopped and bagua-run exits with the failed worker's code.

Elastic jobs run on torch elastic's agent and rendezvous, with torchrun's
meaning of the flags: --nnodes MIN:MAX (nodes may come and go), --max-restarts
N (a failed worker restarts this node's workers, and every node meets again),
--rdzv-backend c10d. Their workers also get TORCHELASTIC_RESTART_COUNT and
TORCHELASTIC_RUN_ID; when one fails past the restarts, the job ends with its code.

examples:
  bagua-run --nproc-per-node 4 train.py --lr 0.1
  bagua-run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --nproc-per-node 8 -m mypkg.train
  bagua-run --nnodes 1:4 --nproc-per-node 8 --max-restarts 3 --rdzv-backend c10d \\
            --rdzv-endpoint 10.0.0.1:29400 --rdzv-id job7 train.py
"""

RDZV_BACKENDS = ("static", "c10d")


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    grace_period_s: float
    prefix: bool
    module: bool
    script: str
    script_args: Tuple[str, ...]
    # The rendezvous store's secret handed to the workers (single-node jobs
    # without one of their own; see bagua_core.config).
    store_secret: str = ""
    # Set by the Bagua 0.9 launchers (bagua.distributed.launch / .run):
    no_python: bool = False  # run SCRIPT itself, not through the Python interpreter
    local_rank_arg: bool = False  # append --local_rank=N to the script's arguments
    log_dir: Optional[str] = None  # each worker's output to files there instead of the prefixed stream
    extra_env: Tuple[Tuple[str, str], ...] = ()  # settings given as flags, for every worker
    # Elastic launch (bagua.distributed.elastic), torchrun's meanings; nnodes is the maximum.
    min_nodes: int = 0  # 0: nnodes
    max_restarts: int = 0
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""  # HOST[:PORT]; default MASTER_ADDR:MASTER_PORT
    rdzv_id: str = "none"
    rdzv_conf: Tuple[Tuple[str, str], ...] = ()
    monitor_interval: float = 0.1

    def __post_init__(self) -> None:
        if not self.min_nodes:
            object.__setattr__(self, "min_nodes", self.nnodes)

    @property
    def elastic(self) -> bool:
        """Run under torch elastic's agent (see bagua.distributed.elastic)."""
        return is_elastic(self.min_nodes, self.nnodes, self.max_restarts, self.rdzv_backend)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank


def is_elastic(min_nodes: int, nnodes: int, max_restarts: int, rdzv_backend: str) -> bool:
    """A range of nodes, restarts or the c10d rendezvous make a job elastic (torch elastic's agent)."""
    return min_nodes < nnodes or max_restarts > 0 or rdzv_backend != "static"


def int_at_least(minimum: int, what: str):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be >= {minimum}, got {n}")
        return n

    return parse


def nnodes_range(text: str) -> Tuple[int, int]:
    """``N`` or ``MIN:MAX`` (torchrun's ``--nnodes``) as (MIN, MAX)."""
    lo, sep, hi = str(text).partition(":")
    try:
        low, high = int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or MIN:MAX") from None
    if low < 1:
        raise argparse.ArgumentTypeError(f"the number of nodes must be >= 1, got {text}")
    if low > high:
        raise argparse.ArgumentTypeError(f"MIN:MAX needs MIN <= MAX, got {text}")
    return low, high


def rdzv_conf(text: str) -> Tuple[Tuple[str, str], ...]:
    """``key=value,key2=value2`` (torchrun's ``--rdzv-conf``)."""
    out = []
    for item in filter(None, (t.strip() for t in str(text).split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--rdzv-conf takes key=value[,key=value...], got {text!r}")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def positive_seconds(text: str) -> float:
    x = _grace(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return x


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    # The store uses MASTER_PORT + 1 by default, so that one must be a port too.
    if not 1 <= n <= 65534:
        raise argparse.ArgumentTypeError(f"must be in 1..65534 (the store uses MASTER_PORT + 1), got {n}")
    return n


def _grace(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.0 <= x < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bagua-run",
        description="Start the workers of one node of a Bagua (or any torchrun-style) job.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    # The underscore spellings are those of torchrun and of the original Bagua launcher.
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=int_at_least(1, "--nproc-per-node"),
        default=1,
        metavar="N",
        help="workers on this node (default 1)",
    )
    p.add_argument(
        "--nnodes",
        type=nnodes_range,
        default=(1, 1),
        metavar="M|MIN:MAX",
        help="number of nodes, or its range in an elastic job (default 1)",
    )
    p.add_argument(
        "--node-rank",
        "--node_rank",
        type=int_at_least(0, "--node-rank"),
        default=0,
        metavar="K",
        help="rank of this node, 0..M-1 (default 0)",
    )
    p.add_argument(
        "--master-addr",
        "--master_addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address of node 0 (default 127.0.0.1)",
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        type=_port,
        default=None,
        metavar="PORT",
        help="port on node 0 (default: a free port P with P+1 free on a single node; "
        f"{MULTI_NODE_DEFAULT_PORT} with several nodes)",
    )
    p.add_argument(
        "--grace-period",
        type=_grace,
        default=DEFAULT_GRACE_PERIOD_S,
        metavar="SECONDS",
        help="time stopped workers get before SIGKILL (default %(default)s)",
    )
    p.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int_at_least(0, "--max-restarts"),
        default=0,
        metavar="N",
        help="elastic: worker group restarts after a failure (default 0)",
    )
    p.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        choices=RDZV_BACKENDS,
        default="static",
        help="elastic: torch elastic's rendezvous (default static; c10d for nodes that come and go)",
    )
    p.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        default="",
        metavar="HOST[:PORT]",
        help="elastic: the rendezvous' address (default MASTER_ADDR:MASTER_PORT)",
    )
    p.add_argument("--rdzv-id", "--rdzv_id", default="none", metavar="ID", help="elastic: the job's id")
    p.add_argument(
        "--rdzv-conf", "--rdzv_conf", type=rdzv_conf, default=(), metavar="K=V,...", help="elastic: rendezvous settings"
    )
    p.add_argument(
        "--monitor-interval",
        "--monitor_interval",
        type=positive_seconds,
        default=0.1,
        metavar="SECONDS",
        help="elastic: how often the agent checks the workers (default 0.1)",
    )
    p.add_argument("--no-prefix", action="store_true", help="do not prefix the workers' output lines with their rank")
    p.add_argument("--version", action="version", version=f"bagua-run (bagua {__version__})")
    p.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name, run like python -m")
    p.add_argument("script", metavar="SCRIPT", help="the Python script (or module, with -m) to run")
    p.add_argument(
        "script_args", nargs=argparse.REMAINDER, metavar="...", help="arguments for SCRIPT, passed untouched"
    )
    return p


def _is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def parse_args(argv: Optional[Sequence[str]] = None) -> Tuple[LaunchConfig, List[str]]:
    """Parses and validates ``argv``; returns the config and warnings to print.

    Invalid arguments end the process through ``argparse`` (message, exit code 2).
    """
    parser = build_parser()
    a = parser.parse_args(argv)
    return make_config(
        parser,
        nproc_per_node=a.nproc_per_node,
        nnodes=a.nnodes[1],
        min_nodes=a.nnodes[0],
        max_restarts=a.max_restarts,
        rdzv_backend=a.rdzv_backend,
        rdzv_endpoint=a.rdzv_endpoint,
        rdzv_id=a.rdzv_id,
        rdzv_conf=a.rdzv_conf,
        monitor_interval=a.monitor_interval,
        node_rank=a.node_rank,
        master_addr=a.master_addr,
        master_port=a.master_port,
        module=a.module,
        script=a.script,
        script_args=a.script_args,
        grace_period_s=a.grace_period,
        prefix=not a.no_prefix,
    )


def make_config(
    parser: argparse.ArgumentParser,
    *,
    nproc_per_node: int,
    nnodes: int,
    node_rank: int,
    master_addr: str,
    master_port: Optional[int],
    module: bool,
    script: str,
    script_args: Sequence[str],
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S,
    prefix: bool = True,
    no_python: bool = False,
    **launcher_fields,
) -> Tuple[LaunchConfig, List[str]]:
    """The checks and defaults of every launcher (``bagua-run`` and Bagua 0.9's):
    errors through ``parser.error``, the config, and warnings to print."""
    min_nodes = launcher_fields.get("min_nodes") or nnodes
    if min_nodes > nnodes:
        parser.error(f"--nnodes {min_nodes}:{nnodes}: MIN must not exceed MAX")
    if min_nodes < nnodes and launcher_fields.get("rdzv_backend", "static") == "static":
        launcher_fields["rdzv_backend"] = "c10d"  # nodes that come and go need a dynamic rendezvous (as torchrun)
    if node_rank >= nnodes:
        parser.error(f"--node-rank {node_rank} is out of range for --nnodes {nnodes} (0..{nnodes - 1})")
    if not master_addr.strip():
        parser.error("--master-addr must not be empty")
    if not module and not no_python and not os.path.exists(script):
        parser.error(f"script {script!r} not found (use -m to run a module)")
    if module and not script.strip():
        parser.error("-m needs a module name")

    warnings = []
    endpoint = launcher_fields.get("rdzv_endpoint", "")
    if endpoint:
        host, _, port_text = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
        if not host.strip() or (port_text and not port_text.isdigit()):
            parser.error(f"--rdzv-endpoint {endpoint!r} is not HOST[:PORT]")
    if nnodes > 1 and _is_loopback(master_addr) and not endpoint:
        warnings.append(
            f"--nnodes {nnodes} with a loopback --master-addr {master_addr}: other machines cannot reach it"
        )
    secret = ""
    if not os.environ.get(config.STORE_SECRET_ENV):
        if nnodes == 1 and not config.lighthouse_address():
            secret = secrets.token_hex(32)  # every worker of this job is started here
        else:  # several nodes, or replicas of a live job (each started by its own bagua-run)
            warnings.append(
                f"{config.STORE_SECRET_ENV} is not set: the rendezvous store accepts any client "
                f"that reaches {master_addr}; set it to the same secret on every node (every replica of a live job)"
            )
    port = master_port
    if port is None:
        port = free_master_ports() if nnodes == 1 else MULTI_NODE_DEFAULT_PORT

    cfg = LaunchConfig(
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr.strip(),
        master_port=port,
        grace_period_s=grace_period_s,
        prefix=prefix,
        module=module,
        script=script,
        script_args=tuple(script_args),
        no_python=no_python,
        store_secret=secret,
        **launcher_fields,
    )
    return cfg, warnings
