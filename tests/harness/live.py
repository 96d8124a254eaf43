"""Live jobs in tests (bagua_core.live): torchft's Lighthouse and replicas of
an example script, each under its own bagua-run agent, with a kill."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

from _launch import kill_tree  # benchmarks/ is on the test path (pyproject)

from tests.harness import mp
from tests.harness.paths import REPO

LIGHTHOUSE = shutil.which("torchft_lighthouse", path=os.path.dirname(sys.executable))
NO_LIGHTHOUSE = "torchft is not installed (pip install 'bagua[ft]')"


def start_lighthouse(port: int, *flags: str) -> subprocess.Popen:
    """torchft's Lighthouse on 127.0.0.1:``port`` (min_replicas 2, a dead
    replica noticed after 1 s), listening when this returns."""
    proc = subprocess.Popen(
        [LIGHTHOUSE, "--min_replicas", "2", "--heartbeat_timeout_ms", "1000", "--join_timeout_ms", "3000",
         "--bind", f"127.0.0.1:{port}", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("torchft_lighthouse did not start") from None
            time.sleep(0.05)


def env(lighthouse_port: int) -> dict:
    out = dict(os.environ)
    out["PYTHONPATH"] = REPO + os.pathsep + out.get("PYTHONPATH", "")
    out.update(BAGUA_TIMEOUT="30", BAGUA_LIGHTHOUSE=f"127.0.0.1:{lighthouse_port}", BAGUA_STORE_SECRET="t" * 64)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        out.pop(k, None)
    return out


def start_job(tmp_path, name, script, args, replicas, kill_at=None):
    """A job of ``replicas`` replicas of ``script`` (with ``args`` and
    ``--record tmp_path/name.jsonl``) on a Lighthouse of its own. With
    ``kill_at``, each replica runs under its own agent (one restart) and the
    last one gets ``--kill-at-step kill_at``; without, plain processes.
    Returns [(log path or None, process)]: stop them with :func:`stop`."""
    port = mp.free_master_ports()
    procs = [(None, start_lighthouse(port))]
    for i in range(replicas):
        line = [sys.executable]
        if kill_at is not None:
            line += ["-m", "bagua.run", "--nproc-per-node", 1, "--max-restarts", 1, "--rdzv-backend", "c10d"]
            line += ["--rdzv-endpoint", f"127.0.0.1:{mp.free_master_ports()}"]
        line += [script, *args, "--record", tmp_path / f"{name}.jsonl"]
        line += ["--kill-at-step", kill_at] if kill_at is not None and i == replicas - 1 else []
        log = tmp_path / f"{name}{i}.log"
        with open(log, "w") as f:
            procs.append(
                (log, subprocess.Popen([str(a) for a in line], cwd=REPO, env=env(port), stdout=f,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            )  # fmt: skip
    return procs


def wait(procs, timeout=180) -> None:
    """Every replica ends with 0 (its log's tail otherwise); then everything is stopped."""
    try:
        for log, proc in procs:
            if log is not None:
                assert proc.wait(timeout=timeout) == 0, log.read_text()[-4000:]
    finally:
        for _, proc in procs:
            kill_tree(proc.pid)  # an agent's workers too, should it have failed
            proc.wait()


def survived(records, replicas, kill_at) -> None:
    """The records of a job where the last replica was killed at ``kill_at``:
    the others, one process each, went on without it and then with it again;
    it came back once, mid-run, healed from a peer; all ended together."""
    survivors = [r for r in records if r["restarts"] == 0]
    healed = [r for r in records if r["restarts"] == 1]
    assert len(survivors) == replicas - 1 and len(healed) == 1, [(r["restarts"], r["changes"]) for r in records]
    for r in survivors:
        worlds_after_kill = [world for step, world, _, _ in r["changes"] if step >= kill_at]
        assert worlds_after_kill[:2] == [replicas - 1, replicas], r["changes"]
    first_step, first_world, _, _ = healed[0]["changes"][0]
    assert first_step > kill_at and first_world == replicas, healed[0]["changes"]
    assert all(r["final_world"] == replicas for r in records)
