"""Smoke test of benchmarks/jax_transform.py: a tiny model, 1 warm-up + 2 rounds of 1 timed step per
configuration, run the way a user runs it (the script launches its 2 workers through bagua-run)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from tests.harness.benchmark_scripts import explain, run_script, table_rows

CONFIGS = (
    "JAX bagua_jax.transform",
    "JAX jax.distributed (gloo)",
    "torch with_bagua",
    "JAX no communication",
    "torch no communication",
)


@pytest.mark.timeout(150)
def test_smoke_run_reports_every_configuration(tmp_path):
    out = tmp_path / "results.json"
    p = run_script("jax_transform.py", "--smoke", "--json", str(out), "--timeout", "110", timeout=140)
    assert p.returncode == 0, explain(p)
    rows = table_rows(p.stdout)
    for name in CONFIGS:
        assert name in rows, f"{name!r} missing from the table:\n{p.stdout}"
    doc = json.loads(out.read_text())
    assert doc["configs"] == list(CONFIGS) and doc["world_size"] == 2
    for name in CONFIGS:
        r = doc["results"][name]
        assert r["samples_per_s"] > 0 and math.isfinite(r["loss"]), (name, r)
    assert doc["transform_overhead"]["update_ms"] > 0 and doc["transform_overhead"]["raw_allreduce_ms"] > 0
    assert "transform overhead" in p.stdout
