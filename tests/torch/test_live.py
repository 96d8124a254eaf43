"""Per-step fault tolerance (bagua_torch.live) with real kills: torchft's
Lighthouse, 3 or 4 replicas each under its own bagua-run agent
(examples/live_train.py). One replica SIGKILLs itself inside a step; the
survivors go on without it and without restarting (one process each from
start to end), the agent restarts the killed one, which takes the model,
optimizer, algorithm state and step from a peer and joins; the job ends with
the same weights on every replica. GradientAllReduce (a fixed global batch
split among whoever is present) ends where full-batch training does; the
algorithms that compress gradients (ByteGrad, HalfGrad, LowRank, QAdam) end
within LOSS_TOLERANCE of full-batch training's loss; those whose replicas
differ between exchanges (local steps, decentralized, low-precision
decentralized, async) within their tolerance of the same job run without the
kill, alongside. Rebuilds leak nothing: threads, descriptors and sockets
counted over three of them."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from tests.harness import live
from tests.harness.paths import REPO

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.multiprocess,
    pytest.mark.skipif(live.LIGHTHOUSE is None, reason=live.NO_LIGHTHOUSE),
]

EXAMPLE = os.path.join(REPO, "examples", "live_train.py")
STEPS, KILL_AT, PAUSE = 150, 25, 0.08  # a restarted replica is back well before the end
# the final loss at most this times the reference's (below); measured: 0.8-1.1x. Local steps: Adam inside
# (DiLoCo's recipe: SGD inside its Nesterov outer step is unstable on its own).
LOSS_TOLERANCE = 1.5
# LowPrecisionDecentralized trains slowly here (0.85 to 0.12-0.37 in 150 steps) and its unfaulted runs differ
# among themselves (ranks follow the replicas' random ids, so each run splits the batch another way):
# measured 0.75-1.56x over 6 runs
LOSS_TOLERANCE_OF = {"low_precision_decentralized": 2.0}


def _full_batch(algorithm, flags):
    """Final weights and loss of the example's job on one process, without
    faults or compression, with the optimizer the example's ``flags`` give
    (QAdam's for qadam)."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import live_train
    finally:
        sys.path.pop(0)
    import torch

    from bagua_torch.algorithms import QAdamOptimizer

    given = dict(zip(flags[::2], flags[1::2]))
    optimizer, lr = given.get("--optimizer", "sgd"), float(given.get("--lr", 0.02))  # the example's defaults
    optimizer = "qadam" if algorithm == "qadam" else optimizer
    x, y = live_train.regression(STEPS, 12, 8)
    model = live_train.model_for(8)
    opt = {  # the example's
        "sgd": lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9),
        "qadam": lambda p: QAdamOptimizer(p, lr=lr, warmup_steps=20),
    }[optimizer](model.parameters())
    for step in range(STEPS):
        torch.nn.functional.mse_loss(model(x[step]), y[step]).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x.flatten(0, 1)), y.flatten(0, 1)).item()
    return [p.detach().flatten().numpy() for p in model.parameters()], loss


# QAdam's variance is frozen after the warm-up while its bias correction goes on: at lr 0.01 full-batch
# training diverges here (loss 104 after 150 steps), at 0.001 it reaches 0.14
ADAM, QADAM_LR = ["--optimizer", "adam", "--lr", 0.01], ["--lr", 0.001]


# reference: "full batch" (weights equal to full-batch training), "full batch loss" (the final loss
# within LOSS_TOLERANCE of full-batch training's with the same optimizer: compressed gradients, the
# same on every replica) or "unfaulted" (the same job without the kill: replicas that differ)
@pytest.mark.parametrize(
    "algorithm, replicas, flags, reference",
    [
        ("gradient_allreduce", 3, [], "full batch"),
        ("local_steps", 4, ADAM, "unfaulted"),
        ("decentralized", 3, [], "unfaulted"),
        ("bytegrad", 3, [], "full batch loss"),
        ("halfgrad", 4, [], "full batch loss"),
        ("low_rank", 3, [], "full batch loss"),
        ("qadam", 3, QADAM_LR, "full batch loss"),  # the kill after the warm-up: compressed momentum
        ("low_precision_decentralized", 3, [], "unfaulted"),
        ("async", 3, [], "unfaulted"),
    ],
)
def test_a_killed_replica_heals_from_a_peer_and_the_survivors_go_on(tmp_path, algorithm, replicas, flags, reference):
    args = ["--steps", STEPS, "--pause", PAUSE, "--algorithm", algorithm, *flags]
    procs = live.start_job(tmp_path, "faulted", EXAMPLE, args, replicas, kill_at=KILL_AT)
    if reference == "unfaulted":
        procs += live.start_job(tmp_path, "unfaulted", EXAMPLE, args, replicas)
    live.wait(procs)

    records = [json.loads(line) for line in (tmp_path / "faulted.jsonl").read_text().splitlines()]
    live.survived(records, replicas, KILL_AT)
    weights = [[np.array(w) for w in r["weights"]] for r in records]
    for other in weights[1:]:
        for a, b in zip(weights[0], other):
            np.testing.assert_array_equal(a, b)  # every replica ends with the same weights, bitwise
    if reference == "full batch":  # full-batch gradient descent, whoever was present
        for a, b in zip(weights[0], _full_batch(algorithm, flags)[0]):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    elif reference == "full batch loss":
        full_batch = _full_batch(algorithm, flags)[1]
        assert records[0]["loss"] < LOSS_TOLERANCE * full_batch, (records[0]["loss"], full_batch)
    else:
        unfaulted = json.loads((tmp_path / "unfaulted.jsonl").read_text().splitlines()[0])["loss"]
        tolerance = LOSS_TOLERANCE_OF.get(algorithm, LOSS_TOLERANCE)
        assert records[0]["loss"] < tolerance * unfaulted, (records[0]["loss"], unfaulted)


REBUILDS = """
import json, sys, time
import torch
from bagua_core.errors import PeerError
from bagua_torch.algorithms import ByteGradAlgorithm
from bagua_torch.live import LiveTraining
from tests.harness.worker import resources

FAIL_AFTER, MEASURE_AT, STEPS = (10, 20, 30, 40), (15, 45), 50
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
live = LiveTraining(model, [optimizer], ByteGradAlgorithm(error_feedback=True))
failed, counts = set(), {}
while live.step < STEPS:
    with live.attempt():
        if live.step in MEASURE_AT:
            deadline = time.monotonic() + 5  # threads end a moment after they are joined
            counts[live.step] = resources()
            while live.step != MEASURE_AT[0] and counts[live.step] != counts[MEASURE_AT[0]] and time.monotonic() < deadline:
                time.sleep(0.05)
                counts[live.step] = resources()
        model(torch.randn(8, 64)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if live.rank == 1 and live.step in FAIL_AFTER and live.step not in failed:
            failed.add(live.step)  # after the exchange: the others finish the step, this member rebuilds with them
            raise PeerError("injected: this member's attempt failed")
with open(sys.argv[sys.argv.index("--record") + 1], "a") as f:
    f.write(json.dumps({"changes": len(live.changes), "failures": live.failures, "counts": counts}) + "\\n")
live.close()
"""


def test_three_rebuilds_leave_no_threads_descriptors_sockets_or_segments(tmp_path):
    """Two replicas; one fails an attempt four times (after the step's
    exchange, as a lost peer would be seen), so every member closes its
    wrapper, rebuilds the group and heals each time. Between the first
    rebuild and three more, each process's threads, descriptors, sockets and
    shared-memory segments are the same in number."""
    script = tmp_path / "rebuilds.py"
    script.write_text(REBUILDS)
    live.wait(live.start_job(tmp_path, "rebuilds", script, [], 2))
    records = [json.loads(line) for line in (tmp_path / "rebuilds.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:
        assert r["changes"] == 5, r  # the first group, then one per failure
        before, after = r["counts"]["15"], r["counts"]["45"]
        assert before["sockets"] > 0, before  # what each rebuild must free (each replica is a node: no shared memory)
        assert after == before, f"after 3 rebuilds {after}, before {before}"
    assert sorted(r["failures"] for r in records) == [0, 4]
