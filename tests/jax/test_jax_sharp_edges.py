"""The first things a JAX user runs into, across real processes (2 and 3):

* ``tx.init`` while jitted steps are still in flight (a second optimizer, a
  rollback) waits for them: no MismatchError, no hang (GradientAllReduce and
  Decentralized);
* ranks that start from different params get a warning naming
  ``bagua_jax.broadcast_params``, which makes them rank 0's;
* QAdam on float16 params is refused at ``init``, not at the first step;
* a state made under another ``BAGUA_BUCKET_SIZE`` goes on in the new
  buckets (ByteGrad's residual), or, laid out its own way (LowRank's), is
  refused with a message naming the bucket size;
* a script that exits with jitted steps in flight exits cleanly: the steps
  finish before Bagua's group closes (its own launch: the check is the
  processes' stderr).
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from tests.harness import mp
from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests
from tests.harness.worker import expect_error

SESSIONS = {"w2": 2, "w3": 3}
CASES = ["init_while_steps_in_flight", "different_params", "qadam_float16_at_init", "bucket_size_change"]
# a regression hangs for BAGUA_TIMEOUT: keep it well inside the session's timeout
ENV = {"BAGUA_TIMEOUT": "40"}


class Worker(JaxWorker):
    def __init__(self):
        super().__init__()
        import bagua_jax

        bagua_jax.init_process_group()

    def jitted_steps(self, tx, params, steps):
        """``steps`` jitted updates dispatched and not waited for."""
        jax = self.jax
        state = tx.init(params)
        step = jax.jit(lambda p, s, g: tx.update(g, s, p))
        for t in range(steps):
            u, state = step(params, state, self.jnp.full_like(params, float(t + self.rank)))
        return u

    def init_while_steps_in_flight(self):
        import bagua_jax

        optax = self.optax
        for make in (bagua_jax.GradientAllReduceAlgorithm, bagua_jax.DecentralizedAlgorithm):
            params = self.jnp.ones(1 << 16)
            weights = make().to_core().plan().communicates == "weights"

            def tx_of():
                t = bagua_jax.transform(make())
                return optax.chain(optax.sgd(0.1), t) if weights else optax.chain(t, optax.sgd(0.1))

            pending = self.jitted_steps(tx_of(), params, 10)
            for _ in range(3):  # each init meets the same collectives in the same order on every rank
                tx_of().init(params)
            assert np.all(np.isfinite(np.asarray(pending)))

    def different_params(self):
        import bagua_jax

        tx = bagua_jax.transform("gradient_allreduce")
        params = {"w": self.jnp.full((3, 2), float(self.rank)), "b": self.jnp.zeros(2)}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tx.init(params)
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert any("broadcast_params" in m and "['w']" in m for m in messages), messages
        same = bagua_jax.broadcast_params(params)
        np.testing.assert_array_equal(np.asarray(same["w"]), np.zeros((3, 2)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tx.init(same)
        assert not [w for w in caught if "broadcast_params" in str(w.message)]

    def qadam_float16_at_init(self):
        import bagua_jax

        tx = bagua_jax.transform(bagua_jax.QAdamAlgorithm(bagua_jax.qadam(0.1)))
        expect_error(ValueError, lambda: tx.init(self.jnp.ones(5, self.jnp.float16)), "QAdam needs float32")

    def bucket_size_change(self):
        import bagua_jax

        params = [self.jnp.ones((40, 25)), self.jnp.ones((40, 25))]
        made = {}
        for size in (None, "4000"):  # one bucket of both, then one bucket each
            if size:
                os.environ["BAGUA_BUCKET_SIZE"] = size
            try:
                made[size] = [
                    bagua_jax.transform(bagua_jax.ByteGradAlgorithm(error_feedback=True)),
                    bagua_jax.transform(bagua_jax.LowRankAlgorithm()),
                ]
            finally:
                os.environ.pop("BAGUA_BUCKET_SIZE", None)
        bytegrad, low_rank = made["4000"]
        _, state = bytegrad.update(params, made[None][0].init(params))  # the residual is moved, tensor by tensor
        assert [x.shape for x in state.step_state] == [x.shape for x in bytegrad.init(params).step_state]
        expect_error(  # low rank's own layout is not
            ValueError,
            lambda: low_rank.update(params, made[None][1].init(params)),
            "BAGUA_BUCKET_SIZE=4000",
            "laid out its own way",
        )


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, env=ENV) for name, world in SESSIONS.items()},
    lambda s: CASES,
    timeout=150,
    test_timeout=200,
    requires=("jax", "optax"),
)

EXIT_WITH_STEPS_IN_FLIGHT = """
import jax, jax.numpy as jnp, optax, bagua_jax
bagua_jax.init_process_group()
tx = optax.chain(bagua_jax.transform("gradient_allreduce"), optax.sgd(0.1))
p = jnp.ones((512, 512))
s = tx.init(p)
step = jax.jit(lambda p, s: tx.update(p * 1.0001, s, p))
for _ in range(20):
    u, s = step(p, s)
"""


def test_exit_with_steps_in_flight():
    import pytest

    pytest.importorskip("jax")
    run = mp.launch(EXIT_WITH_STEPS_IN_FLIGHT, 2, timeout=120, env=ENV)
    assert run.ok(), run.summary()
    for w in run.workers:
        assert "Exception ignored" not in w.stderr and "Traceback" not in w.stderr, run.summary()


if __name__ == "__main__":
    worker_main(Worker, lambda s: CASES)
