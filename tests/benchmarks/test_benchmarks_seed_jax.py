"""benchmarks/_seed_jax.py's trainer, tiny stand-in, on 2 real processes through the real engine:

* real mode: after 2 steps of GradientAllReduce the params are the same on both ranks and equal a
  reference made here with jax alone (the mean of both ranks' gradients, then SGD with momentum);
* device-time mode: the same with the recorded gradients; the FLOPs of cost analysis match a count by
  hand, scaled from the recorded batch; ``compute_seconds`` > 0, and a step takes at least ``compute_seconds``.

This file is also the worker script; pytest reports each case on its own.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import session_tests

LR, MOMENTUM, BATCH, RECORD_BATCH = 0.05, 0.9, 8, 2
# A slow GPU, so that the tiny model's replayed compute is tens of milliseconds.
PROFILE = {"name": "test", "device": "test", "peak_tflops": 1e-3, "mfu": 0.5, "source": "test"}
CASES = ("real_mode_matches_reference", "device_time_mode")


def tiny_step_flops(batch):
    """The tiny model's forward and backward by hand: forward 2 FLOPs per multiply-add, backward twice
    that, less the first convolution's gradient of its input (not needed)."""
    conv1, conv2, dense = 32 * 32 * 8 * 27, 16 * 16 * 16 * 72, 16 * 32 + 32 * 10
    return batch * 2 * (3 * (conv1 + conv2 + dense) - conv1)


def case_names(session: str):
    return list(CASES)


class Worker(JaxWorker):
    def __init__(self):
        super().__init__()
        import _seed_jax  # benchmarks/ is put on sys.path below

        self.seed = _seed_jax
        self.model = _seed_jax.flax_vgg16(tiny=True)

    def trainer(self, mode):
        return self.seed.JaxReplayTrainer(
            f"tiny {mode}",
            "GradientAllReduceAlgorithm",
            mode,
            PROFILE,
            BATCH,
            RECORD_BATCH,
            self.rank,
            tiny=True,
            lr=LR,
            momentum=MOMENTUM,
        )

    def reference(self, grads_at, steps=2):
        """Params after ``steps`` of SGD with momentum on the mean of every rank's gradients
        (``grads_at(params, rank)``), from the trainer's initial params."""
        jax = self.jax
        params = self.seed.initial_params(self.model, tiny=True)
        trace = jax.tree.map(np.zeros_like, params)
        for _ in range(steps):
            per_rank = [grads_at(params, r) for r in range(self.world)]
            mean = jax.tree.map(lambda *g: sum(np.asarray(x, np.float64) for x in g) / len(g), *per_rank)
            trace = jax.tree.map(lambda t, g: MOMENTUM * t + g, trace, mean)
            params = jax.tree.map(lambda p, t: np.asarray(p, np.float64) - LR * t, params, trace)
        return params

    def check_params(self, got, want):
        """``got`` equals ``want`` within float32 tolerance, and is bitwise the same on every rank."""
        import bagua_jax

        jax = self.jax
        for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-6, err_msg=jax.tree_util.keystr(path))
        flat = self.jnp.concatenate([x.ravel() for x in jax.tree.leaves(got)])
        everyone = np.asarray(bagua_jax.allgather(flat))
        assert all(np.array_equal(everyone[0], row) for row in everyone[1:]), "params differ between ranks"

    def grad_fn(self):
        return self.jax.jit(self.jax.grad(self.seed.loss_fn(self.model)))

    # -- cases --
    def real_mode_matches_reference(self):
        t = self.trainer("real")
        assert t.compute_seconds == 0.0
        t.steps(2)
        assert np.isfinite(t.loss)
        grad = self.grad_fn()
        batches = [self.seed.synthetic_batch(r, BATCH, tiny=True) for r in range(self.world)]
        self.check_params(t.params, self.reference(lambda p, r: grad(p, *batches[r])))
        t.close()

    def device_time_mode(self):
        t = self.trainer("device-time")
        np.testing.assert_allclose(t.flops, tiny_step_flops(BATCH), rtol=0.1)  # recorded at 2, scaled to 8
        np.testing.assert_allclose(t.compute_seconds, t.flops / (PROFILE["peak_tflops"] * 1e12 * PROFILE["mfu"]))
        assert t.compute_seconds > 0.01, t.compute_seconds
        t0 = time.perf_counter()
        t.steps(1)
        took = time.perf_counter() - t0
        assert took >= t.compute_seconds, (took, t.compute_seconds)
        t.steps(1)
        grad = self.grad_fn()
        recorded = [grad(*self._init_and_batch(r)) for r in range(self.world)]
        self.check_params(t.params, self.reference(lambda p, r: recorded[r]))
        t.close()

    def _init_and_batch(self, rank):
        return (self.seed.initial_params(self.model, tiny=True), *self.seed.synthetic_batch(rank, RECORD_BATCH, True))


test_case, test_session_exits_cleanly = session_tests(
    __file__, {"w2": 2}, case_names, timeout=60, test_timeout=90, requires=("jax", "optax", "flax")
)

if __name__ == "__main__":
    from tests.harness.paths import BENCHMARKS

    sys.path.insert(0, BENCHMARKS)
    worker_main(Worker, case_names)
