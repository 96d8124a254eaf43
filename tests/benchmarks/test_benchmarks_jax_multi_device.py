"""Smoke test of benchmarks/jax_multi_device.py: a tiny model on 2 processes x
4 XLA devices over loopback (as root with shaping, it would make namespaces:
the smoke run skips them with --no-shaping), run the way a user runs it."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("flax")

from tests.harness.benchmark_scripts import explain, run_script, table_rows

CONFIGS = (
    "XLA psum across hosts",
    "Bagua GradientAllReduce (mesh=)",
    "Bagua ByteGrad (mesh=)",
    "Bagua LowRank (mesh=)",
    "XLA pmean inside the host",
)


@pytest.mark.timeout(180)
def test_smoke_run_reports_every_configuration(tmp_path):
    out = tmp_path / "results.json"
    p = run_script(
        "jax_multi_device.py", "--no-shaping", "--smoke", "--json", str(out), "--timeout", "150", timeout=170
    )
    assert p.returncode == 0, explain(p)
    rows = table_rows(p.stdout)
    for name in CONFIGS:
        assert name in rows, f"{name!r} missing from the table:\n{p.stdout}"
    doc = json.loads(out.read_text())
    assert doc["configs"] == list(CONFIGS) and doc["processes"] == 2 and doc["devices_per_process"] == 4
    for name in CONFIGS:
        r = doc["results"][name]
        assert r["samples_per_s"] > 0 and math.isfinite(r["loss"]), (name, r)


def test_bad_input_is_refused():
    p = run_script("jax_multi_device.py", "--no-shaping", "--devices", "0", timeout=30)
    assert p.returncode == 2 and "must be positive" in p.stderr, explain(p)
