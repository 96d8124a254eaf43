"""Smoke test of benchmarks/low_rank_step.py: a tiny MLP, ranks 1 and 2, 2 rounds, run the way a user
runs it (the script launches its 2 workers through bagua-run over loopback)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")

from tests.harness.benchmark_scripts import explain, run_script

pytestmark = pytest.mark.timeout(120)


def test_smoke_run_reports_both_systems_per_rank(tmp_path):
    out = tmp_path / "low_rank.json"
    p = run_script("low_rank_step.py", "--smoke", "--json", str(out), "--timeout", "80", timeout=100)
    assert p.returncode == 0, explain(p)

    rows = [line for line in p.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| rank | DDP+powerSGD_hook ms/step | Bagua LowRank ms/step | Bagua / hook"), rows
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["1", "2"], rows
    assert "load average before" in p.stdout

    doc = json.loads(out.read_text())
    assert doc["ranks"] == [1, 2] and doc["world_size"] == 2 and doc["torch_threads"] == 1
    results = doc["results"]
    assert set(results) == {
        "no communication",
        "DDP+PowerSGD 1",
        "Bagua LowRank 1",
        "DDP+PowerSGD 2",
        "Bagua LowRank 2",
    }
    for name, r in results.items():
        assert len(r["rounds"]) == doc["rounds"] and r["ms_per_step"] > 0, (name, r)
    for rank in (1, 2):
        ratio = results[f"Bagua LowRank {rank}"]["ratio_to_hook"]
        assert math.isfinite(ratio) and ratio > 0
