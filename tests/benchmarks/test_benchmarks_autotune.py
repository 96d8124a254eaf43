"""Smoke test of benchmarks/autotune.py: a tiny model and budgets, run the way a
user runs it (the script launches its 2 workers through bagua-run)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("optuna")

from tests.harness.benchmark_scripts import explain, run_script


def _run(tmp_path, *extra):
    out = tmp_path / "results.json"
    args = [
        "--layers",
        "3",
        "--width",
        "32",
        "--batch-size",
        "4",
        "--rounds",
        "2",
        "--steps",
        "1",
        "--max-samples",
        "2",
        "--confidence",
        "0",
        "--warmup",
        "0",
        "--interval",
        "2",
        "--confirm-pairs",
        "2",
        "--max-tune-steps",
        "80",
        "--json",
        str(out),
        "--timeout",
        "90",
        *extra,
    ]
    p = run_script("autotune.py", *args, timeout=110)
    assert p.returncode == 0, explain(p)
    assert "autotuned plan:" in p.stdout and ", completed;" in p.stdout, p.stdout
    return p.stdout, json.loads(out.read_text())


@pytest.mark.timeout(120)
def test_smoke_run_prints_the_plan_the_verdict_and_ratios(tmp_path):
    stdout, doc = _run(tmp_path, "--workload", "decoder-first", "--trace", str(tmp_path / "trace.json"))
    assert "workload decoder-first" in stdout and "trace, rank 1:" in stdout, stdout
    assert sum(doc["autotuned_buckets"]) == sum(doc["default_buckets"]) and doc["plan_bucket_bytes"] > 0
    v = doc["verdict"]
    assert v is not None and "verdict:" in stdout, stdout
    if v["pairs"]:  # a candidate was confirmed in pairs: one line per window
        assert stdout.count("confirmation, ") == 2 * v["pairs"], stdout
    if doc["same_plan"]:  # the default kept: not timed against itself
        assert "autotuned / default = 1 by construction" in stdout and doc["ratio"] == 1.0, stdout
        assert set(doc["samples_per_s"]) == {"default", "default traced"}
    else:
        assert not v["pairs"] or v["switched"], v  # a plan other than the default only on evidence
        assert set(doc["samples_per_s"]) == {"default", "autotuned", "default traced"}
        assert doc["ratio"] > 0 and doc["ratio_quartiles"][0] <= doc["ratio"] <= doc["ratio_quartiles"][1]
