"""Local steps with an outer optimizer (LocalStepsAlgorithm) across real processes:

* torch: the weights after every step equal a numpy reference that simulates
  every rank (each rank's gradients are known everywhere): the inner SGD with
  momentum, the warm-up averages, the outer Nesterov SGD on the averaged
  pseudo-gradient every ``sync_interval`` steps; plain averaging
  (``outer_lr=1, outer_momentum=0``) gives the ranks' mean; flat on 2 and 3
  ranks, hierarchical on 4 ranks as 2 nodes;
* JAX gives bitwise the torch frontend's weights (same C++ step, same state),
  its state lives in the optax state and survives pickling, steps between
  synchronisations are the inner update alone;
* the description refuses bad settings (and every frontend with it:
  tests/core/test_algorithm_surfaces.py); the loss goes down in both frameworks.
"""

from __future__ import annotations

import os
import pickle

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests
from tests.harness.worker import expect_error

SESSIONS = {"w2": (2, None), "w3": (3, None), "w4n2": (4, 2)}
SHAPES = [(6, 5), (7,), (3, 4)]


def case_names(session: str):
    return [
        "init",
        "torch_matches_reference",
        "plain_averaging_is_the_mean",
        "jax_matches_torch",
        "jax_state_pickles_and_local_steps_are_local",
        "loss_goes_down",
    ]


def reference(world, grads_of, steps, lr, momentum, H, warmup, outer_lr, outer_mu, nesterov):
    """Every rank's weights after each step (float64), from zero weights:
    torch's SGD with momentum locally, then the algorithm's averages."""
    w = [[np.zeros(s) for s in SHAPES] for _ in range(world)]
    buf = [None] * world
    anchor = [np.zeros(s) for s in SHAPES]
    m = None
    out = []
    for t in range(steps):
        for r in range(world):
            g = grads_of(r, t)
            buf[r] = (
                [gi.astype(np.float64) for gi in g]
                if buf[r] is None
                else [momentum * b + gi for b, gi in zip(buf[r], g)]
            )
            w[r] = [wi - lr * b for wi, b in zip(w[r], buf[r])]
        if t < warmup:
            mean = [sum(w[r][k] for r in range(world)) / world for k in range(len(SHAPES))]
            w = [[x.copy() for x in mean] for _ in range(world)]
            anchor = [x.copy() for x in mean]
        elif (t - warmup + 1) % H == 0:
            d = [sum(anchor[k] - w[r][k] for r in range(world)) / world for k in range(len(SHAPES))]
            m = d if m is None else [outer_mu * mk + dk for mk, dk in zip(m, d)]
            u = [dk + outer_mu * mk for dk, mk in zip(d, m)] if nesterov else m
            anchor = [a - outer_lr * uk for a, uk in zip(anchor, u)]
            w = [[x.copy() for x in anchor] for _ in range(world)]
        out.append([[x.copy() for x in wr] for wr in w])
    return out


class Worker(JaxWorker):
    def grads_of(self, rank, step):
        rng = np.random.default_rng(977 * step + rank)  # as rank_grads, for any rank
        return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]

    def torch_model_of_grads(self):
        torch = self.torch.torch
        params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES])
        model = torch.nn.Module()
        model.params = params
        model.forward = lambda gs: sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, gs))
        return model, params

    def train_torch(self, algo, steps, lr, momentum=0.0):
        model, params = self.torch_model_of_grads()
        opt = self.torch.torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        model = model.with_bagua([opt], algo)
        out = []
        for t in range(steps):
            opt.zero_grad()
            model(self.grads_of(self.rank, t)).backward()
            opt.step()
            out.append([p.detach().numpy().copy() for p in params])
        model.bagua_ddp.close()
        return out

    @property
    def hierarchical(self):
        return int(os.environ.get("LOCAL_WORLD_SIZE", self.world)) < self.world

    def init(self):
        import bagua_jax

        bagua_jax.init_process_group()

    def torch_matches_reference(self):
        import bagua_torch.algorithms as ta

        cfg = dict(lr=0.1, momentum=0.9, H=3, warmup=2, outer_lr=0.7, outer_mu=0.9, nesterov=True)
        steps = 11
        got = self.train_torch(
            ta.LocalStepsAlgorithm(
                sync_interval=cfg["H"],
                warmup_steps=cfg["warmup"],
                outer_lr=cfg["outer_lr"],
                outer_momentum=cfg["outer_mu"],
                nesterov=True,
                hierarchical=self.hierarchical,
            ),
            steps,
            cfg["lr"],
            cfg["momentum"],
        )
        want = reference(self.world, self.grads_of, steps, **cfg)
        for t in range(steps):
            for g, w in zip(got[t], want[t][self.rank]):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"step {t}")
        # between synchronisations the ranks' weights differ: they trained locally
        assert not np.allclose(want[2][0][0], want[2][1][0])

    def plain_averaging_is_the_mean(self):
        import bagua_torch.algorithms as ta

        steps = 4
        got = self.train_torch(
            ta.LocalStepsAlgorithm(
                sync_interval=2, outer_lr=1.0, outer_momentum=0.0, nesterov=False, hierarchical=self.hierarchical
            ),
            steps,
            0.5,
        )
        want = reference(
            self.world,
            self.grads_of,
            steps,
            lr=0.5,
            momentum=0.0,
            H=2,
            warmup=0,
            outer_lr=1.0,
            outer_mu=0.0,
            nesterov=False,
        )
        for t in range(steps):
            for g, w in zip(got[t], want[t][self.rank]):
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"step {t}")
        mean = [sum(w for w in ws) / self.world for ws in zip(*[want[1][r] for r in range(self.world)])]
        for g, m in zip(got[1], mean):  # after the first synchronisation: the mean, up to rounding
            np.testing.assert_allclose(g, m, rtol=1e-6, atol=1e-6)

    def jax_matches_torch(self):
        """SGD with lr 1 (exact) inside; the transform's update is the step's
        result minus the params, compared as the torch weights' difference."""
        import bagua_jax
        import bagua_torch.algorithms as ta

        kw = dict(sync_interval=2, warmup_steps=1, outer_lr=0.7, outer_momentum=0.9, hierarchical=self.hierarchical)
        steps = 6
        torch_weights = self.train_torch(ta.LocalStepsAlgorithm(**kw), steps, 1.0)
        jnp = self.jnp
        tx = self.optax.chain(self.optax.sgd(1.0), bagua_jax.transform(bagua_jax.LocalStepsAlgorithm(**kw)))
        p = [jnp.zeros(s, jnp.float32) for s in SHAPES]
        state = tx.init(p)
        update = self.jax.jit(tx.update)
        for t in range(steps):
            u, state = update([jnp.asarray(g) for g in self.grads_of(self.rank, t)], state, p)
            prev = [np.zeros(s, np.float32) for s in SHAPES] if t == 0 else torch_weights[t - 1]
            for got_u, w, pv in zip(u, torch_weights[t], prev):
                np.testing.assert_array_equal(np.asarray(got_u), w - pv, err_msg=f"step {t}")
            p = [jnp.asarray(w) for w in torch_weights[t]]

    def jax_state_pickles_and_local_steps_are_local(self):
        import bagua_jax

        jax, jnp, optax = self.jax, self.jnp, self.optax
        tx = optax.chain(optax.sgd(0.1), bagua_jax.transform(bagua_jax.LocalStepsAlgorithm(sync_interval=3)))
        params = {"w": jnp.zeros((5,), jnp.float32)}
        state = tx.init(params)
        assert state[1].step_state[0].shape == (10,)  # the anchor and the outer momentum
        update = jax.jit(tx.update)
        g = {"w": jnp.asarray(self.rank_grads([(5,)], 0)[0])}
        for _ in range(2):  # steps 0 and 1 stay local: the plain SGD update
            u, state = update(g, state, params)
            np.testing.assert_array_equal(np.asarray(u["w"]), np.asarray(-0.1 * g["w"]))
        restored = pickle.loads(pickle.dumps(jax.device_get(state)))
        ua, sa = update(g, restored, params)  # step 2 synchronises
        ub, sb = update(g, state, params)
        np.testing.assert_array_equal(np.asarray(ua["w"]), np.asarray(ub["w"]))
        np.testing.assert_array_equal(np.asarray(sa[1].step_state[0]), np.asarray(sb[1].step_state[0]))
        assert not np.array_equal(np.asarray(ua["w"]), np.asarray(-0.1 * g["w"]))

    def loss_goes_down(self):
        import bagua_jax

        self.assert_training_reduces_loss(
            self.optax.chain(self.optax.sgd(0.3), bagua_jax.transform(bagua_jax.LocalStepsAlgorithm(sync_interval=4)))
        )


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, local) for name, (world, local) in SESSIONS.items()},
    case_names,
    timeout=150,
    test_timeout=240,
    requires=("jax", "optax"),
)


def test_bad_settings_are_refused():
    from bagua_core.algorithms import LocalSteps

    expect_error(ValueError, lambda: LocalSteps(sync_interval=0), "sync_interval must be >= 1")
    expect_error(TypeError, lambda: LocalSteps(sync_interval=2.5), "sync_interval must be an int")
    expect_error(ValueError, lambda: LocalSteps(outer_lr=0.0), "outer_lr must be > 0")
    expect_error(ValueError, lambda: LocalSteps(outer_momentum=1.0), "outer_momentum must be >= 0.0 and < 1.0")
    expect_error(TypeError, lambda: LocalSteps(outer_lr="0.7"), "outer_lr must be a number")
    expect_error(TypeError, lambda: LocalSteps(nesterov=1), "nesterov must be a bool")
    expect_error(ValueError, lambda: LocalSteps(warmup_steps=-1), "warmup_steps must be >= 0")


if __name__ == "__main__":
    worker_main(Worker, case_names)
