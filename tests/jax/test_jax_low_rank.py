"""bagua_jax's LowRankAlgorithm (PowerSGD) across real processes:

* the communicated gradients are bitwise the torch frontend's (same C++ step,
  same bucket layout, same seeded initial Q) through the warm-up and after it,
  with error feedback and without, under jax.jit, on 2 and 3 ranks;
* the error memory and Q live in the optax state (float32 for float32
  gradients; they survive pickling: a resumed update is bitwise the same);
* a rank larger than every matrix's smaller side raises at init;
* the loss goes down.

One multi-process session per world size runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import pickle

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests

SESSIONS = {"w2": 2, "w3": 3}
CASES = [
    "init",
    "matches_torch",
    "matches_torch_without_error_feedback",
    "state_pickles",
    "rank_too_large_refused",
    "loss_goes_down",
]
# (6, 5) and (8, 8) compress at rank 2 with min_compression_rate 1; (3, 4) does not pay; (7,) is 1-D
SHAPES = [(6, 5), (7,), (3, 4), (8, 8)]
STEPS = 5


class Worker(JaxWorker):
    def init(self):
        import bagua_jax

        bagua_jax.init_process_group()

    def algo_kwargs(self, **kw):
        return {"rank": 2, "start_iter": 2, "min_compression_rate": 1.0, **kw}

    def torch_grads(self, **kw):
        """The torch frontend's communicated gradients per step (zero
        parameters whose backward gives this rank's gradients)."""
        import bagua_torch.algorithms as ta

        torch = self.torch.torch
        params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES])
        model = torch.nn.Module()
        model.params = params
        model.forward = lambda gs: sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, gs))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        model = model.with_bagua([opt], ta.LowRankAlgorithm(**self.algo_kwargs(**kw)))
        out = []
        for t in range(STEPS):
            opt.zero_grad()
            model(self.rank_grads(SHAPES, t)).backward()
            out.append([p.grad.numpy().copy() for p in params])
            opt.step()
        model.bagua_ddp.close()
        return out

    def _matches_torch(self, **kw):
        import bagua_jax

        jax, jnp = self.jax, self.jnp
        want = self.torch_grads(**kw)
        tx = bagua_jax.transform(bagua_jax.LowRankAlgorithm(**self.algo_kwargs(**kw)))
        params = [jnp.zeros(s, jnp.float32) for s in SHAPES]
        state = tx.init(params)
        update = jax.jit(tx.update)
        for t in range(STEPS):
            u, state = update([jnp.asarray(g) for g in self.rank_grads(SHAPES, t)], state, params)
            for got, w in zip(u, want[t]):
                np.testing.assert_array_equal(np.asarray(got), w, err_msg=f"step {t}")
        # compressed past the warm-up: the (8, 8) gradient has rank 2
        assert np.linalg.matrix_rank(want[-1][3]) <= 2 < np.linalg.matrix_rank(want[0][3])

    def matches_torch(self):
        self._matches_torch()

    def matches_torch_without_error_feedback(self):
        self._matches_torch(error_feedback=False)

    def state_pickles(self):
        import bagua_jax

        jax, jnp = self.jax, self.jnp
        tx = bagua_jax.transform(bagua_jax.LowRankAlgorithm(**self.algo_kwargs()))
        params = [jnp.zeros(s, jnp.float32) for s in SHAPES]
        state = tx.init(params)
        numel = sum(int(np.prod(s)) for s in SHAPES)
        [block] = state.step_state
        assert block.dtype == jnp.float32 and block.shape == (numel + 5 * 2 + 8 * 2,), block.shape
        update = jax.jit(tx.update)
        for t in range(3):
            _, state = update([jnp.asarray(g) for g in self.rank_grads(SHAPES, t)], state, params)
        assert np.any(np.asarray(state.step_state[0]) != 0)
        restored = pickle.loads(pickle.dumps(jax.device_get(state)))
        g = [jnp.asarray(x) for x in self.rank_grads(SHAPES, 3)]
        ua, sa = update(g, restored, params)
        ub, sb = update(g, state, params)
        for a, b in zip(ua, ub):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(sa.step_state[0]), np.asarray(sb.step_state[0]))

    def rank_too_large_refused(self):
        import bagua_jax

        tx = bagua_jax.transform(bagua_jax.LowRankAlgorithm(rank=9))
        try:
            tx.init([self.jnp.zeros(s, self.jnp.float32) for s in SHAPES])
        except ValueError as e:
            assert "rank 9" in str(e) and "rank <= 8" in str(e), e
        else:
            raise AssertionError("expected ValueError")

    def loss_goes_down(self):
        import bagua_jax

        self.assert_training_reduces_loss(
            self.optax.chain(
                bagua_jax.transform(bagua_jax.LowRankAlgorithm(rank=1, start_iter=5, min_compression_rate=1.0)),
                self.optax.sgd(0.3),
            )
        )


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world) for name, world in SESSIONS.items()},
    lambda s: CASES,
    timeout=150,
    test_timeout=240,
    requires=("jax", "optax"),
)


if __name__ == "__main__":
    worker_main(Worker, lambda s: CASES)
