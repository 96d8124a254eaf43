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
from typing import Callable, Sequence


class _Stopped(Exception):
    pass


def _raise_stopped(signum, _frame):
    raise _Stopped(signum)


def drive(script: str, argv: Sequence[str], nproc: int, timeout_s: float) -> int:
    """Runs ``script argv`` on ``nproc`` processes; returns the launcher's exit code."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "bagua_core.run", "--nproc-per-node", str(nproc), "--no-prefix",
           os.path.abspath(script), *argv]
    # Same process group as this driver, so that a signal to the group reaches the launcher too.
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _raise_stopped)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"{os.path.basename(script)}: no result after {timeout_s:.0f} s, stopping the run",
              file=sys.stderr, flush=True)
        _stop(proc)
        return 124
    except (KeyboardInterrupt, _Stopped):
        _stop(proc)
        return 130


def _stop(proc: subprocess.Popen) -> None:
    """The launcher forwards SIGTERM to the workers; if it is killed, they die with it (PDEATHSIG)."""
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
