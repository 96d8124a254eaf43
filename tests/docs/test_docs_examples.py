"""The ``Example:`` sections of public docstrings run as written (doctest),
in a world of one process (no launcher: Bagua runs alone)."""

import doctest

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import bagua_core  # noqa: E402
import bagua_core.comm  # noqa: E402
import bagua_torch  # noqa: E402
import bagua_torch.communication  # noqa: E402

# Modules whose docstrings hold examples that run on one process.
MODULES = [bagua_core.comm, bagua_torch.communication]
GLOBALS = {"np": np, "torch": torch, "bagua_core": bagua_core, "bagua_torch": bagua_torch}


@pytest.fixture
def alone(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    bagua_torch.init_process_group()
    yield
    bagua_core.destroy_process_group()


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_examples_run(module, alone):
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, globs=dict(GLOBALS)) if t.examples]
    assert tests, f"{module.__name__} has no examples"
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"
