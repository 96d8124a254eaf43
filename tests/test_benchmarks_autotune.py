"""Smoke test of benchmarks/autotune.py: a tiny model and budgets, run the way a
user runs it (the script launches its 2 workers through bagua-run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("optuna")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "autotune.py")


@pytest.mark.timeout(120)
def test_smoke_run_prints_the_plan_and_ratios(tmp_path):
    out = tmp_path / "results.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)  # the driver mode is chosen by the absence of RANK
    args = ["--layers", "3", "--width", "32", "--batch-size", "4", "--rounds", "2", "--steps", "1",
            "--max-samples", "2", "--confidence", "0", "--warmup", "0", "--interval", "2", "--max-tune-steps", "60",
            "--trace", str(tmp_path / "trace.json"), "--json", str(out), "--timeout", "90"]
    p = subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO, env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=110)
    assert p.returncode == 0, f"rc={p.returncode}\n[stdout]\n{p.stdout[-4000:]}\n[stderr]\n{p.stderr[-4000:]}"
    assert "autotuned plan:" in p.stdout and ", completed;" in p.stdout, p.stdout
    assert "trace, rank 1:" in p.stdout, p.stdout
    doc = json.loads(out.read_text())
    assert set(doc["samples_per_s"]) == {"default", "autotuned", "default traced"}
    assert doc["ratio"] > 0 and doc["plan_bucket_bytes"] > 0
    assert sum(doc["autotuned_buckets"]) == sum(doc["default_buckets"])
