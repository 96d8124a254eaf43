"""torch loaded with RTLD_GLOBAL exports its own (newer, incompatible) copy of
Gloo's symbols. bagua_core/_loader.py opens _C with RTLD_DEEPBIND so that its
calls still reach the system libgloo. Checked both ways: with the loader, a
2-process job after ``TORCH_USE_RTLD_GLOBAL=1 import torch`` works; loading _C
by hand without RTLD_DEEPBIND, the same job crashes (SIGSEGV), which shows that
DEEPBIND is what makes it work.

This file is also the worker script.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.harness import mp

pytest.importorskip("torch")


def load_without_deepbind():
    """Loads bagua_core._C the way a plain import would (RTLD_LOCAL, no
    DEEPBIND) before the package's own loader runs, which then reuses it."""
    import glob
    import importlib.machinery
    import importlib.util

    # Look on sys.path without importing the package: an editable install keeps
    # the module in site-packages, a development build next to the sources.
    found = [p for d in sys.path for p in glob.glob(os.path.join(d or ".", "bagua_core", "_C*.so"))]
    assert found, f"bagua_core._C not found on {sys.path}"
    path = found[0]
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL)
    try:
        loader = importlib.machinery.ExtensionFileLoader("bagua_core._C", path)
        spec = importlib.util.spec_from_loader("bagua_core._C", loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        sys.modules["bagua_core._C"] = module
    finally:
        sys.setdlopenflags(flags)


def worker(mode: str) -> int:
    import torch  # with TORCH_USE_RTLD_GLOBAL=1: its symbols become global

    if mode == "no-deepbind":
        load_without_deepbind()
    import bagua_core as bc

    bc.init_process_group()
    rank, ws = bc.get_rank(), bc.get_world_size()
    x = torch.full((1000,), float(rank + 1))
    bc.allreduce_inplace(x)
    assert torch.equal(x, torch.full((1000,), float(ws * (ws + 1) // 2))), x[:4]
    g = bc.allgather(torch.arange(4, dtype=torch.int64) + rank, torch.zeros(4 * ws, dtype=torch.int64))
    assert g.tolist() == [i + r for r in range(ws) for i in range(4)], g
    bc.broadcast(x, src=ws - 1)
    bc.barrier()
    bc.destroy_process_group()
    print("symbol-clash-ok", flush=True)
    return 0


def launch(mode: str) -> mp.Run:
    return mp.launch(os.path.abspath(__file__), 2, timeout=90, args=[mode], env={"TORCH_USE_RTLD_GLOBAL": "1"})


def test_torch_rtld_global_then_bagua_core_works():
    run = launch("loader")
    run.check()
    assert all("symbol-clash-ok" in w.stdout for w in run.workers), run.summary()


def test_without_deepbind_the_same_job_crashes():
    """The control: proves the loader's RTLD_DEEPBIND is what makes the test above pass."""
    run = launch("no-deepbind")
    if run.ok():
        pytest.skip("this torch no longer interposes Gloo symbols; RTLD_DEEPBIND is not needed here")
    assert not run.timed_out, run.summary()
    crashed = [w.returncode for w in run.workers if w.returncode is not None and w.returncode < 0]
    assert crashed, f"expected a crash (signal), got {run.summary()}"


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1]))
