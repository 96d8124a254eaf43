"""Smoke test of benchmarks/collectives.py: tiny sizes, 2 processes, every system and column."""

import json

import pytest

from tests.harness.benchmark_scripts import run_script, table_cells

COLUMNS = ["procs", "op", "size", "bagua GB/s", "torch GB/s", "jax GB/s", "bagua/torch", "bagua/jax"]


@pytest.mark.timeout(120)
def test_collectives_benchmark_prints_full_table(tmp_path):
    out_json = tmp_path / "bench.json"
    proc = run_script(
        "collectives.py",
        "--sizes",
        "1K",
        "64K",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--world-size",
        "2",
        "--quiet",
        "--timeout",
        "100",
        "--json",
        str(out_json),
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith("|")]
    assert table_cells(lines[0]) == COLUMNS, lines[0]
    rows = [table_cells(l) for l in lines[2:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("2", op, size) for op in ("allreduce", "allgather", "alltoall") for size in ("1 KiB", "64 KiB")
    ]
    for r in rows:
        assert all(float(c) > 0 for c in r[3:]), r  # every system measured, no "n/a"
    assert "load average" in proc.stdout
    doc = json.loads(out_json.read_text())
    assert len(doc["rows"]) == 6 and doc["unavailable"] == {}
    assert all(row["bagua_gbps"] > 0 and row["torch_gbps"] > 0 and row["jax_gbps"] > 0 for row in doc["rows"])
