"""A peer that dies (or hangs) mid-training makes every survivor raise a Python
exception from its training step within the timeout, never crash or hang; the
steps after that raise at once.

Sessions of 3 processes with BAGUA_TIMEOUT=4: rank 2 trains 3 steps, then
exits (``dead``: GradientAllReduce) or stops answering for longer than the
timeout and then exits (``stuck``: Decentralized). With
``overlap_optimizer=True`` and several buckets, where backward does not wait
and the failure must come out of ``optimizer.step()``: ``dead_overlap``
(ByteGrad) and ``stuck_overlap`` (GradientAllReduce).
"""

from __future__ import annotations

import functools
import os
import sys
import time

import pytest

from tests.harness.mp import launch

TIMEOUT_S = 4.0
SESSIONS = {
    "dead": "gradient_allreduce",
    "stuck": "decentralized",
    "dead_overlap": "bytegrad",
    "stuck_overlap": "gradient_allreduce",
}
CASES = ["survivor_raises_within_timeout", "later_steps_raise_at_once"]
VICTIM = 2
VICTIM_RC = 3


def worker_main():
    import torch

    import bagua_torch
    from bagua_core import BaguaError
    from bagua_torch.algorithms import ByteGradAlgorithm, DecentralizedAlgorithm, GradientAllReduceAlgorithm
    from tests.harness.worker import report

    mode = sys.argv[1]
    torch.set_num_threads(1)
    group = bagua_torch.init_process_group()
    rank = group.rank
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    algo = {
        "gradient_allreduce": GradientAllReduceAlgorithm,
        "bytegrad": ByteGradAlgorithm,
        "decentralized": lambda: DecentralizedAlgorithm(hierarchical=False),
    }[SESSIONS[mode]]()
    overlap = mode.endswith("_overlap")
    model.with_bagua([opt], algo, overlap_optimizer=overlap)
    assert len(model.bagua_buckets) > 1 or not overlap
    phase = [""]

    def train_step():
        phase[0] = "zero_grad"
        opt.zero_grad()
        phase[0] = "forward and backward"
        model(torch.randn(8, 4)).pow(2).mean().backward()
        phase[0] = "optimizer.step()"
        opt.step()

    for step in range(20):
        if rank == VICTIM and step == 3:
            if mode.startswith("stuck"):
                time.sleep(TIMEOUT_S + 3)
            os._exit(VICTIM_RC)
        t0 = time.monotonic()
        try:
            train_step()
        except BaguaError as e:
            elapsed = time.monotonic() - t0
            where_ok = not overlap or phase[0] == "optimizer.step()"  # overlapped, backward does not wait
            report(
                CASES[0],
                elapsed < TIMEOUT_S + 4 and where_ok,
                f"{type(e).__name__} in {phase[0]} after {elapsed:.1f} s: {e}",
                elapsed=elapsed,
                message=str(e),
            )
            t0 = time.monotonic()
            try:
                train_step()
            except BaguaError as e2:
                report(CASES[1], time.monotonic() - t0 < 1.0, f"{type(e2).__name__}: {e2}")
            else:
                report(CASES[1], False, "the step after the failure did not raise")
            sys.exit(0)
        if step > 3:
            time.sleep(0.1)  # give the failure time to be noticed
    report(CASES[0], False, "no step raised")
    sys.exit(1)


@functools.lru_cache(maxsize=None)
def session(name: str):
    env = {"BAGUA_TIMEOUT": str(TIMEOUT_S)}
    if name.endswith("_overlap"):
        env["BAGUA_BUCKET_SIZE"] = "128"  # several buckets
    return launch(os.path.abspath(__file__), 3, timeout=60, args=[name], env=env)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(SESSIONS))
@pytest.mark.parametrize("case", CASES)
def test_survivors(name, case):
    run = session(name)
    assert not run.timed_out, run.summary()
    recs = run.cases().get(case, {})
    for r in range(3):
        if r == VICTIM:
            continue
        assert r in recs, f"rank {r} did not report {case}\n{run.summary()}"
        assert recs[r]["ok"], f"rank {r}: {recs[r]['error']}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(SESSIONS))
def test_every_process_ends(name):
    run = session(name)
    assert not run.timed_out, run.summary()
    for w in run.workers:
        assert w.returncode == (VICTIM_RC if w.rank == VICTIM else 0), run.summary()


if __name__ == "__main__":
    worker_main()
