"""bagua_jax.transform across real processes, against independent references:

* numpy: the mean (or sum) of every rank's gradients, for a pytree of mixed
  float32/float16/bfloat16 leaves, eagerly and under jax.jit;
* the torch frontend, in the same processes: for every algorithm (flat and
  hierarchical, with 4 processes as 2 nodes) the communicated results are
  bitwise identical (same C++ step, same bucket layout);
* single-process training: data-parallel training with GradientAllReduce under
  jit equals full-batch training on one process;
* Decentralized's communication interval, its state checkpointed by pickling
  and resumed, a Flax model's params, every bad input, and a dead peer (an
  exception on every survivor, no hang).

One multi-process session per configuration runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import pickle

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests
from tests.harness.worker import exit_as_dead_peer, expect_failure_within

# session -> (world size, local world size)
SESSIONS = {"w2": (2, None), "w3": (3, None), "w4n2": (4, 2)}


def case_names(session: str):
    world, local = SESSIONS[session]
    names = [
        "not_initialised",
        "init",
        "algorithms_api",
        "bad_input",
        "allreduce_matches_numpy",
        "matches_torch_gradient_allreduce",
        "matches_torch_bytegrad",
        "matches_torch_decentralized",
        "interval_and_checkpoint",
        "training_equals_single_process",
        "flax_params",
        "structure_mismatch",
    ]
    if world % 2 == 0:
        names.append("matches_torch_decentralized_shift_one")
    if local:
        names += ["matches_torch_hierarchical"]
    if session == "w3":
        names.append("dead_peer")  # last: one rank leaves
    return names


# ---------------------------------------------------------------- worker side


class Worker(JaxWorker):
    def values(self, shapes, salt, rank=None, dtype=np.float32):
        rng = np.random.default_rng(977 * salt + (self.rank if rank is None else rank))
        return [rng.standard_normal(s).astype(dtype) for s in shapes]

    def all_values(self, shapes, salt, dtype=np.float32):
        return [self.values(shapes, salt, r, dtype) for r in range(self.world)]

    def expect_error(self, kind, fragment, fn):
        try:
            fn()
        except kind as e:
            assert fragment in str(e), f"{fragment!r} not in: {e}"
            return e
        raise AssertionError(f"no {kind.__name__} raised (expected one mentioning {fragment!r})")

    # -- cases --
    def not_initialised(self):
        import bagua_jax

        self.expect_error(
            bagua_jax.GroupNotInitializedError,
            "init_process_group",
            lambda: bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm()),
        )

    def init(self):
        import bagua_jax

        g = bagua_jax.init_process_group()
        assert g is bagua_jax.init() and g.size == self.world and g.rank == self.rank

    def algorithms_api(self):
        # signatures, defaults and errors against torch's: tests/core/test_algorithm_surfaces.py
        import bagua_jax
        from bagua_core import algorithms as core

        assert bagua_jax.algorithms.as_algorithm("bytegrad") == bagua_jax.ByteGradAlgorithm()
        assert bagua_jax.algorithms.as_algorithm(core.Decentralized()) == bagua_jax.DecentralizedAlgorithm()
        assert (
            bagua_jax.algorithms.Algorithm.init("decentralized", communication_interval=3).communication_interval == 3
        )

    def bad_input(self):
        import bagua_jax

        jnp = self.jnp
        self.expect_error(KeyError, "unknown algorithm 'nope'", lambda: bagua_jax.transform("nope"))
        self.expect_error(TypeError, "not the class", lambda: bagua_jax.transform(bagua_jax.ByteGradAlgorithm))
        self.expect_error(TypeError, "got int", lambda: bagua_jax.transform(3))
        self.expect_error(TypeError, "process group", lambda: bagua_jax.transform("bytegrad", process_group="g"))
        if self.world % 2:
            self.expect_error(
                ValueError,
                "even number",
                lambda: bagua_jax.transform(
                    bagua_jax.DecentralizedAlgorithm(hierarchical=False, peer_selection_mode="shift_one")
                ),
            )
        tx = bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm())
        self.expect_error(TypeError, "leaf ['a'] is a str", lambda: tx.init({"a": "text"}))
        self.expect_error(TypeError, "dtype int32", lambda: tx.init({"a": jnp.ones(3, jnp.int32)}))
        state = tx.init({"a": jnp.ones(3)})
        self.expect_error(TypeError, "BaguaState", lambda: tx.update({"a": jnp.ones(3)}, (), None))
        dec = bagua_jax.transform(bagua_jax.DecentralizedAlgorithm(hierarchical=False))
        dstate = dec.init({"a": jnp.ones(3)})
        self.expect_error(ValueError, "needs params", lambda: dec.update({"a": jnp.ones(3)}, dstate))
        self.expect_error(
            ValueError, "different tree structures", lambda: dec.update({"a": jnp.ones(3)}, dstate, {"b": jnp.ones(3)})
        )
        # the group still works after the refusals
        out, _ = tx.update({"a": jnp.full(3, float(self.rank))}, state)
        np.testing.assert_allclose(np.asarray(out["a"]), np.full(3, (self.world - 1) / 2))

    def allreduce_matches_numpy(self):
        import bagua_jax

        jax, jnp = self.jax, self.jnp
        shapes = [(5, 3), (7,), (2,), (4, 1)]
        dtypes = [jnp.float32, jnp.bfloat16, jnp.float32, jnp.float16]

        def tree(rank):
            # small integers: sums are exact in every dtype
            rng = np.random.default_rng(rank)
            v = [rng.integers(-4, 5, s).astype(np.float32) for s in shapes]
            return {
                "a": jnp.asarray(v[0], dtypes[0]),
                "b": [jnp.asarray(v[1], dtypes[1]), jnp.asarray(v[2], dtypes[2])],
                "c": {"d": jnp.asarray(v[3], dtypes[3])},
            }

        mine = tree(self.rank)
        total = jax.tree_util.tree_map(
            lambda *xs: sum(np.asarray(x, np.float64) for x in xs), *[tree(r) for r in range(self.world)]
        )
        for average in (False, True):
            tx = bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm(average=average))
            state = tx.init(mine)
            for update in (tx.update, jax.jit(tx.update)):
                out, new_state = update(mine, state)
                assert int(new_state.step) == 1
                for got, want, x in zip(
                    jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(total), jax.tree_util.tree_leaves(mine)
                ):
                    assert got.dtype == x.dtype and got.shape == x.shape
                    want = want / self.world if average else want
                    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-2 if average else 0)

    def _torch_grads(self, algorithm, grads):
        """The gradients a torch model wrapped with ``algorithm`` gets when
        every parameter's gradient is ``grads[i]`` on this rank."""
        tw = self.torch
        torch = tw.torch
        params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(g.shape)) for g in grads])
        model = torch.nn.Module()
        model.params = params
        model.forward = lambda: sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, grads))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        model = model.with_bagua([opt], algorithm)
        model().backward()
        out = [p.grad.detach().numpy().copy() for p in params]
        model.bagua_ddp.close()
        return out

    def _jax_updates(self, algorithm, leaves, params=None):
        import bagua_jax

        jnp = self.jnp
        tx = bagua_jax.transform(algorithm)
        state = tx.init([jnp.asarray(x) for x in (params or leaves)])
        out, _ = self.jax.jit(tx.update)(
            [jnp.asarray(x) for x in leaves], state, None if params is None else [jnp.asarray(p) for p in params]
        )
        return [np.asarray(x) for x in out]

    def _same_as_torch(self, torch_algo, jax_algo):
        shapes = [(6, 5), (7,), (3, 4), (11,)]  # 89 elements: not a multiple of 2, 3 or 4
        grads = self.values(shapes, salt=5)
        want = self._torch_grads(torch_algo, grads)
        got = self._jax_updates(jax_algo, grads)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        return got

    def matches_torch_gradient_allreduce(self):
        import bagua_jax
        import bagua_torch.algorithms as ta

        got = self._same_as_torch(ta.GradientAllReduceAlgorithm(), bagua_jax.GradientAllReduceAlgorithm())
        want = np.mean(np.stack([v[0] for v in self.all_values([(6, 5)], salt=5)]), axis=0)
        np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=1e-6)

    def matches_torch_bytegrad(self):
        import bagua_jax
        import bagua_torch.algorithms as ta

        got = self._same_as_torch(
            ta.ByteGradAlgorithm(hierarchical=False), bagua_jax.ByteGradAlgorithm(hierarchical=False)
        )
        want = np.mean(np.stack([v[0] for v in self.all_values([(6, 5)], salt=5)]), axis=0)
        np.testing.assert_allclose(got[0], want, atol=0.1)  # 8-bit codes

    def matches_torch_hierarchical(self):
        import bagua_jax
        import bagua_torch.algorithms as ta

        self._same_as_torch(
            ta.GradientAllReduceAlgorithm(hierarchical=True), bagua_jax.GradientAllReduceAlgorithm(hierarchical=True)
        )
        self._same_as_torch(ta.ByteGradAlgorithm(), bagua_jax.ByteGradAlgorithm())
        self._decentralized_same_as_torch(ta.DecentralizedAlgorithm(), bagua_jax.DecentralizedAlgorithm())

    def _decentralized_same_as_torch(self, torch_algo, jax_algo):
        tw = self.torch
        torch = tw.torch
        shapes = [(6, 5), (7,), (3, 4)]
        weights = self.values(shapes, salt=9)
        params = torch.nn.ParameterList([torch.nn.Parameter(torch.from_numpy(w.copy())) for w in weights])
        model = torch.nn.Module()
        model.params = params
        model.forward = lambda: sum((p * p).sum() for p in params)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        wrapped = model.with_bagua([opt], torch_algo)
        with torch.no_grad():  # wrapping broadcast rank 0's weights: each rank's own again
            for p, w in zip(params, weights):
                p.copy_(torch.from_numpy(w))
        wrapped().backward()  # the peer average replaces the weights before the optimizer step
        torch_delta = [(p.detach().numpy() - w) for p, w in zip(params, weights)]
        wrapped.bagua_ddp.close()
        jax_delta = self._jax_updates(jax_algo, [np.zeros_like(w) for w in weights], params=weights)
        for g, w in zip(jax_delta, torch_delta):
            np.testing.assert_array_equal(g, w)

    def matches_torch_decentralized(self):
        import bagua_jax
        import bagua_torch.algorithms as ta

        self._decentralized_same_as_torch(
            ta.DecentralizedAlgorithm(hierarchical=False), bagua_jax.DecentralizedAlgorithm(hierarchical=False)
        )

    def matches_torch_decentralized_shift_one(self):
        import bagua_jax
        import bagua_torch.algorithms as ta

        self._decentralized_same_as_torch(
            ta.DecentralizedAlgorithm(hierarchical=False, peer_selection_mode="shift_one"),
            bagua_jax.DecentralizedAlgorithm(hierarchical=False, peer_selection_mode="shift_one"),
        )

    def interval_and_checkpoint(self):
        import bagua_jax

        jax, jnp, optax = self.jax, self.jnp, self.optax
        tx = optax.chain(
            optax.sgd(0.1),
            bagua_jax.transform(bagua_jax.DecentralizedAlgorithm(hierarchical=False, communication_interval=2)),
        )
        params = {"w": jnp.full((3,), float(self.rank))}
        grads = {"w": jnp.ones(3)}
        state = tx.init(params)
        update = jax.jit(tx.update)
        mean = (self.world - 1) / 2
        u, state = update(grads, state, params)  # step 0 communicates
        np.testing.assert_allclose(np.asarray(u["w"]), mean - self.rank - 0.1, rtol=1e-6, atol=1e-6)
        u, state = update(grads, state, params)  # step 1 does not
        np.testing.assert_allclose(np.asarray(u["w"]), -0.1, rtol=1e-6)
        restored = pickle.loads(pickle.dumps(jax.device_get(state)))
        assert int(restored[1].step) == 2
        u, state = update(grads, restored, params)  # step 2 communicates again
        np.testing.assert_allclose(np.asarray(u["w"]), mean - self.rank - 0.1, rtol=1e-6, atol=1e-6)

    def training_equals_single_process(self):
        import bagua_jax

        jax, jnp, optax = self.jax, self.jnp, self.optax
        rng = np.random.default_rng(0)
        params = {
            "w1": jnp.asarray(rng.standard_normal((4, 16)) * 0.5, jnp.float32),
            "b1": jnp.zeros(16, jnp.float32),
            "w2": jnp.asarray(rng.standard_normal((16, 3)) * 0.5, jnp.float32),
        }

        def loss(p, x, y):
            logits = jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        def batch(step, rank):
            g = np.random.default_rng(10007 * step + rank)
            return g.standard_normal((8, 4)).astype(np.float32), g.integers(0, 3, 8)

        tx = optax.chain(bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm()), optax.sgd(0.1))
        ref_tx = optax.sgd(0.1)

        @jax.jit
        def step(p, s, x, y):
            u, s = tx.update(jax.grad(loss)(p, x, y), s, p)
            return optax.apply_updates(p, u), s

        @jax.jit
        def ref_step(p, s, x, y):
            u, s = ref_tx.update(jax.grad(loss)(p, x, y), s, p)
            return optax.apply_updates(p, u), s

        p, s, rp, rs = params, tx.init(params), params, ref_tx.init(params)
        for t in range(20):
            x, y = batch(t, self.rank)
            p, s = step(p, s, x, y)
            xs, ys = zip(*[batch(t, r) for r in range(self.world)])
            rp, rs = ref_step(rp, rs, np.concatenate(xs), np.concatenate(ys))
        for k in params:
            np.testing.assert_allclose(np.asarray(p[k]), np.asarray(rp[k]), rtol=1e-5, atol=1e-6)

    def flax_params(self):
        from flax import linen as nn

        import bagua_jax

        jax, jnp, optax = self.jax, self.jnp, self.optax

        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                x = nn.relu(nn.Dense(8, dtype=jnp.float32)(x))
                return nn.Dense(2, param_dtype=jnp.bfloat16, dtype=jnp.float32)(x)

        model = MLP()
        params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 3)))
        tx = optax.chain(bagua_jax.transform(bagua_jax.ByteGradAlgorithm()), optax.adam(1e-2))
        state = tx.init(params)
        x = jnp.asarray(np.random.default_rng(self.rank).standard_normal((4, 3)), jnp.float32)

        @jax.jit
        def step(p, s):
            g = jax.grad(lambda p: (model.apply(p, x) ** 2).mean())(p)
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        for _ in range(3):
            params, state = step(params, state)
        # every rank applied the same averaged gradients
        flat = np.concatenate([np.asarray(v, np.float32).ravel() for v in jax.tree_util.tree_leaves(params)])
        everyone = np.asarray(bagua_jax.allgather(jnp.asarray(flat)))
        for r in range(self.world):
            np.testing.assert_array_equal(everyone[r], flat)

    def structure_mismatch(self):
        import bagua_jax

        jnp = self.jnp
        tx = bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm())
        cases = [
            ({"a": jnp.ones(3)} if self.rank != 1 else {"a": jnp.ones(3), "b": jnp.ones(2)}, "['b']"),
            ({"a": jnp.ones(3 if self.rank != 1 else 4)}, "(4,)"),
            ({"a": jnp.ones(3, jnp.float32 if self.rank != 1 else jnp.float16)}, "float16"),
        ]
        for tree, fragment in cases:
            e = self.expect_error(ValueError, "differs across ranks", lambda: tx.init(tree))
            assert fragment in str(e), f"{fragment!r} not in: {e}"
        e = self.expect_error(ValueError, "rank 1", lambda: tx.init(cases[1][0]))
        assert "(4,)" in str(e)
        tx.init({"a": jnp.ones(3)})  # agreement again: no error

    def dead_peer(self):
        import bagua_jax

        jax, jnp = self.jax, self.jnp
        tx = bagua_jax.transform(bagua_jax.ByteGradAlgorithm(hierarchical=False))
        grads = {"w": jnp.ones(1 << 16)}
        state = tx.init(grads)
        exit_as_dead_peer("dead_peer", self.rank, self.world)
        expect_failure_within(
            45, lambda: np.asarray(jax.jit(tx.update)(grads, state)[0]["w"]), "step bytegrad", "PeerError"
        )


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, local) for name, (world, local) in SESSIONS.items()},
    case_names,
    timeout=150,
    test_timeout=240,
    requires=("jax", "optax", "flax"),
)

if __name__ == "__main__":
    worker_main(Worker, case_names)
