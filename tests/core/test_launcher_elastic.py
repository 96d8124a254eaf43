"""bagua-run's (``python -m bagua.run``) elastic jobs, on torch elastic's agent and rendezvous, with
real worker processes: torchrun's environment (restart count, run id, world
size), restarts after a failure up to --max-restarts then the worker's exit
code, no threads, descriptors or sockets gained by the launcher over three
restarts, nothing left running, and a clear error from an unreachable
rendezvous within its timeout. Bagua training under these launches (a
restart that resumes, a node that joins) is in
tests/compat/test_bagua_compat_launch.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.harness.paths import REPO

pytestmark = [pytest.mark.timeout(120), pytest.mark.multiprocess]

WORKER = """
import json, os, sys
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "BAGUA_DEFAULT_BUCKET_SIZE")

def agent():  # what the long-lived launcher process holds as this generation starts
    proc = f"/proc/{os.getppid()}"
    links = []
    for fd in os.listdir(proc + "/fd"):
        try:
            links.append(os.readlink(f"{proc}/fd/{fd}"))
        except OSError:
            pass
    return {"threads": len(os.listdir(proc + "/task")), "fds": len(links),
            "sockets": sum(link.startswith("socket:") for link in links)}

print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}
                          | {"argv": sys.argv[1:], "pid": os.getpid(), "agent": agent()}), flush=True)
fail = os.environ.get("FAIL_RANK_UNTIL_RESTART")  # "rank:count": that rank exits 3 before that restart
if fail:
    rank, _, until = fail.partition(":")
    if os.environ["RANK"] == rank and int(os.environ["TORCHELASTIC_RESTART_COUNT"]) < int(until):
        sys.exit(3)
"""


def _run(tmp_path, *args, env=None, timeout=90):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    full = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR"):
        full.pop(k, None)
    return subprocess.run(
        [sys.executable, "-m", "bagua.run", *map(str, args), str(script), "--flag", "x"],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def _envs(out):
    return [json.loads(line.split("ENV ", 1)[1]) for line in out.splitlines() if "ENV " in line]


def _gone(pids):
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                return False
    return True


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_a_failed_worker_restarts_the_group(tmp_path, backend):
    got = _run(
        tmp_path,
        "--nproc-per-node", 2, "--max-restarts", 2, "--rdzv-backend", backend, "--rdzv-id", "job7",
        "--rdzv-conf", "last_call_timeout=1",
        env={"FAIL_RANK_UNTIL_RESTART": "1:1", "BAGUA_DEFAULT_BUCKET_SIZE": "4096"},
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    envs = _envs(got.stdout)
    assert sorted((e["TORCHELASTIC_RESTART_COUNT"], e["RANK"]) for e in envs) == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    ]
    for e in envs:
        assert e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2" and e["OMP_NUM_THREADS"] == "1", e
        assert e["argv"] == ["--flag", "x"] and e["BAGUA_DEFAULT_BUCKET_SIZE"] == "4096", e
        assert e["TORCHELASTIC_RUN_ID"] == "job7", e
    assert all(line.startswith("[rank ") for line in got.stdout.splitlines() if "ENV " in line)


def test_the_launcher_holds_no_more_after_three_restarts(tmp_path):
    """Three membership changes (a worker fails twice more after the first
    restart): the launcher's threads, descriptors and sockets as the fourth
    group starts are those it held as the second one started."""
    got = _run(
        tmp_path, "--nproc-per-node", 2, "--max-restarts", 3, "--rdzv-backend", "c10d",
        "--rdzv-conf", "last_call_timeout=1", env={"FAIL_RANK_UNTIL_RESTART": "1:3"},
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    seen = {(e["TORCHELASTIC_RESTART_COUNT"], e["RANK"]): e["agent"] for e in _envs(got.stdout)}
    assert sorted(seen) == [(str(g), str(r)) for g in range(4) for r in range(2)], sorted(seen)
    assert seen[("3", "0")] == seen[("1", "0")], seen


def test_a_worker_failing_past_the_restarts_ends_the_job_with_its_code(tmp_path):
    t0 = time.monotonic()
    got = _run(tmp_path, "--nproc-per-node", 3, "--max-restarts", 1, env={"FAIL_RANK_UNTIL_RESTART": "2:9"})
    assert got.returncode == 3, got.stdout[-3000:] + got.stderr[-3000:]
    envs = _envs(got.stdout)
    assert sorted({e["TORCHELASTIC_RESTART_COUNT"] for e in envs}) == ["0", "1"]
    assert "bagua-run: " in got.stderr and "failed after the allowed restarts (1)" in got.stderr
    deadline = time.monotonic() + 10
    while not _gone([e["pid"] for e in envs]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone([e["pid"] for e in envs]), "a worker outlived the launcher"
    assert time.monotonic() - t0 < 60


def test_an_unreachable_rendezvous_is_a_clear_error_within_its_timeout(tmp_path):
    t0 = time.monotonic()
    args = [
        "--nnodes",
        "1:2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "192.0.2.1:9",
        "--rdzv-conf",
        "read_timeout=3",
    ]
    got = _run(tmp_path, *args, timeout=60)
    assert got.returncode == 1, got.stderr[-3000:]
    assert "bagua-run: elastic launch failed at the rendezvous 192.0.2.1:9 (c10d)" in got.stderr, got.stderr[-3000:]
    assert time.monotonic() - t0 < 30
    assert not _envs(got.stdout)


def test_the_core_launcher_points_elastic_jobs_to_bagua_run(tmp_path):
    """``python -m bagua_core.run`` imports no torch, so it refuses an elastic job, naming bagua-run."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    got = subprocess.run(
        [sys.executable, "-m", "bagua_core.run", "--max-restarts", "1", str(script)],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert got.returncode == 2 and "start it with bagua-run (python -m bagua.run)" in got.stderr, got.stderr
    assert not _envs(got.stdout)


def test_a_fixed_job_stays_on_the_supervisor(tmp_path):
    """No elastic flag: bagua-run's own supervisor, without torch elastic's variables."""
    got = _run(tmp_path, "--nproc-per-node", 2)
    assert got.returncode == 0, got.stderr[-3000:]
    assert all(e["TORCHELASTIC_RESTART_COUNT"] is None for e in _envs(got.stdout))
