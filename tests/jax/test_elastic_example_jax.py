"""examples/elastic_train_jax.py under bagua-run's elastic launch (torch
elastic's agent), 3 workers: rank 1 SIGKILLs itself at step 13, the agent
restarts every worker (--max-restarts 1), they resume from the checkpoint of
step 10 through orbax, and the final parameters are bitwise those of the same
job run without the kill (GradientAllReduce, and LocalSteps, whose anchor,
outer momentum and step counter must come back too)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.harness.paths import REPO

pytestmark = [pytest.mark.timeout(300), pytest.mark.multiprocess]

EXAMPLE = os.path.join(REPO, "examples", "elastic_train_jax.py")


def _run(tmp_path, name, algorithm, launcher=(), script=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(k, None)
    out = tmp_path / f"{name}.npz"
    args = [sys.executable, "-m", "bagua.run", "--nproc-per-node", "3", *launcher, EXAMPLE, *script, "--steps", "24"]
    args += ["--checkpoint-every", "5", "--algorithm", algorithm, "--checkpoint-dir", str(tmp_path / name)]
    got = subprocess.run(
        [*args, "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    return np.load(out), got.stdout


@pytest.mark.parametrize("algorithm", ["gradient_allreduce", "local_steps"])
def test_a_killed_worker_restarts_the_job_and_it_ends_bitwise_as_without(tmp_path, algorithm):
    plain, _ = _run(tmp_path, "plain", algorithm)
    killed, out = _run(tmp_path, "killed", algorithm, ["--max-restarts", "1"], ["--kill-rank-at-step", "1:13"])
    assert "world size 3, starting at step 10" in out, out[-3000:]
    for name in plain.files:
        np.testing.assert_array_equal(killed[name], plain[name], err_msg=name)
