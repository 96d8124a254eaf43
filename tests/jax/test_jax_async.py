"""bagua_jax's asynchronous model average across real processes:

* a fixed schedule (sync interval longer than the run, explicit abort): the
  weights abort returns are the mean of what each rank trained alone, against
  numpy training and torch.distributed all_gather; the warm-up averages the
  updates; the torch frontend in the same processes gives the same weights;
  each schedule runs eagerly and as one jitted step, with bitwise the same
  weights;
* abort/resume cycles of a jitted step leave every rank with the same
  weights; the loss goes down under jit; a second init (a rollback) keeps a
  step jitted before working, on the new weights;
* misuse: init inside jit, missing params, other dtypes, update before init,
  bad hyperparameters, each a clear exception;
* inside ``nnx.Optimizer`` (init gets ``nnx.Param``-wrapped state, update
  plain arrays) under ``nnx.jit``: trains, and abort gives every rank the
  same weights.

One multi-process session per world size runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import time

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import session_tests
from tests.harness.worker import expect_error

SESSIONS = {"w2": 2, "w3": 3}
NEVER_MS = 10**7
SHAPES = [(6, 5), (7,), (3, 4)]


def case_names(session: str):
    return [
        "init",
        "abort_gives_exact_average",
        "warmup_averages_updates",
        "matches_torch",
        "abort_resume_cycles",
        "jitted_step_during_round_kept",
        "second_init_under_jit",
        "half_precision_step",
        "misuse_refused",
        "loss_goes_down",
        "nnx_optimizer",
    ]


class Worker(JaxWorker):
    def grads(self, step):
        return self.rank_grads(SHAPES, step)

    def start(self):
        rng = np.random.default_rng(5)  # the same on every rank
        return [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in SHAPES]

    def gathered_mean(self, leaves):
        """numpy mean over the ranks, gathered with torch.distributed."""
        torch = self.torch.torch
        flat = torch.from_numpy(np.concatenate([np.ravel(x) for x in leaves]))
        every = [torch.empty_like(flat) for _ in range(self.world)]
        self.torch.dist.all_gather(every, flat)
        return np.mean(np.stack([e.double().numpy() for e in every]), axis=0)

    def same_everywhere(self, leaves):
        torch = self.torch.torch
        flat = torch.from_numpy(np.concatenate([np.ravel(np.asarray(x)) for x in leaves]))
        every = [torch.empty_like(flat) for _ in range(self.world)]
        self.torch.dist.all_gather(every, flat)
        for r, e in enumerate(every):
            assert torch.equal(e, flat), f"rank {r} differs from rank {self.rank}"

    def init(self):
        import bagua_jax

        bagua_jax.init_process_group()
        _ = self.torch  # torch.distributed for the references

    def _sgd_step(self, tx, jit):
        optax = self.optax

        def step(p, state, g):
            u, state = tx.update(g, state, p)
            return optax.apply_updates(p, u), state

        return self.jax.jit(step) if jit else step

    def _run(self, algo, steps, lr=0.1, jit=False):
        """Training with SGD, eager or one jitted step; returns the final params (list of leaves)."""
        import bagua_jax

        jnp, optax = self.jnp, self.optax
        tx = optax.chain(optax.sgd(lr), bagua_jax.transform(algo))
        step = self._sgd_step(tx, jit)
        p = [jnp.asarray(x) for x in self.start()]
        state = tx.init(p)
        for t in range(steps):
            p, state = step(p, state, [jnp.asarray(g) for g in self.grads(t)])
        return p

    def _schedule(self, warmup):
        import bagua_jax

        eager = bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=NEVER_MS, warmup_steps=warmup)
        p_eager = self._run(eager, 6)
        eager.abort(p_eager)
        eager._binding.close()
        algo = bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=NEVER_MS, warmup_steps=warmup)
        p = self._run(algo, 6, jit=True)
        for a, b in zip(p, p_eager):  # the same engine step, eagerly and jitted
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        ref = [x.astype(np.float32) for x in self.start()]
        for t in range(6):
            g = self.grads(t)
            if t < warmup:  # the warm-up averages the (SGD) updates over the ranks
                mean = self.gathered_mean(g)
                off = 0
                g = []
                for s in SHAPES:
                    n = int(np.prod(s))
                    g.append(mean[off : off + n].reshape(s).astype(np.float32))
                    off += n
            ref = [r - np.float32(0.1) * x for r, x in zip(ref, g)]
        for got, want in zip(p, ref):
            np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-5)
        assert algo._binding.averager.rounds == 0
        final = algo.abort(p)
        leaves = self.jax.tree_util.tree_leaves(final)
        self.same_everywhere(leaves)
        got = np.concatenate([np.ravel(np.asarray(x)) for x in leaves])
        np.testing.assert_allclose(got, self.gathered_mean(ref), rtol=0, atol=1e-5)
        algo._binding.close()

    def abort_gives_exact_average(self):
        self._schedule(0)

    def warmup_averages_updates(self):
        self._schedule(2)

    def matches_torch(self):
        """The same schedule in both frontends: the same weights after abort."""
        import bagua_jax
        import bagua_torch.algorithms as ta

        torch = self.torch.torch
        params = torch.nn.ParameterList([torch.nn.Parameter(torch.from_numpy(x.copy())) for x in self.start()])
        model = torch.nn.Module()
        model.params = params
        model.forward = lambda gs: sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, gs))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        talgo = ta.AsyncModelAverageAlgorithm(sync_interval_ms=NEVER_MS, warmup_steps=2)
        model = model.with_bagua([opt], talgo)
        for t in range(6):
            opt.zero_grad()
            model(self.grads(t)).backward()
            opt.step()
        talgo.abort(model)
        want = np.concatenate([p.detach().numpy().ravel() for p in params])
        model.bagua_ddp.close()

        algo = bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=NEVER_MS, warmup_steps=2)
        p = self._run(algo, 6)
        got = np.concatenate([np.ravel(np.asarray(x)) for x in algo.abort(p)])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        algo._binding.close()

    def abort_resume_cycles(self):
        import bagua_jax

        jnp, optax = self.jnp, self.optax
        algo = bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=2, warmup_steps=1)
        tx = optax.chain(optax.sgd(0.05), bagua_jax.transform(algo))
        step = self._sgd_step(tx, jit=True)
        p = [jnp.asarray(x) for x in self.start()]
        state = tx.init(p)
        t = 0
        for _cycle in range(3):
            for _ in range(8):
                p, state = step(p, state, [jnp.asarray(g) for g in self.grads(t)])
                t += 1
                time.sleep(0.005)
            p = algo.abort(p)
            p2 = algo.abort(p)  # idempotent
            for a, b in zip(p, p2):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            self.same_everywhere(p)
            algo.resume(p)
            algo.resume(p)  # idempotent
        assert algo._binding.averager.rounds >= 3
        algo.abort(p)
        algo._binding.close()

    def jitted_step_during_round_kept(self):
        """One round held (engine test hook) after its snapshot w0; every rank
        runs a jitted step (ranks > 0 with the round's allreduce in flight),
        then the round applies: each rank must hold mean(w0) + (w1 - w0), w1
        its weights after that step: the step is neither lost nor torn."""
        import bagua_jax

        jnp, optax = self.jnp, self.optax
        algo = bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=5)
        tx = optax.chain(optax.sgd(0.5), bagua_jax.transform(algo))
        step = self._sgd_step(tx, jit=True)
        p = [jnp.asarray(x) for x in self.start()]
        state = tx.init(p)
        binding = algo._binding
        hook = binding.averager.core
        flat = lambda: np.concatenate([np.ravel(np.asarray(x)) for x in binding.read()])  # noqa: E731
        hook._test_hold(True)
        try:
            p, state = step(p, state, [jnp.asarray(g) for g in self.grads(0)])  # starts the loop
            binding.settle()
            assert hook._test_wait_held(30.0), "no round took its snapshot"
            w0 = flat()  # the snapshot: nothing changed the weights since
            if self.rank > 0:
                hook._test_release_held()  # its allreduce now waits for rank 0
            p, state = step(p, state, [jnp.asarray(g) for g in self.grads(1)])
            binding.settle()
            w1 = flat()
            self.torch.dist.barrier()  # every rank stepped before rank 0 lets the allreduce finish
            if self.rank == 0:
                hook._test_release_held()
            deadline = time.monotonic() + 30.0
            while binding.averager.rounds < 1:
                assert time.monotonic() < deadline, "the held round did not finish"
                time.sleep(0.005)
            got = flat()  # the next round, if any, is held after its snapshot
        finally:
            hook._test_hold(False)
        mean = self.gathered_mean([w0])
        assert np.abs(w1 - w0).max() > 1e-3 and np.abs(w0 - mean).max() > 1e-2, "the test would not tell"
        np.testing.assert_allclose(got, mean + (w1.astype(np.float64) - w0), rtol=0, atol=1e-5)
        self.same_everywhere(self.jax.tree_util.tree_leaves(algo.abort(p)))
        algo._binding.close()

    def second_init_under_jit(self):
        """A step jitted before a second init (a rollback to other weights)
        trains the weights of the new init: no stale buffers, no error."""
        import bagua_jax

        jnp, optax = self.jnp, self.optax
        algo = bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=NEVER_MS)
        tx = optax.chain(optax.sgd(0.1), bagua_jax.transform(algo))
        step = self._sgd_step(tx, jit=True)
        g = [jnp.asarray(x) for x in self.grads(0)]
        p = [jnp.asarray(x) for x in self.start()]
        state = tx.init(p)
        for _ in range(3):
            p, state = step(p, state, g)
        algo.abort(p)
        fresh = [jnp.asarray(x) * 2 for x in self.start()]
        state = tx.init(fresh)  # the steps above may still be in flight
        p, state = step(fresh, state, g)
        want = [np.float32(2) * x - np.float32(0.1) * np.asarray(y) for x, y in zip(self.start(), g)]
        for got, w in zip(p, want):
            np.testing.assert_allclose(np.asarray(got), w, rtol=0, atol=1e-6)
        final = self.jax.tree_util.tree_leaves(algo.abort(p))
        self.same_everywhere(final)
        algo._binding.close()

    def half_precision_step(self):
        """The engine's step in float16 and bfloat16 rounds after every
        operation, as numpy (ml_dtypes) does: u' = (w + u) - p, w = p + u'."""
        import ml_dtypes

        import bagua_jax

        jnp = self.jnp
        for dtype in (np.float16, ml_dtypes.bfloat16):
            algo = bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=NEVER_MS)
            tx = bagua_jax.transform(algo)
            update = self.jax.jit(tx.update)
            start = [x.astype(dtype) for x in self.start()]
            state = tx.init([jnp.asarray(x) for x in start])
            w = start
            for t in range(3):
                u = [(np.float32(0.3) * g).astype(dtype) for g in self.grads(t)]
                p = [(x * np.float32(1.5 + t)).astype(dtype) for x in start]  # not the weights: w moves them
                got, state = update([jnp.asarray(x) for x in u], state, [jnp.asarray(x) for x in p])
                want = [(wi + ui) - pi for wi, ui, pi in zip(w, u, p)]
                w = [pi + wi for pi, wi in zip(p, want)]
                for a, b in zip(got, want):
                    assert np.asarray(a).dtype == dtype
                    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), b.view(np.uint16))
            algo.abort()
            algo._binding.close()

    def misuse_refused(self):
        import bagua_jax

        jax, jnp, optax = self.jax, self.jnp, self.optax

        A = bagua_jax.AsyncModelAverageAlgorithm
        expect_error(ValueError, lambda: A(sync_interval_ms=-5), "sync_interval_ms")
        expect_error(ValueError, lambda: A(warmup_steps=-1), "warmup_steps")
        expect_error(ValueError, lambda: A(peer_selection_mode="shift_one"), "peer_selection_mode")
        assert isinstance(bagua_jax.algorithms.Algorithm.init("async", sync_interval_ms=3), A)
        algo = A(sync_interval_ms=NEVER_MS)
        tx = optax.chain(optax.sgd(0.1), bagua_jax.transform(algo))
        p = [jnp.asarray(x) for x in self.start()]
        g = [jnp.asarray(x) for x in self.grads(0)]
        unbound = bagua_jax.transform(A())
        expect_error(
            RuntimeError, lambda: unbound.update(g, bagua_jax.BaguaState(step=jnp.zeros([], jnp.int32)), p), "init"
        )
        expect_error(TypeError, lambda: jax.jit(tx.init)(p), "inside jax.jit")
        state = tx.init(p)
        expect_error(ValueError, lambda: tx.update(g, state), "needs params")
        as16 = [x.astype(jnp.float16) for x in p]
        expect_error(TypeError, lambda: tx.update(g, state, as16), "params leaf 0 is float16")
        expect_error(ValueError, lambda: tx.update(g[:2], state, p[:2]), "shapes of those given to init")
        algo.abort(p)
        algo._binding.close()

    def loss_goes_down(self):
        import bagua_jax

        algo = bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=5, warmup_steps=5)
        tx = self.optax.chain(self.optax.sgd(0.3), bagua_jax.transform(algo))
        self.assert_training_reduces_loss(tx, finish=algo.abort)
        assert algo._binding.averager.rounds > 0
        algo._binding.close()

    def nnx_optimizer(self):
        from flax import nnx

        import bagua_jax

        jnp, optax = self.jnp, self.optax
        model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
        algo = bagua_jax.AsyncModelAverageAlgorithm(sync_interval_ms=2, warmup_steps=2)
        optimizer = nnx.Optimizer(model, optax.chain(optax.sgd(0.05), bagua_jax.transform(algo)), wrt=nnx.Param)
        x, y = jnp.ones((8, 4)) * (self.rank + 1), jnp.zeros((8, 2))

        @nnx.jit
        def train_step(model, optimizer):
            optimizer.update(model, nnx.grad(lambda m: ((m(x) - y) ** 2).mean())(model))

        for _ in range(10):
            train_step(model, optimizer)
            time.sleep(0.005)
        nnx.update(model, algo.abort(nnx.state(model, nnx.Param)))
        self.same_everywhere(self.jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
        algo._binding.close()


test_case, test_session_exits_cleanly = session_tests(
    __file__, SESSIONS, case_names, timeout=150, test_timeout=240, requires=("jax", "optax")
)


if __name__ == "__main__":
    worker_main(Worker, case_names)
