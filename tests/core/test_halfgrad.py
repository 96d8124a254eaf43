"""HalfGrad across real processes (2 and 3), against a numpy reference of the
whole exchange with every rank simulated (tests/harness/reference/half_wire.py):
each rank rounds its padded bucket to 16 bits, chunk r is summed in float32
by rank r and rounded again, every rank decodes every chunk. With buckets of
64 bytes (several buckets, padded ones among them), step after step:

* the torch frontend's communicated gradients equal the reference bitwise,
  averaging and summing, float16 and bfloat16 wires, float32 and float64
  gradients; they also stay within 16-bit rounding of the exact mean;
* the JAX transform's updates under jit equal the same reference bitwise
  (so torch and JAX agree);
* the step is stateless, and its bytes on the wire are half GradientAllReduce's
  float32 payload.

Bad values (an unknown wire) are checked in this process.
"""

from __future__ import annotations

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests

SESSIONS = {"w2": 2, "w3": 3}
BUCKET_BYTES = 64
SHAPES = [(6, 5), (7,), (3, 4), (11,)]  # 89 elements: not a multiple of 2 or 3
STEPS = 3


def case_names(session: str):
    return [
        "torch_matches_reference_avg",
        "torch_matches_reference_sum",
        "torch_matches_reference_bfloat16",
        "torch_matches_reference_float64",
        "jax_matches_reference_avg",
        "jax_matches_reference_bfloat16_sum",
        "is_stateless",
    ]


class Worker(JaxWorker):
    def __init__(self):
        super().__init__()
        import bagua_jax

        bagua_jax.init_process_group()

    def grads(self, rank, step, dtype=np.float32):
        rng = np.random.default_rng([37, rank, step])
        return [(rng.standard_normal(s) * (1 + step)).astype(dtype) for s in SHAPES]

    def reference(self, average, wire, dtype=np.float32):
        """Per step, every leaf's result (equal on every rank)."""
        from tests.harness.reference import half_wire
        from tests.harness.reference.buckets import flatten, padded_buckets, unflatten

        layout = padded_buckets(SHAPES, dtype, BUCKET_BYTES, self.world)
        assert len(layout) > 2 and any(sum(int(np.prod(SHAPES[i])) for i in b[0]) != b[1] for b in layout)
        results = []
        for step in range(STEPS):
            leaves = [None] * len(SHAPES)
            for bucket in layout:
                xs = [flatten(self.grads(r, step, dtype), bucket) for r in range(self.world)]
                unflatten(half_wire.scatter_reduce_gather(xs, average, wire, dtype), bucket, SHAPES, leaves)
            results.append(leaves)
        return results

    def _torch_matches_reference(self, average, wire="float16", dtype=np.float32):
        tw = self.torch
        torch = tw.torch
        want = self.reference(average, wire, dtype)
        tdtype = torch.from_numpy(np.zeros(1, dtype)).dtype
        params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s, dtype=tdtype)) for s in SHAPES])
        model = torch.nn.Module()
        model.params = params
        step_grads = {}
        model.forward = lambda: sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, step_grads["g"]))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        model = model.with_bagua([opt], tw.A.HalfGradAlgorithm(average=average, wire=wire))
        for step in range(STEPS):
            step_grads["g"] = self.grads(self.rank, step, dtype)
            opt.zero_grad()
            model().backward()
            exact = [sum(self.grads(r, step, np.float64)[i] for r in range(self.world)) for i in range(len(SHAPES))]
            for i, p in enumerate(params):
                got = p.grad.numpy()
                np.testing.assert_array_equal(got, want[step][i], err_msg=f"step {step}, leaf {i}")
                # two 16-bit roundings of values of magnitude < 8 * world: a few ulps of 16 bits
                ref = exact[i] / self.world if average else exact[i]
                tol = (2**-7 if wire == "bfloat16" else 2**-10) * 4 * (1 + step) * self.world
                np.testing.assert_allclose(got, ref, atol=tol, rtol=0, err_msg=f"step {step}, leaf {i}")
            opt.step()
        model.bagua_ddp.close()

    def torch_matches_reference_avg(self):
        self._torch_matches_reference(True)

    def torch_matches_reference_sum(self):
        self._torch_matches_reference(False)

    def torch_matches_reference_bfloat16(self):
        self._torch_matches_reference(True, "bfloat16")

    def torch_matches_reference_float64(self):
        self._torch_matches_reference(True, dtype=np.float64)

    def _jax_matches_reference(self, average, wire):
        import bagua_jax

        jax, jnp = self.jax, self.jnp
        want = self.reference(average, wire)
        tx = bagua_jax.transform(bagua_jax.HalfGradAlgorithm(average=average, wire=wire))
        state = tx.init([jnp.zeros(s, jnp.float32) for s in SHAPES])
        assert state.step_state == ()
        update = jax.jit(tx.update)
        for step in range(STEPS):
            out, state = update([jnp.asarray(g) for g in self.grads(self.rank, step)], state)
            for i, u in enumerate(out):
                np.testing.assert_array_equal(np.asarray(u), want[step][i], err_msg=f"step {step}, leaf {i}")

    def jax_matches_reference_avg(self):
        self._jax_matches_reference(True, "float16")

    def jax_matches_reference_bfloat16_sum(self):
        self._jax_matches_reference(False, "bfloat16")

    def is_stateless(self):
        import bagua_jax
        from bagua_core import algorithm_steps

        group = bagua_jax.init_process_group()
        plan = bagua_jax.HalfGradAlgorithm(wire="bfloat16").to_core().plan()
        assert plan.params_text() == "average=true;hierarchical=false;wire=bfloat16", plan.params_text()
        info = algorithm_steps.check_plan(plan, group)
        want = "halfgrad(hierarchical=false, average=true, wire=bfloat16)"
        assert info.num_state == 0 and info.description == want, info


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, env={"BAGUA_BUCKET_SIZE": str(BUCKET_BYTES)}) for name, world in SESSIONS.items()},
    case_names,
    timeout=180,
    test_timeout=240,
    requires=("jax", "optax", "torch"),
)


def test_wire_must_be_a_16_bit_float():
    """(Every frontend raises the description's errors: tests/core/test_algorithm_surfaces.py.)"""
    import pytest

    from bagua_core import algorithms as core

    with pytest.raises(ValueError, match="HalfGrad: unknown wire 'int8' \\(use one of float16, bfloat16\\)"):
        core.HalfGrad(wire="int8")
    with pytest.raises(TypeError, match="HalfGrad: wire must be a str"):
        core.HalfGrad(wire=16)
    assert core.HalfGrad().plan().params == {"hierarchical": False, "average": True, "wire": "float16"}


if __name__ == "__main__":
    worker_main(Worker, case_names)
