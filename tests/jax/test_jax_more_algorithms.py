"""bagua_jax's low-precision decentralized SGD and QAdam across real processes:

* LowPrecisionDecentralizedAlgorithm: the torch frontend, in the same
  processes, gives bitwise the same weights over three steps (same C++ step,
  same replicas), flat on 2 and 3 ranks and hierarchical on 4 ranks as 2
  nodes; the replicas live in the optax state (they survive pickling); the
  communication interval is honoured;
* QAdam (bagua_jax.qadam wrapped by transform(QAdamAlgorithm(...))): the
  communicated momentum is bitwise the torch frontend's after the switch,
  and the weights agree closely across the warm-up switch; bagua_jax.qadam
  alone is optax.adam while warming up; bad input;
* the loss goes down under jax.jit with both.

One multi-process session per configuration runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import pickle

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests
from tests.harness.worker import expect_error

SESSIONS = {"w2": (2, None), "w3": (3, None), "w4n2": (4, 2)}


def case_names(session: str):
    world, local = SESSIONS[session]
    names = [
        "init",
        "matches_torch_flat",
        "state_pickles_and_interval",
        "loss_goes_down",
        "qadam_alone_is_adam",
        "qadam_momentum_matches_torch",
        "qadam_through_switch_matches_torch",
        "qadam_bad_input",
        "qadam_loss_goes_down",
    ]
    if local:
        names.append("matches_torch_hierarchical")
    return names


class Worker(JaxWorker):
    def torch_model_of_grads(self, shapes):
        """A torch module of zero parameters of ``shapes`` whose forward(gs)
        makes backward give exactly the numpy gradients gs; (module, parameters)."""
        torch = self.torch.torch
        params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])
        model = torch.nn.Module()
        model.params = params
        model.forward = lambda gs: sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, gs))
        return model, params

    def init(self):
        import bagua_jax

        bagua_jax.init_process_group()

    def _matches_torch(self, hierarchical):
        """Weights start at zero on every rank; each step's gradient differs per
        rank; SGD with lr 1 (exact); both frontends after 3 steps."""
        import bagua_jax
        import bagua_torch.algorithms as ta

        shapes = [(6, 5), (7,), (3, 4)]
        steps = 3
        model, params = self.torch_model_of_grads(shapes)
        opt = self.torch.torch.optim.SGD(model.parameters(), lr=1.0)
        model = model.with_bagua([opt], ta.LowPrecisionDecentralizedAlgorithm(hierarchical=hierarchical))
        torch_weights = []
        for t in range(steps):
            opt.zero_grad()
            model(self.rank_grads(shapes, t)).backward()
            opt.step()
            torch_weights.append([p.detach().numpy().copy() for p in params])
        model.bagua_ddp.close()

        jnp = self.jnp
        tx = self.optax.chain(
            self.optax.sgd(1.0),
            bagua_jax.transform(bagua_jax.LowPrecisionDecentralizedAlgorithm(hierarchical=hierarchical)),
        )
        p = [jnp.zeros(s, jnp.float32) for s in shapes]
        state = tx.init(p)
        update = self.jax.jit(tx.update)
        for t in range(steps):
            u, state = update([jnp.asarray(g) for g in self.rank_grads(shapes, t)], state, p)
            # the step's result is p + u; compare it as the communicated weights
            want = torch_weights[t]
            prev = [np.zeros(s, np.float32) for s in shapes] if t == 0 else torch_weights[t - 1]
            for got_u, w, pv in zip(u, want, prev):
                np.testing.assert_array_equal(np.asarray(got_u), w - pv)
            p = [jnp.asarray(w) for w in want]  # continue from the same weights

    def matches_torch_flat(self):
        self._matches_torch(False)

    def matches_torch_hierarchical(self):
        self._matches_torch(True)

    def state_pickles_and_interval(self):
        import bagua_jax

        jax, jnp, optax = self.jax, self.jnp, self.optax
        tx = optax.chain(
            optax.sgd(0.1),
            bagua_jax.transform(
                bagua_jax.LowPrecisionDecentralizedAlgorithm(hierarchical=False, communication_interval=2)
            ),
        )
        params = {"w": jnp.zeros((5,), jnp.float32)}
        state = tx.init(params)
        assert state[1].step_state[0].shape == (15,)
        update = jax.jit(tx.update)
        g = {"w": jnp.asarray(self.rank_grads([(5,)], 0)[0])}
        u0, state = update(g, state, params)  # step 0 communicates: replicas move
        assert np.any(np.asarray(state[1].step_state[0]) != 0)
        u1, state = update(g, state, params)  # step 1 does not: the plain SGD update
        np.testing.assert_array_equal(np.asarray(u1["w"]), np.asarray(-0.1 * g["w"]))
        restored = pickle.loads(pickle.dumps(jax.device_get(state)))
        ua, sa = update(g, restored, params)
        ub, sb = update(g, state, params)
        np.testing.assert_array_equal(np.asarray(ua["w"]), np.asarray(ub["w"]))
        np.testing.assert_array_equal(np.asarray(sa[1].step_state[0]), np.asarray(sb[1].step_state[0]))

    def loss_goes_down(self):
        import bagua_jax

        self.assert_training_reduces_loss(
            self.optax.chain(self.optax.sgd(0.3), bagua_jax.transform(bagua_jax.LowPrecisionDecentralizedAlgorithm()))
        )

    # -- QAdam --
    def qadam_alone_is_adam(self):
        import bagua_jax

        jnp, optax = self.jnp, self.optax
        p = {"w": jnp.asarray(np.arange(6, dtype=np.float32) / 7)}
        q, a = bagua_jax.qadam(0.01, warmup_steps=1000), optax.adam(0.01)
        qs, as_ = q.init(p), a.init(p)
        for t in range(10):
            g = {"w": jnp.asarray(self.rank_grads([(6,)], t)[0])}
            qu, qs = q.update(g, qs, p)
            au, as_ = a.update(g, as_, p)
            np.testing.assert_allclose(np.asarray(qu["w"]), np.asarray(au["w"]), rtol=1e-5, atol=1e-7)

    def _qadam_pair(self, warmup, steps, hierarchical=False):
        """torch and JAX QAdam from zero weights with per-rank gradients; returns
        per step (torch weights, torch momentum, jax weights, jax momentum)."""
        import bagua_jax
        import bagua_torch.algorithms as ta

        shapes = [(6, 5), (7,), (3, 4)]
        model, params = self.torch_model_of_grads(shapes)
        opt = ta.QAdamOptimizer(model.parameters(), lr=0.01, warmup_steps=warmup)
        model = model.with_bagua([opt], ta.QAdamAlgorithm(opt, hierarchical=hierarchical))
        out = []
        for t in range(steps):
            opt.zero_grad()
            model(self.rank_grads(shapes, t)).backward()
            opt.step()
            out.append(
                ([p.detach().numpy().copy() for p in params], [opt.state[p]["exp_avg"].numpy().copy() for p in params])
            )
        model.bagua_ddp.close()

        jnp = self.jnp
        tx = bagua_jax.transform(
            bagua_jax.QAdamAlgorithm(bagua_jax.qadam(0.01, warmup_steps=warmup), hierarchical=hierarchical)
        )
        p = [jnp.zeros(s, jnp.float32) for s in shapes]
        state = tx.init(p)
        update = self.jax.jit(tx.update)
        res = []
        for t in range(steps):
            u, state = update([jnp.asarray(g) for g in self.rank_grads(shapes, t)], state, p)
            p = self.optax.apply_updates(p, u)
            res.append(([np.asarray(x) for x in p], [np.asarray(m) for m in state.mu]))
        return out, res

    def qadam_momentum_matches_torch(self):
        # compressing from the first step: the momentum is the engine's alone
        # (the weights are not compared: with no warm-up the second moment is
        # zero, so the steps are lr * m / eps)
        out, res = self._qadam_pair(warmup=1, steps=3)
        for (_, tm), (_, jm) in zip(out, res):
            assert any(np.any(m != 0) for m in tm)
            for a, b in zip(tm, jm):
                np.testing.assert_array_equal(a, b)

    def qadam_through_switch_matches_torch(self):
        out, res = self._qadam_pair(warmup=3, steps=5)
        for (tw, tm), (jw, jm) in zip(out, res):
            for a, b in zip(tm + tw, jm + jw):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    def qadam_bad_input(self):
        import bagua_jax

        expect_error(TypeError, lambda: bagua_jax.QAdamAlgorithm(self.optax.adam(0.1)), "bagua_jax.qadam")
        expect_error(ValueError, lambda: bagua_jax.qadam(0.1, warmup_steps=0), "warmup_steps")
        expect_error(ValueError, lambda: bagua_jax.qadam(0.1, b1=1.0), "b1")
        expect_error(
            TypeError,
            lambda: bagua_jax.transform(bagua_jax.QAdamAlgorithm(bagua_jax.qadam(0.1)).to_core()),
            "needs its optimizer",
        )

    def qadam_loss_goes_down(self):
        import bagua_jax

        self.assert_training_reduces_loss(
            bagua_jax.transform(
                bagua_jax.QAdamAlgorithm(bagua_jax.qadam(self.optax.constant_schedule(0.05), warmup_steps=10))
            )
        )


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, local) for name, (world, local) in SESSIONS.items()},
    case_names,
    timeout=150,
    test_timeout=240,
    requires=("jax", "optax"),
)


if __name__ == "__main__":
    worker_main(Worker, case_names)
