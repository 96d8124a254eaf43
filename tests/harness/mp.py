"""Multi-process harness for tests: real processes, real sockets, hard timeouts.

``launch(script, world_size)`` starts ``world_size`` Python processes running
``script`` with torchrun's environment contract, waits for all of them with a
timeout, kills every one of them (whole process groups) on timeout or failure,
and returns their exit codes and output. Nothing is left behind.

Workers report per-case results with ``tests.harness.worker.report`` as JSON lines;
``Run.cases()`` collects them, so one multi-process session can check many cases
and pytest can still report each case on its own (see ``session_tests``).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

from bagua_core.launcher.ports import free_master_ports  # tests use mp.free_master_ports
from tests.harness.paths import REPO

CASE_PREFIX = "BAGUA-CASE "


def _slowdown() -> float:
    """BAGUA_TEST_SLOWDOWN=N stretches every launch's deadline N-fold, for runs that are
    that much slower (a sanitized build); pytest's own timeouts: run with ``-p no:timeout``."""
    text = os.environ.get("BAGUA_TEST_SLOWDOWN", "1")
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1.0:
        raise ValueError(f"BAGUA_TEST_SLOWDOWN must be a number >= 1, got {text!r}")
    return value


@dataclass
class Worker:
    rank: int
    returncode: Optional[int]
    stdout: str
    stderr: str


@dataclass
class Run:
    workers: List[Worker]
    timed_out: bool = False
    elapsed_s: float = 0.0

    def ok(self) -> bool:
        return not self.timed_out and all(w.returncode == 0 for w in self.workers)

    def summary(self, tail: int = 4000) -> str:
        parts = [f"timed_out={self.timed_out} elapsed={self.elapsed_s:.1f}s"]
        for w in self.workers:
            parts.append(
                f"--- rank {w.rank} rc={w.returncode}\n[stdout]\n{w.stdout[-tail:]}\n[stderr]\n{w.stderr[-tail:]}"
            )
        return "\n".join(parts)

    def check(self) -> "Run":
        assert self.ok(), self.summary()
        return self

    def check_case(self, case: str, ranks: int) -> None:
        """Asserts that at least ``ranks`` ranks reported ``case`` and none failed it."""
        recs = self.cases().get(case)
        assert recs is not None and len(recs) >= ranks, f"case {case} not reported by every rank\n{self.summary()}"
        errors = {r: rec["error"] for r, rec in recs.items() if not rec["ok"]}
        assert not errors, "\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items()))

    def cases(self) -> Dict[str, Dict[int, dict]]:
        """{case name: {rank: {"ok": bool, "error": str, ...}}}"""
        out: Dict[str, Dict[int, dict]] = {}
        for w in self.workers:
            for line in w.stdout.splitlines():
                if line.startswith(CASE_PREFIX):
                    rec = json.loads(line[len(CASE_PREFIX) :])
                    out.setdefault(rec["case"], {})[w.rank] = rec
        return out


def repo_env(extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """This environment with the repository first on PYTHONPATH, so that a Python process started
    from it (a worker script by path, ``python -c``) imports ``tests.harness`` and the packages
    from this tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def worker_env(
    rank: int,
    world_size: int,
    port: int,
    local_world_size: Optional[int] = None,
    extra: Optional[Mapping[str, str]] = None,
) -> Dict[str, str]:
    lws = local_world_size or world_size
    env = repo_env()
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank % lws),
        LOCAL_WORLD_SIZE=str(lws),
        NODE_RANK=str(rank // lws),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        BAGUA_TIMEOUT=env.get("BAGUA_TEST_TIMEOUT", "60"),
        PYTHONUNBUFFERED="1",
        JAX_PLATFORMS="cpu",
        OMP_NUM_THREADS="1",
    )
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


PORT_TAKEN = "Address already in use"


def launch(
    script: str,
    world_size: int,
    timeout: float = 120.0,
    args: Sequence[str] = (),
    local_world_size: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    per_rank_env: Optional[Mapping[int, Mapping[str, str]]] = None,
) -> Run:
    """Runs ``script`` (a path, or Python source text) on ``world_size`` processes.

    The ports come from :func:`free_master_ports`; another process may take one
    before rank 0 listens on it, so when rank 0 fails with "address already
    in use" on ports chosen here, the run starts again on fresh ports (at most
    three times)."""
    tmp = None
    if not os.path.exists(script):
        tmp = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
        tmp.write(script)
        tmp.close()
        script = tmp.name
    chosen_here = not any(
        "MASTER_PORT" in e or "BAGUA_STORE_PORT" in e for e in [env or {}, *(per_rank_env or {}).values()]
    )
    try:
        for _ in range(3):
            run, port_taken = _launch_once(
                script, world_size, timeout * _slowdown(), args, local_world_size, env, per_rank_env
            )
            if not (port_taken and chosen_here):
                return run
        return run
    finally:
        if tmp is not None:
            os.unlink(tmp.name)


def _output(files) -> str:
    out, err = files
    out.seek(0)
    err.seek(0)
    text = out.read() + err.read()
    out.seek(0, os.SEEK_END)
    err.seek(0, os.SEEK_END)
    return text


def _launch_once(script, world_size, timeout, args, local_world_size, env, per_rank_env):
    """One run; returns it and whether rank 0 found its port taken."""
    port = free_master_ports()
    procs, files = [], []
    start = time.monotonic()
    port_taken = False
    try:
        for r in range(world_size):
            e = worker_env(r, world_size, port, local_world_size, env)
            if per_rank_env and r in per_rank_env:
                e.update({k: str(v) for k, v in per_rank_env[r].items()})
            out = tempfile.TemporaryFile("w+")
            err = tempfile.TemporaryFile("w+")
            files.append((out, err))
            procs.append(
                subprocess.Popen(
                    [sys.executable, script, *args],
                    env=e,
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    cwd=REPO,
                    start_new_session=True,
                )
            )
        deadline = start + timeout
        timed_out = False
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                timed_out = True
                break
            if procs[0].poll() not in (None, 0) and PORT_TAKEN in _output(files[0]):
                port_taken = True
                break
            time.sleep(0.05)
        for p in procs:
            _kill_group(p)  # also reaps grandchildren left in the group
            p.wait()
        workers = []
        for r, (p, (out, err)) in enumerate(zip(procs, files)):
            out.seek(0)
            err.seek(0)
            workers.append(
                Worker(
                    r, None if timed_out and p.returncode == -signal.SIGKILL else p.returncode, out.read(), err.read()
                )
            )
        return Run(workers, timed_out, time.monotonic() - start), port_taken
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
                p.wait()
        for out, err in files:
            out.close()
            err.close()


@dataclass(frozen=True)
class Session:
    """One multi-process run of a case-based test file: its world size, the
    processes per emulated node (None: one node) and extra environment."""

    world_size: int
    local_world_size: Optional[int] = None
    env: Optional[Mapping[str, str]] = None


def session_tests(
    script: str,
    sessions: Mapping[str, Union[int, Session]],
    case_names: Callable[[str], Sequence[str]],
    *,
    timeout: float = 90.0,
    test_timeout: float = 180.0,
    requires: Sequence[str] = (),
    reporting_ranks: Optional[Callable[[str, str], int]] = None,
    returncode: Optional[Callable[[str, int], int]] = None,
    skip_reason: Optional[Callable[[], Optional[str]]] = None,
    marks: Sequence = (),
):
    """The two pytest tests of a case-based test file (which is also the
    worker script, started as ``script SESSION_NAME``):

    * ``test_case[SESSION-CASE]``: the case passed on every rank (or on
      ``reporting_ranks(session, case)`` ranks);
    * ``test_session_exits_cleanly[SESSION]``: no timeout, every worker exited
      with 0 (or ``returncode(session, rank)``).

    Each session runs once, on first use. ``requires`` names modules whose
    absence skips the tests, as does a reason from ``skip_reason()``;
    ``marks`` (e.g. ``pytest.mark.gpu``) go on both tests, and ``multiprocess``. Use as
    ``test_case, test_session_exits_cleanly = session_tests(__file__, ...)``.
    """
    import pytest

    specs = {n: s if isinstance(s, Session) else Session(int(s)) for n, s in sessions.items()}
    script = os.path.abspath(script)

    @functools.lru_cache(maxsize=None)
    def session(name: str) -> Run:
        for module in requires:
            pytest.importorskip(module)
        why = skip_reason() if skip_reason else None
        if why:
            pytest.skip(why)
        spec = specs[name]
        return launch(
            script, spec.world_size, timeout=timeout, args=[name], local_world_size=spec.local_world_size, env=spec.env
        )

    params = [pytest.param(n, c, id=f"{n}-{c}") for n in specs for c in case_names(n)]

    def marked(test):
        for mark in (pytest.mark.multiprocess, *marks):
            test = mark(test)
        return test

    @marked
    @pytest.mark.timeout(test_timeout)
    @pytest.mark.parametrize("name,case", params)
    def test_case(name, case):
        ranks = reporting_ranks(name, case) if reporting_ranks else specs[name].world_size
        session(name).check_case(case, ranks)

    @marked
    @pytest.mark.timeout(test_timeout)
    @pytest.mark.parametrize("name", list(specs))
    def test_session_exits_cleanly(name):
        run = session(name)
        assert not run.timed_out, run.summary()
        for w in run.workers:
            want = returncode(name, w.rank) if returncode else 0
            assert w.returncode == want, run.summary()

    return test_case, test_session_exits_cleanly
