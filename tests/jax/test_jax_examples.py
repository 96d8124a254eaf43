"""The JAX examples run as a user runs them, on 2 real processes: the Flax
NNX one (nnx.Optimizer with Bagua's transform, weights broadcast from rank
0 so init does not warn) and the multi-device one (2 processes x 4 devices,
a Mesh per process); each must learn its task."""

from __future__ import annotations

import os
import re

import pytest

from tests.harness.mp import launch
from tests.harness.paths import REPO

pytest.importorskip("jax")
pytest.importorskip("flax")


def run_example(name, *args):
    run = launch(os.path.join(REPO, "examples", name), 2, timeout=150, args=["--epochs", "2", "--steps", "30", *args])
    assert run.ok(), run.summary()
    out = run.workers[0].stdout
    losses = [float(x) for x in re.findall(r"epoch \d/2: loss ([0-9.]+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0], out
    assert float(re.search(r"accuracy ([0-9.]+)", out).group(1)) > 0.6, out
    assert not run.workers[1].stdout.strip()
    return run


@pytest.mark.timeout(200)
def test_flax_nnx_example():
    run = run_example("train_flax_nnx.py", "--algorithm", "decentralized")  # a weight algorithm: after adam
    for w in run.workers:
        assert "differs across ranks" not in w.stderr, run.summary()


@pytest.mark.timeout(200)
def test_multi_device_example():
    run = run_example("train_multi_device_jax.py", "--cpu-devices", "4", "--algorithm", "bytegrad")
    assert "2 processes x 4 devices" in run.workers[0].stdout
