"""Smoke tests of benchmarks/train_throughput.py (a tiny model, 1 warm-up + 2 timed steps per configuration)
and benchmarks/async_straggler.py, run the way a user runs them (the script launches its 2 workers through
bagua-run)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")

from train_throughput import CONFIGS  # every configuration the script runs by default

from tests.harness.benchmark_scripts import explain, run_script, table_rows

pytestmark = pytest.mark.timeout(90)


def test_smoke_run_reports_every_configuration(tmp_path):
    out = tmp_path / "results.json"
    p = run_script("train_throughput.py", "--smoke", "--json", str(out), "--timeout", "60", timeout=80)
    assert p.returncode == 0, explain(p)

    rows = table_rows(p.stdout)
    for name in CONFIGS:
        assert name in rows, f"{name!r} missing from the table:\n{p.stdout}"
    assert rows["DDP"].split("|")[3].strip() == "1.00x"

    doc = json.loads(out.read_text())
    assert doc["configs"] == list(CONFIGS)
    assert doc["world_size"] == 2 and doc["torch_threads"] == 1
    for name in CONFIGS:
        r = doc["results"][name]
        assert r["samples_per_s"] > 0 and math.isfinite(r["ratio_to_ddp"]), (name, r)
        assert math.isfinite(r["loss"]), (name, r)
    # asynchronous model average is timed over windows that each hold one of its averaging rounds
    assert len(doc["results"]["Bagua Async"]["steps_per_window"]) == doc["rounds"]
    assert "steps per timed window, each holding one averaging round" in p.stdout


def test_async_straggler_smoke_run(tmp_path):
    out = tmp_path / "straggler.json"
    p = run_script("async_straggler.py", "--smoke", "--json", str(out), "--timeout", "70", timeout=85)
    assert p.returncode == 0, explain(p)
    doc = json.loads(out.read_text())
    configs = {(r["config"], r["slow_ms"] > 0) for r in doc["results"]}
    assert configs == {(c, s) for c in ("DDP", "Bagua Async", "no communication") for s in (False, True)}
    for r in doc["results"]:
        assert all(x["samples_per_s"] > 0 for x in r["per_rank"]), r
    assert "| Bagua Async |" in p.stdout


def test_one_lane_variants_run_beside_the_default(tmp_path):
    configs = ["DDP", "Bagua ByteGrad", "Bagua ByteGrad 1 lane", "Bagua QAdam 1 lane"]
    p = run_script("train_throughput.py", "--smoke", "--timeout", "60", "--configs", ",".join(configs), timeout=80)
    assert p.returncode == 0, explain(p)
    rows = set(table_rows(p.stdout))
    assert set(configs) <= rows, p.stdout
    bad = run_script("train_throughput.py", "--smoke", "--configs", "DDP,DDP 1 lane", timeout=60)
    assert bad.returncode == 2 and "unknown configuration" in bad.stderr, bad.stderr
