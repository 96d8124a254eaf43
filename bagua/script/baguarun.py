"""``baguarun``: Bagua 0.9.2's multi-host launcher, over SSH.

    baguarun --host_list node1,node2:2222 --nproc_per_node 8 train.py --lr 0.1

On host *i* of ``--host_list`` it runs, through ``ssh``::

    cd <this directory>; export PATH, LD_LIBRARY_PATH and the -x variables;
    <this Python> -m bagua.distributed.launch --nnodes N --node_rank i
        --master_addr <first host> --nproc_per_node P [flags] script args

so every host needs the same directory and the same Python (a shared file
system or identical installs), and passwordless ssh from this machine.
``BAGUA_SSH_COMMAND`` gives the ssh client and its options (default ``ssh``),
``BAGUA_NODE_DOMAIN_NAMES`` and ``BAGUA_SSH_PORT`` the defaults of
``--host_list`` and ``--ssh_port`` (:mod:`bagua_core.config`).

The job's store secret (``BAGUA_STORE_SECRET``: this environment's, else a new
one) reaches every host on ssh's standard input, never on a command line. That
input stays open while the job runs: when it closes (``baguarun`` stopped,
killed, or its connection lost) the host's launcher gets SIGTERM and stops its
workers. When one host fails, the others are stopped the same way and
``baguarun`` exits with the failed host's code; Ctrl-C stops every host.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from typing import List, Optional, Sequence, Tuple

from bagua.distributed import _flags
from bagua_core import config

GRACE_PERIOD_S = 15.0  # time a stopped host gets to stop its workers before its ssh is killed
POLL_INTERVAL_S = 0.1
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="baguarun",
        allow_abbrev=False,
        description="Start a Bagua job on several hosts over ssh (one bagua.distributed.launch per host).",
    )
    p.add_argument(
        "--host_list",
        default=None,
        help="host[:sshport],... ; the first host is the master (default: $BAGUA_NODE_DOMAIN_NAMES)",
    )
    p.add_argument(
        "--ssh_port",
        type=int,
        default=None,
        help="ssh port of hosts given without one (default: $BAGUA_SSH_PORT, else ssh's own)",
    )
    p.add_argument("--nproc_per_node", type=int, required=True, help="workers per host")
    p.add_argument("--master_port", type=int, default=None, help="port on the first host (default 29500)")
    p.add_argument("--no_python", action="store_true", help="run the script as a program, not through Python")
    p.add_argument(
        "-x",
        dest="exports",
        action="append",
        default=[],
        metavar="VAR[=VALUE]",
        help="export VAR to every host (its value here, or VALUE); repeatable",
    )
    _flags.add_bagua_flags(p)
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def parse_hosts(text: str, default_port: Optional[int]) -> List[Tuple[str, Optional[int]]]:
    """``host[:port],...`` (``[v6addr]:port`` for IPv6) -> [(host, port or None)]."""
    hosts = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise ValueError(f"empty host name in {text!r}")
        host, port = item, default_port
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", item)
        if m:
            host, port = m.group(1), int(m.group(2)) if m.group(2) else default_port
        elif item.count(":") == 1:
            host, _, digits = item.partition(":")
            if not digits.isdigit():
                raise ValueError(f"{item!r}: the ssh port must be a number")
            port = int(digits)
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"{item!r}: ssh port {port} is out of range")
        hosts.append((host, port))
    return hosts


def exported_env(exports: Sequence[str]) -> List[Tuple[str, str]]:
    """PATH and LD_LIBRARY_PATH as here, then each ``-x VAR[=VALUE]``."""
    out = [(k, os.environ[k]) for k in ("PATH", "LD_LIBRARY_PATH") if k in os.environ]
    for item in exports:
        name, has_value, value = item.partition("=")
        if not _ENV_NAME.match(name):
            raise ValueError(f"-x {item!r}: {name!r} is not a variable name")
        if not has_value:
            if name not in os.environ:
                raise ValueError(f"-x {name}: {name} is not set here (give -x {name}=VALUE)")
            value = os.environ[name]
        out.append((name, value))
    return out


def remote_script(
    node_rank: int, nnodes: int, master_addr: str, args: argparse.Namespace, env: Sequence[Tuple[str, str]]
) -> str:
    """The POSIX shell script host ``node_rank`` runs. Its first input line is
    the store secret; the end of its input stops the node's launcher."""
    q = shlex.quote
    launch = [
        sys.executable,
        "-m",
        "bagua.distributed.launch",
        f"--nnodes={nnodes}",
        f"--node_rank={node_rank}",
        f"--master_addr={master_addr}",
        f"--nproc_per_node={args.nproc_per_node}",
    ]
    if args.master_port is not None:
        launch.append(f"--master_port={args.master_port}")
    if args.no_python:
        launch.append("--no_python")
    launch += _flags.flag_args(args) + [args.training_script, *args.training_script_args]
    lines = [
        f"cd {q(os.getcwd())} || exit 1",
        f"IFS= read -r {config.STORE_SECRET_ENV} || exit 1",
        f"export {config.STORE_SECRET_ENV}",
        "exec 3<&0",
        *(f"export {k}={q(v)}" for k, v in env),
        " ".join(q(a) for a in launch) + " </dev/null &",
        "pid=$!",
        # an asynchronous command's input is /dev/null unless redirected: hand it ours
        "(cat <&3 >/dev/null; kill -TERM $pid) >/dev/null 2>&1 &",
        "watcher=$!",
        "wait $pid; rc=$?",
        "kill $watcher 2>/dev/null",
        "exit $rc",
    ]
    return "sh -c " + q("\n".join(lines))


class Job:
    """One ssh process per host, watched until all end or one fails."""

    def __init__(self, commands: Sequence[Tuple[str, List[str]]], secret: str):
        self._hosts = [host for host, _ in commands]
        self._procs: List[subprocess.Popen] = []
        self._signals: List[int] = []
        try:
            for _, argv in commands:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True)
                self._procs.append(proc)
                proc.stdin.write((secret + "\n").encode())
                proc.stdin.flush()
        except BaseException:
            self._stop()
            raise

    def _on_signal(self, signum, _frame) -> None:
        self._signals.append(signum)

    def _stop(self) -> None:
        """Closes every host's input (its launcher stops its workers), then
        kills the ssh processes that have not ended within the grace period."""
        for proc in self._procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + GRACE_PERIOD_S
        for proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            while not self._signals:
                codes = [p.poll() for p in self._procs]
                failed = [(h, c) for h, c in zip(self._hosts, codes) if c not in (None, 0)]
                if failed:
                    host, code = failed[0]
                    why = "ssh failed (connection or authentication)" if code == 255 else f"exit code {code}"
                    print(
                        f"baguarun: host {host} failed ({why}); stopping the other hosts", file=sys.stderr, flush=True
                    )
                    self._stop()
                    return code
                if all(c == 0 for c in codes):
                    return 0
                time.sleep(POLL_INTERVAL_S)
            signum = self._signals[0]
            print(f"baguarun: received {signal.Signals(signum).name}; stopping every host", file=sys.stderr, flush=True)
            self._stop()
            return 128 + signum
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        settings = config.ssh_settings()
    except config.ConfigError as e:
        p.error(str(e))
    if a.nproc_per_node < 1:
        p.error(f"--nproc_per_node must be >= 1, got {a.nproc_per_node}")
    host_list = a.host_list or settings.host_list
    if not host_list:
        p.error("no hosts: give --host_list or set BAGUA_NODE_DOMAIN_NAMES")
    try:
        hosts = parse_hosts(host_list, a.ssh_port if a.ssh_port is not None else settings.ssh_port)
        env = exported_env(a.exports)
    except ValueError as e:
        p.error(str(e))
    secret = os.environ.get(config.STORE_SECRET_ENV) or secrets.token_hex(32)
    master = hosts[0][0]
    commands = []
    for rank, (host, port) in enumerate(hosts):
        argv_ = [
            *settings.ssh_command,
            *(["-p", str(port)] if port is not None else []),
            host,
            remote_script(rank, len(hosts), master, a, env),
        ]
        commands.append((host if port is None else f"{host}:{port}", argv_))
    return Job(commands, secret).run()


if __name__ == "__main__":
    sys.exit(main())
