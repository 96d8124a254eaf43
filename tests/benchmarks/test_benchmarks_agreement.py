"""Smoke test of benchmarks/agreement_cost.py: tiny counts, 2 processes, every column measured."""

import pytest

from tests.harness.benchmark_scripts import run_script, table_cells


@pytest.mark.timeout(120)
def test_agreement_cost_benchmark_prints_its_row():
    proc = run_script(
        "agreement_cost.py",
        "--nproc",
        "2",
        "--iters",
        "8",
        "--rounds",
        "1",
        "--calls",
        "4",
        "--timeout",
        "100",
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [l for l in proc.stdout.splitlines() if l.startswith("| 2 |")]
    assert len(rows) == 1, proc.stdout
    cells = table_cells(rows[0])
    assert cells[:2] == ["2", "256"] and all(float(c) > 0 for c in cells[2:]), cells
