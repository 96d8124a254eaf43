"""Running a benchmark script from the tests the way a user runs it: in driver mode (no RANK in the
environment, so the script starts its own workers through bagua-run), with the repository importable,
and a way to show what it printed when it fails. Also whether this machine can make the emulated
hosts of benchmarks/_hosts.py (network namespaces, as root)."""

from __future__ import annotations

import os
import subprocess
import sys

import _hosts  # benchmarks/_hosts.py: benchmarks/ is on sys.path (pyproject's pytest pythonpath)
import pytest

from tests.harness.mp import repo_env
from tests.harness.paths import BENCHMARKS, REPO


def table_rows(stdout: str) -> dict:
    """{first cell: line} of the Markdown table rows a benchmark printed."""
    return {line.split("|")[1].strip(): line for line in stdout.splitlines() if line.startswith("| ")}


def script_path(name: str) -> str:
    return os.path.join(BENCHMARKS, name)


def driver_env() -> dict:
    """This environment, with the repository on PYTHONPATH and no launcher variables."""
    env = repo_env()
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)  # the driver mode is chosen by the absence of RANK
    return env


def run_script(name: str, *args: str, timeout: float = 100) -> subprocess.CompletedProcess:
    """benchmarks/``name`` with ``args``; the scripts stop their own workers after their --timeout,
    ``timeout`` here is a backstop."""
    return subprocess.run(
        [sys.executable, script_path(name), *args],
        cwd=REPO,
        env=driver_env(),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def start_script(name: str, *args: str) -> subprocess.Popen:
    """benchmarks/``name`` in the background, stdout and stderr together on ``stdout``."""
    return subprocess.Popen(
        [sys.executable, script_path(name), *args],
        cwd=REPO,
        env=driver_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def explain(p: subprocess.CompletedProcess) -> str:
    return f"rc={p.returncode}\n[stdout]\n{p.stdout[-4000:]}\n[stderr]\n{p.stderr[-4000:]}"


def table_cells(line: str):
    """The cells of a markdown table row."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _namespaces_unusable_reason():
    reason = _hosts.unavailable_reason()
    if reason is not None:
        return reason
    probe = f"{_hosts.NETNS_PREFIX}probe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None if p.returncode == 0 else f"'ip netns add' fails here: {p.stderr.strip()}"


_reason = _namespaces_unusable_reason()
needs_netns = pytest.mark.skipif(_reason is not None, reason=f"shaped runs need network namespaces: {_reason}")
