"""How a benchmark script is its own driver: run without RANK in the
environment, it starts its workers through ``python -m bagua_core.run
--no-prefix`` and waits for them with a timeout; on a timeout, SIGTERM or
Ctrl-C it stops the launcher, which stops the workers (nothing is left
behind). Run with RANK (under bagua-run or torchrun), it is a worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence


class Stopped(Exception):
    """Raised in the driver by SIGTERM or SIGHUP (see :func:`raise_on_stop_signals`)."""


def _raise_stopped(signum, _frame):
    raise Stopped(signum)


def raise_on_stop_signals() -> None:
    """SIGTERM and SIGHUP raise :class:`Stopped` and SIGINT KeyboardInterrupt, so a driver's
    ``finally`` blocks run whichever way it is stopped. SIGINT's handler is set too: a
    process started in the background by a shell inherits SIGINT ignored."""
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _raise_stopped)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def worker_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """This environment, with the repository on PYTHONPATH, plus ``extra``."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def launcher_cmd(
    script: str,
    argv: Sequence[str],
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
) -> List[str]:
    """The command that starts ``script argv`` on ``nproc`` processes of node ``node_rank``."""
    cmd = [sys.executable, "-m", "bagua_core.run", "--nproc-per-node", str(nproc), "--no-prefix"]
    if nnodes > 1:
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank)]
    if master_addr is not None:
        cmd += ["--master-addr", master_addr]
    if master_port is not None:
        cmd += ["--master-port", str(master_port)]
    return cmd + [os.path.abspath(script), *argv]


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the driver dies, even by SIGKILL (Linux)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start(cmd: Sequence[str], env: Dict[str, str]) -> subprocess.Popen:
    """Starts a launcher that gets SIGTERM when this driver dies. Same process group as the driver,
    so that a signal to the group reaches the launcher too."""
    return subprocess.Popen(list(cmd), env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)


def wait_all(procs: Sequence[subprocess.Popen], timeout_s: float, what: str) -> int:
    """Waits for every launcher; returns 0, the first nonzero exit code, 124 after ``timeout_s``
    seconds or 130 on Ctrl-C / :class:`Stopped`. Whenever one fails or time is up, all are stopped."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                if failed:
                    for p in procs:
                        _stop(p)
                return failed[0] if failed else 0
            if time.monotonic() > deadline:
                print(f"{what}: no result after {timeout_s:.0f} s, stopping the run", file=sys.stderr, flush=True)
                for p in procs:
                    _stop(p)
                return 124
            time.sleep(0.1)
    except (KeyboardInterrupt, Stopped):
        for p in procs:
            _stop(p)
        return 130


def drive(script: str, argv: Sequence[str], nproc: int, timeout_s: float) -> int:
    """Runs ``script argv`` on ``nproc`` processes; returns the launcher's exit code."""
    proc = start(launcher_cmd(script, argv, nproc), worker_env())
    raise_on_stop_signals()
    return wait_all([proc], timeout_s, os.path.basename(script))


def kill_tree(pid: int) -> None:
    """SIGKILL to ``pid`` and every process under it, found through /proc
    (torch elastic starts its workers in sessions of their own, out of reach
    of a process-group kill)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    doomed, todo = [], [pid]
    while todo:
        p = todo.pop()
        doomed.append(p)
        todo += children.get(p, [])
    for p in doomed:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _stop(proc: subprocess.Popen) -> None:
    """The launcher forwards SIGTERM to the workers; if it is killed, they die with it (PDEATHSIG)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(script: str, work: Callable[[Sequence[str]], int], parse_args: Callable) -> int:
    """The entry point of a self-driving benchmark: ``work(argv)`` in a worker,
    else :func:`drive` with the ``--nproc`` and ``--timeout`` of ``parse_args(argv)``."""
    argv = sys.argv[1:]
    if "RANK" in os.environ:
        return work(argv)
    args = parse_args(argv)
    return drive(script, argv, args.nproc, args.timeout)


def main_driver(name: str, work: Callable[[Sequence[str]], int], drive: Callable[[Sequence[str]], int]) -> int:
    """The entry point of a benchmark that drives its own hosts (bandwidth.py, time_to_accuracy.py):
    ``work(argv)`` in a worker, else ``drive(argv)``, which removes what it created however it is
    stopped (Ctrl-C or :class:`Stopped`: exit code 130)."""
    argv = sys.argv[1:]
    if "RANK" in os.environ:
        return work(argv)
    try:
        return drive(argv)
    except (KeyboardInterrupt, Stopped):
        print(f"{name}: stopped; what it created is removed", file=sys.stderr, flush=True)
        return 130
