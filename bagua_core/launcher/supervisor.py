"""Starts the workers, watches them, forwards signals and makes sure none is left behind.

Each worker runs in its own session, so it is the leader of its own process
group: signals go to the whole group (the worker and anything it started, e.g.
data-loader processes) and a Ctrl-C on the terminal reaches only the launcher,
which forwards it once. A finished worker's group is killed before the worker
is reaped (its zombie keeps the group id from being reused meanwhile), so
nothing it started outlives it. On Linux a worker also dies if the launcher is
killed outright (SIGKILL), through PR_SET_PDEATHSIG.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from bagua_core.launcher.cli import LaunchConfig
from bagua_core.launcher.contract import log_paths, worker_command, worker_env
from bagua_core.launcher.output import LineSink, start_pump

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_INTERVAL_S = 0.05
PUMP_DRAIN_TIMEOUT_S = 5.0


def exit_code(returncode: int) -> int:
    """A shell-style exit code: the code itself, or 128 + signal number."""
    return returncode if returncode >= 0 else 128 - returncode


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _die_with_parent_hook() -> Optional[Callable[[], None]]:
    """A preexec_fn that makes the child get SIGKILL when the launcher dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    PR_SET_PDEATHSIG = 1
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


@dataclasses.dataclass
class Worker:
    local_rank: int
    rank: int
    proc: subprocess.Popen
    returncode: Optional[int] = None
    pumps: List[threading.Thread] = dataclasses.field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.returncode is None

    def poll(self) -> Optional[int]:
        """The exit status once the worker has ended (its group is killed first), else None."""
        if self.returncode is not None:
            return self.returncode
        pid = self.proc.pid
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = True  # already reaped elsewhere; Popen knows the status
        if info is None:
            return None
        _killpg(pid, signal.SIGKILL)  # whatever the worker left running in its group
        self.returncode = self.proc.wait()
        return self.returncode


class Supervisor:
    def __init__(self, cfg: LaunchConfig, stdout=None, stderr=None):
        self.cfg = cfg
        self._stdout = stdout if stdout is not None else sys.stdout
        self._stderr = stderr if stderr is not None else sys.stderr
        self.workers: List[Worker] = []
        self._signals: List[int] = []  # signals the launcher received, in order
        self._stop_reason: Optional[str] = None
        self._kill_deadline: Optional[float] = None
        self._sigkilled = 0  # workers that needed SIGKILL
        self._sigkill_why = ""
        self._first_failure: Optional[Worker] = None
        self._stopped = 0  # workers still running when the stop began

    # -- signals ---------------------------------------------------------------

    def _on_signal(self, signum, _frame) -> None:
        self._signals.append(signum)  # acted upon by the watch loop, outside the handler

    def _install_handlers(self) -> Dict[int, object]:
        previous = {}
        if threading.current_thread() is not threading.main_thread():
            return previous  # signal handlers can only be set from the main thread
        for s in FORWARDED_SIGNALS:
            previous[s] = signal.signal(s, self._on_signal)
        return previous

    @staticmethod
    def _restore_handlers(previous: Dict[int, object]) -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    # -- life cycle ------------------------------------------------------------

    def _start(self) -> None:
        to_files = self.cfg.log_dir is not None
        pumped = self.cfg.prefix and not to_files
        capture = subprocess.PIPE if pumped else None
        hook = _die_with_parent_hook()
        if to_files:
            os.makedirs(self.cfg.log_dir, exist_ok=True)
        for local_rank in range(self.cfg.nproc_per_node):
            if self._signals:
                return  # interrupted while starting: start no more
            out = err = capture
            if to_files:
                out, err = (open(p, "wb") for p in log_paths(self.cfg, local_rank))
            try:
                proc = subprocess.Popen(
                    worker_command(self.cfg, local_rank),
                    env=worker_env(self.cfg, local_rank, os.environ),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    preexec_fn=hook,
                )
            finally:
                if to_files:  # the worker holds its own copies
                    out.close()
                    err.close()
            self.workers.append(Worker(local_rank, self.cfg.rank(local_rank), proc))
        # Threads only after every fork: preexec_fn is not safe while other threads run.
        if pumped:
            out, err = LineSink(self._stdout), LineSink(self._stderr)
            for w in self.workers:
                prefix = f"[rank {w.rank}] "
                w.pumps.append(start_pump(w.proc.stdout, prefix, out, f"rank{w.rank}-stdout"))
                w.pumps.append(start_pump(w.proc.stderr, prefix, err, f"rank{w.rank}-stderr"))

    def _stop(self, signum: int, reason: str) -> None:
        """Sends ``signum`` to every running worker's group; SIGKILL follows after the grace period."""
        if self._stop_reason is None:
            self._stop_reason = reason
            self._kill_deadline = time.monotonic() + self.cfg.grace_period_s
            self._stopped = sum(w.running for w in self.workers)
        for w in self.workers:
            if w.running:
                _killpg(w.proc.pid, signum)

    def _kill_remaining(self, why: str) -> None:
        for w in self.workers:
            if w.poll() is None:
                self._sigkilled += 1
                self._sigkill_why = self._sigkill_why or why
                _killpg(w.proc.pid, signal.SIGKILL)
        self._kill_deadline = float("inf")

    def _watch(self) -> None:
        handled_signals = 0
        while True:
            for w in self.workers:
                if w.running and w.poll() is not None and w.returncode != 0:
                    if self._stop_reason is None:
                        self._first_failure = w
                        self._stop(signal.SIGTERM, "failure")
            while handled_signals < len(self._signals):
                signum = self._signals[handled_signals]
                handled_signals += 1
                if handled_signals == 1:
                    self._stop(signum, "signal")  # forwarded even while stopping after a failure
                else:
                    self._kill_remaining(f"on a second {signal_name(signum)}")
            if not any(w.running for w in self.workers):
                return
            if self._kill_deadline is not None and time.monotonic() >= self._kill_deadline:
                self._kill_remaining(f"after the {self.cfg.grace_period_s:g} s grace period")
            time.sleep(POLL_INTERVAL_S)

    def _drain_output(self) -> None:
        deadline = time.monotonic() + PUMP_DRAIN_TIMEOUT_S
        for w in self.workers:
            for t in w.pumps:
                t.join(max(0.0, deadline - time.monotonic()))

    def _summary(self) -> Optional[str]:
        killed = f"; {self._sigkilled} worker(s) got SIGKILL {self._sigkill_why}" if self._sigkilled else ""
        if self._first_failure is not None:
            w = self._first_failure
            rc = w.returncode
            how = f"exit code {rc}" if rc >= 0 else f"killed by {signal_name(-rc)} (exit code {exit_code(rc)})"
            return (
                f"bagua-run: rank {w.rank} (local rank {w.local_rank}) failed with {how}; "
                f"stopped the other {self._stopped} running worker(s){killed}"
            )
        if self._signals:
            return (
                f"bagua-run: received {signal_name(self._signals[0])}; forwarded it to the "
                f"{self._stopped} running worker(s) and stopped them{killed}"
            )
        return None

    def run(self) -> int:
        """Runs the workers to the end; returns the launcher's exit code."""
        previous = self._install_handlers()
        try:
            try:
                self._start()
                self._watch()
            except BaseException:
                for w in self.workers:
                    if w.running:  # a reaped worker's group id may belong to someone else by now
                        _killpg(w.proc.pid, signal.SIGKILL)
                        w.proc.wait()
                raise
            self._drain_output()
        finally:
            self._restore_handlers(previous)

        summary = self._summary()
        if summary:
            print(summary, file=self._stderr, flush=True)
        if self._first_failure is not None:
            return exit_code(self._first_failure.returncode)
        if self._signals:
            return 128 + self._signals[0]
        return 0
