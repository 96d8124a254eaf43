"""Smoke test of benchmarks/agreement_cost.py: tiny counts, 2 processes, every column measured."""

import os
import subprocess
import sys

import pytest

from tests.mp import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "agreement_cost.py")


@pytest.mark.timeout(120)
def test_agreement_cost_benchmark_prints_its_row():
    proc = subprocess.run([sys.executable, SCRIPT, "--nproc", "2", "--iters", "8", "--rounds", "1", "--calls", "4",
                           "--timeout", "100"], env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                          text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [l for l in proc.stdout.splitlines() if l.startswith("| 2 |")]
    assert len(rows) == 1, proc.stdout
    cells = [c.strip() for c in rows[0].strip().strip("|").split("|")]
    assert cells[:2] == ["2", "256"] and all(float(c) > 0 for c in cells[2:]), cells
