"""Per-step fault tolerance in JAX (bagua_jax.live) with a real kill: 3
replicas of examples/live_train_jax.py under their own bagua-run agents, one
SIGKILLs itself inside a step; the others go on as 2 without restarting, the
restarted one takes the state and step from a peer (a new transform on the
rebuilt group) and joins; every replica ends with the same params, and no
process imported torch. GradientAllReduce (float64, a fixed global batch
split among whoever is present) ends equal to full-batch training without
faults; ByteGrad with error feedback (its residual carried from rank 0)
within LOSS_TOLERANCE of its loss; local steps within LOSS_TOLERANCE of the
same job without the kill."""

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

EXAMPLE = os.path.join(REPO, "examples", "live_train_jax.py")
STEPS, KILL_AT = 150, 25


def _full_batch():
    """Final params and loss of the example's job on one process, without
    faults or compression (SGD with momentum, its default)."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import live_train_jax as ex
    finally:
        sys.path.pop(0)
    import jax
    import optax

    with jax.enable_x64(True):  # as the example runs
        x, y = ex.regression(STEPS, 12, 8)
        params, tx = ex.init_params(8), optax.sgd(0.02, momentum=0.9)  # the example's
        opt = tx.init(params)
        for step in range(STEPS):
            updates, opt = tx.update(jax.grad(ex.loss_fn)(params, x[step], y[step]), opt, params)
            params = optax.apply_updates(params, updates)
        loss = float(ex.loss_fn(params, x.reshape(-1, 8), y.reshape(-1, 1)))
        return [np.asarray(params[k]).ravel() for k in sorted(params)], loss


# reference as in tests/torch/test_live.py: "full batch" (params equal to full-batch training's), "full
# batch loss" (the final loss within LOSS_TOLERANCE of it: compressed gradients, error feedback carried),
# "unfaulted" (the same job without the kill: replicas that differ between exchanges)
LOSS_TOLERANCE = 1.5


@pytest.mark.parametrize(
    "algorithm, flags, reference",
    [
        ("gradient_allreduce", [], "full batch"),
        ("bytegrad", ["--error-feedback"], "full batch loss"),
        ("local_steps", ["--optimizer", "adam", "--lr", 0.01], "unfaulted"),  # DiLoCo's recipe
    ],
)
def test_a_killed_replica_heals_from_a_peer_and_the_survivors_go_on(tmp_path, algorithm, flags, reference):
    args = ["--steps", STEPS, "--pause", 0.08, "--algorithm", algorithm, *flags]
    procs = live.start_job(tmp_path, "faulted", EXAMPLE, args, 3, kill_at=KILL_AT)
    if reference == "unfaulted":
        procs += live.start_job(tmp_path, "unfaulted", EXAMPLE, args, 3)
    live.wait(procs)

    records = [json.loads(line) for line in (tmp_path / "faulted.jsonl").read_text().splitlines()]
    live.survived(records, 3, KILL_AT)
    assert not any(r["torch_imported"] for r in records)
    weights = [[np.array(w) for w in r["weights"]] for r in records]
    for other in weights[1:]:
        for a, b in zip(weights[0], other):
            np.testing.assert_array_equal(a, b)
    if reference == "full batch":
        for a, b in zip(weights[0], _full_batch()[0]):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    elif reference == "full batch loss":
        full_batch = _full_batch()[1]
        assert records[0]["loss"] < LOSS_TOLERANCE * full_batch, (records[0]["loss"], full_batch)
    else:
        unfaulted = json.loads((tmp_path / "unfaulted.jsonl").read_text().splitlines()[0])["loss"]
        assert records[0]["loss"] < LOSS_TOLERANCE * unfaulted, (records[0]["loss"], unfaulted)
