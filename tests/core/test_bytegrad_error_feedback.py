"""ByteGrad with error feedback across real processes (2 and 3), against a
numpy reference of the whole scheme, every rank simulated
(tests/harness/reference/compressed_exchange.py): each rank adds its residual to its
padded bucket, compresses it in one chunk per rank, keeps e = x -
decompress(compress(x)) and the exchange goes on as without feedback. Over
several steps, with buckets of 64 bytes (several buckets, padded ones among
them):

* the torch frontend's communicated gradients and the JAX transform's updates
  both equal the reference bitwise, step after step (so they equal each
  other), averaging and summing, and torch's in float64 too (codes from the
  float32 values, residual in float64); the torch state holds the
  reference's residual;
* checkpoints: torch's is covered by tests/torch/test_torch_state_dict.py; here the
  JAX optax state, pickled mid-training and restored into a fresh transform,
  continues bitwise as the uninterrupted run (and a fresh residual does not);
* error_feedback=False keeps the step stateless and its description as before.

Bad values (a non-bool error_feedback) are checked in this process.
"""

from __future__ import annotations

import pickle

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests

SESSIONS = {"w2": 2, "w3": 3}
BUCKET_BYTES = 64
SHAPES = [(6, 5), (7,), (3, 4), (11,)]  # 89 elements: not a multiple of 2 or 3
STEPS = 5
BEFORE, AFTER = 3, 3  # JAX checkpoint: steps before the save and after it


def case_names(session: str):
    return [
        "torch_matches_reference_avg",
        "torch_matches_reference_sum",
        "torch_matches_reference_float64",
        "jax_matches_reference_avg",
        "jax_matches_reference_sum",
        "jax_checkpoint_resumes_bitwise",
        "off_is_stateless",
    ]


class Worker(JaxWorker):
    def __init__(self):
        super().__init__()
        import bagua_jax

        bagua_jax.init_process_group()

    def grads(self, rank, step, dtype=np.float32):
        rng = np.random.default_rng([31, rank, step])
        # different scales per step, so that a chunk's quantisation step changes
        return [(rng.standard_normal(s) * (1 + step)).astype(dtype) for s in SHAPES]

    def layout(self, itemsize=4):
        """Buckets as (leaf indices, padded numel): BAGUA_BUCKET_SIZE bytes,
        leaves in reverse order, padded to the group size (both frontends)."""
        from tests.harness.reference.buckets import padded_buckets, payload

        out = padded_buckets(SHAPES, {4: np.float32, 8: np.float64}[itemsize], BUCKET_BYTES, self.world)
        assert len(out) > 2 and any(payload(b, SHAPES) != b[1] for b in out), out
        return out

    def reference(self, average, dtype=np.float32):
        """Per step, every leaf's result on this rank, and the final residuals
        (this rank's, one per bucket) of the whole scheme in numpy."""
        from tests.harness.reference.buckets import flatten, payload, unflatten
        from tests.harness.reference.compressed_exchange import scatter_reduce_gather

        layout = self.layout(np.dtype(dtype).itemsize)
        es = [[np.zeros(p, dtype) for _ in range(self.world)] for _, p in layout]
        results = []
        for step in range(STEPS):
            leaves = [None] * len(SHAPES)
            for k, bucket in enumerate(layout):
                xs = [flatten(self.grads(r, step, dtype), bucket) for r in range(self.world)]
                for e in es[k]:
                    e[payload(bucket, SHAPES) :] = 0  # the adapters zero the state's padding before each step
                out, es[k] = scatter_reduce_gather(xs, average, dtype, es[k])
                unflatten(out, bucket, SHAPES, leaves)
            results.append(leaves)
        return results, [e[self.rank] for e in es]

    def algorithm_args(self, average):
        return dict(hierarchical=False, average=average, error_feedback=True)

    # -- torch: the gradients after backward, step after step --
    def _torch_matches_reference(self, average, dtype=np.float32):
        tw = self.torch
        torch = tw.torch
        want, residuals = self.reference(average, dtype)
        tdtype = torch.from_numpy(np.zeros(1, dtype)).dtype
        params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s, dtype=tdtype)) for s in SHAPES])
        model = torch.nn.Module()
        model.params = params
        step_grads = {}
        model.forward = lambda: sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, step_grads["g"]))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        model = model.with_bagua([opt], tw.A.ByteGradAlgorithm(**self.algorithm_args(average)))
        assert len(model.bagua_buckets) == len(self.layout(np.dtype(dtype).itemsize))
        for step in range(STEPS):
            step_grads["g"] = self.grads(self.rank, step, dtype)
            opt.zero_grad()
            model().backward()
            for i, p in enumerate(params):
                np.testing.assert_array_equal(p.grad.numpy(), want[step][i], err_msg=f"step {step}, leaf {i}")
            opt.step()
        state = model.bagua_ddp.state_dict()["state"]["step_state"]
        for t, e, b in zip(state, residuals, model.bagua_buckets):
            assert tuple(t.shape) == (1, b.numel)
            payload = b.payload_numel
            np.testing.assert_array_equal(t[0, :payload].numpy(), e[:payload])
            assert np.abs(e[:payload]).max() > 0  # the residual is there to matter
        model.bagua_ddp.close()

    def torch_matches_reference_avg(self):
        self._torch_matches_reference(True)

    def torch_matches_reference_sum(self):
        self._torch_matches_reference(False)

    def torch_matches_reference_float64(self):
        self._torch_matches_reference(True, np.float64)

    # -- JAX: the transform's updates under jit --
    def _jax_matches_reference(self, average):
        import bagua_jax

        jax, jnp = self.jax, self.jnp
        want, _ = self.reference(average)
        tx = bagua_jax.transform(bagua_jax.ByteGradAlgorithm(**self.algorithm_args(average)))
        state = tx.init([jnp.zeros(s, jnp.float32) for s in SHAPES])
        assert len(state.step_state) == len(self.layout())
        assert all(float(jnp.abs(s).max()) == 0 for s in state.step_state)  # the residual starts at zero
        update = jax.jit(tx.update)
        for step in range(STEPS):
            out, state = update([jnp.asarray(g) for g in self.grads(self.rank, step)], state)
            for i, u in enumerate(out):
                np.testing.assert_array_equal(np.asarray(u), want[step][i], err_msg=f"step {step}, leaf {i}")

    def jax_matches_reference_avg(self):
        self._jax_matches_reference(True)

    def jax_matches_reference_sum(self):
        self._jax_matches_reference(False)

    def jax_checkpoint_resumes_bitwise(self):
        import bagua_jax

        jax, jnp, optax = self.jax, self.jnp, self.optax
        rng = np.random.default_rng(3)
        params0 = {"w": jnp.asarray(rng.standard_normal((5, 3)), jnp.float32), "b": jnp.zeros(3, jnp.float32)}

        def make():
            return optax.chain(
                bagua_jax.transform(bagua_jax.ByteGradAlgorithm(**self.algorithm_args(True))),
                optax.sgd(0.1, momentum=0.9),
            )

        def loss(p, x, y):
            return optax.softmax_cross_entropy_with_integer_labels(x @ p["w"] + p["b"], y).mean()

        def batch(step):
            g = np.random.default_rng([7, step, self.rank])
            x = g.standard_normal((16, 5)).astype(np.float32)
            return x, g.integers(0, 3, 16)

        def train(tx, p, s, steps):
            @jax.jit
            def step(p, s, x, y):
                u, s = tx.update(jax.grad(loss)(p, x, y), s, p)
                return optax.apply_updates(p, u), s

            for t in steps:
                p, s = step(p, s, *batch(t))
            # the steps communicate on the step thread: done before init's collective check
            return jax.block_until_ready((p, s))

        tx = make()
        p, s = train(tx, params0, tx.init(params0), range(BEFORE))
        saved = pickle.dumps(jax.tree_util.tree_map(np.asarray, (p, s)))
        expected, _ = train(tx, p, s, range(BEFORE, BEFORE + AFTER))

        tx2 = make()
        p2, s2 = jax.tree_util.tree_map(jnp.asarray, pickle.loads(saved))
        fresh = tx2.init(params0)
        assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(s2)
        residual = s2[0].step_state
        assert residual and max(float(jnp.abs(e).max()) for e in residual) > 0
        got, _ = train(tx2, p2, s2, range(BEFORE, BEFORE + AFTER))
        for k in expected:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(expected[k]), err_msg=k)
        # without the residual (a fresh one) the same steps end elsewhere
        s3 = (s2[0]._replace(step_state=fresh[0].step_state), *s2[1:])
        other, _ = train(tx2, p2, s3, range(BEFORE, BEFORE + AFTER))
        assert any(not np.array_equal(np.asarray(other[k]), np.asarray(expected[k])) for k in expected)

    def off_is_stateless(self):
        import bagua_jax
        import bagua_torch
        from bagua_core import algorithm_steps

        torch = self.torch.torch
        algo = bagua_jax.ByteGradAlgorithm(hierarchical=False)
        plan = algo.to_core().plan()
        assert plan.params_text() == "average=true;hierarchical=false", plan.params_text()
        info = algorithm_steps.check_plan(plan, bagua_jax.init_process_group())
        assert info.num_state == 0 and info.description == "bytegrad(hierarchical=false, average=true)", info
        group = bagua_jax.init_process_group()
        on_plan = bagua_jax.ByteGradAlgorithm(hierarchical=False, error_feedback=True).to_core().plan()
        on = algorithm_steps.check_plan(on_plan, group)
        assert on.num_state == 1 and "error_feedback=true" in on.description, on
        layout = algorithm_steps.state_layout(
            on_plan, algorithm_steps.communicators(group, False), "float32", [(6,)], 6
        )
        assert layout == (1, 6, layout.dtype, "zero", True) and layout.dtype.name == "float32", layout
        assert bagua_jax.transform(algo).init([self.jnp.zeros(5)]).step_state == ()
        model = torch.nn.Linear(3, 2)
        model.with_bagua(
            [torch.optim.SGD(model.parameters(), lr=0.1)], bagua_torch.algorithms.ByteGradAlgorithm(hierarchical=False)
        )
        assert all(op.num_state == 0 for op in model.bagua_algorithm.ops)
        assert "step_state" not in model.bagua_ddp.state_dict()["state"]
        model.bagua_ddp.close()


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, env={"BAGUA_BUCKET_SIZE": str(BUCKET_BYTES)}) for name, world in SESSIONS.items()},
    case_names,
    timeout=180,
    test_timeout=240,
    requires=("jax", "optax", "torch"),
)


def test_error_feedback_must_be_a_bool():
    """(Every frontend raises the description's errors: tests/core/test_algorithm_surfaces.py.)"""
    import pytest

    from bagua_core import algorithms as core

    for bad in (1, 0, "yes", None, np.bool_(True)):
        with pytest.raises(TypeError, match="ByteGrad: error_feedback must be a bool"):
            core.ByteGrad(error_feedback=bad)
    assert core.ByteGrad().error_feedback is False
    assert core.ByteGrad().plan().params == {"hierarchical": True, "average": True}  # as without the option
    assert (
        core.ByteGrad(error_feedback=True).plan().params_text() == "average=true;error_feedback=true;hierarchical=true"
    )


if __name__ == "__main__":
    worker_main(Worker, case_names)
