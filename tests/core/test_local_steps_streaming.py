"""Streaming local steps (``num_fragments``, ``overlap_steps``, ``mixing``)
across real processes, against a numpy simulation of every rank (inner SGD
with momentum at powers of two, so torch, optax and numpy agree bitwise; the
exchanges of tests/harness/reference/compressed_exchange.py), on 2 and 3
ranks, for torch and for JAX under jit:

* each bucket is cut into num_fragments equal slices; slice p starts an
  exchange at every step where (t + p * H // P) % H == 0 (t counted from 1
  after the warm-up), from a copy of its pseudo-gradient (plus its residual),
  and lands it overlap_steps later: outer Nesterov SGD on its anchor, then
  weights = mixing * local + (1 - mixing) * anchor; blocking (overlap 0) with
  and without mixing, uncompressed, 4-bit and top-k with error feedback;
* the overlap is real: while one rank holds back, another's launching step
  returns at once and only its landing step waits;
* bad settings are refused by the description and by the C++ step.
"""

from __future__ import annotations

import time

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests
from tests.harness.worker import expect_error

SESSIONS = {"w2": 2, "w3": 3}
BUCKET_BYTES = 64
SHAPES = [(6, 5), (7,), (3, 4), (11,)]
STEPS = 15
LR, MOMENTUM = 0.5, 0.5
F32 = np.float32
OUTER = dict(warmup_steps=1, outer_lr=0.7, outer_momentum=0.9, nesterov=True)
# name -> LocalSteps arguments besides OUTER
CONFIGS = {
    "overlap": dict(sync_interval=4, num_fragments=2, overlap_steps=1),
    "overlap_mixing_uint4": dict(
        sync_interval=6, num_fragments=3, overlap_steps=2, mixing=0.5, compression="minmax_uint4", error_feedback=True
    ),
    "blocking_mixing_topk": dict(
        sync_interval=4, num_fragments=2, mixing=0.25, compression="topk_uint2", error_feedback=True, topk_density=0.02
    ),
}


def case_names(session: str):
    return [f"{frontend}_matches_reference_{c}" for c in CONFIGS for frontend in ("torch", "jax")] + [
        "overlap_is_real",
        "settings",
    ]


def grads_of(rank, step):
    rng = np.random.default_rng([47, rank, step])
    return [(np.rint(rng.standard_normal(s) * 64) / 64).astype(F32) for s in SHAPES]


def initial_weights():
    rng = np.random.default_rng(49)
    return [(np.rint(rng.standard_normal(s) * 64) / 64).astype(F32) for s in SHAPES]


def reference(world, config):
    """Every rank's weights after every step, in float32."""
    from tests.harness.reference import lowbit
    from tests.harness.reference.buckets import flatten, padded_buckets, payload, unflatten
    from tests.harness.reference.compressed_exchange import allgather_reduce, scatter_reduce_gather

    H, P = config["sync_interval"], config.get("num_fragments", 1)
    tau, alpha = config.get("overlap_steps", 0), F32(config.get("mixing", 0.0))
    codec, ef = config.get("compression"), config.get("error_feedback", False)
    sparse = codec is not None and codec.startswith("topk")
    keep = lowbit.codec_k(config.get("topk_density", 0.02)) if sparse else 0
    align = (world if codec and not sparse else 1) * P
    layout = padded_buckets(SHAPES, F32, BUCKET_BYTES, align)
    lr, mu, warmup = F32(OUTER["outer_lr"]), F32(OUTER["outer_momentum"]), OUTER["warmup_steps"]

    def offset(p):
        return p * H // P

    def starts(p, t):
        return t >= 1 and (t + offset(p)) % H == 0

    def mean(xs):
        total = xs[0].copy()
        for x in xs[1:]:
            total = total + x
        return total / F32(len(xs))

    def exchange(xs, errors):
        if codec is None:
            return mean(xs), None
        fn = allgather_reduce if sparse else scatter_reduce_gather
        return fn(xs, True, F32, errors if ef else None, codec, keep)

    w = [initial_weights() for _ in range(world)]
    buf = [None] * world
    anchor = momentum = residual = None
    flights = {}
    out = []
    for s in range(STEPS):
        for r in range(world):
            g = grads_of(r, s)
            buf[r] = [x.copy() for x in g] if buf[r] is None else [F32(MOMENTUM) * b + x for b, x in zip(buf[r], g)]
            w[r] = [x - F32(LR) * b for x, b in zip(w[r], buf[r])]
        if s < warmup:
            avg = [mean([w[r][i] for r in range(world)]) for i in range(len(SHAPES))]
            w = [[x.copy() for x in avg] for _ in range(world)]
            anchor = [flatten(avg, b) for b in layout]
            momentum = [np.zeros_like(a) for a in anchor]
            residual = [[np.zeros_like(a) for _ in range(world)] for a in anchor]
            out.append([[x.copy() for x in wr] for wr in w])
            continue
        t = s - warmup + 1
        for k, bucket in enumerate(layout):
            flat = [flatten(w[r], bucket) for r in range(world)]
            per = bucket[1] // P
            n = payload(bucket, SHAPES)
            for e in [anchor[k], momentum[k], *residual[k]]:
                e[n:] = 0  # the adapters zero the state's padding before each run

            def land(p, d, es, fresh):
                sl = slice(p * per, (p + 1) * per)
                if es is not None:
                    for r in range(world):
                        residual[k][r][sl] = es[r]
                m = d if fresh else mu * momentum[k][sl] + d
                momentum[k][sl] = m
                anchor[k][sl] = anchor[k][sl] - lr * (d + mu * m)
                for r in range(world):
                    flat[r][sl] = (
                        anchor[k][sl].copy() if alpha == 0 else alpha * flat[r][sl] + (F32(1) - alpha) * anchor[k][sl]
                    )

            for p in range(P):
                if tau > 0 and starts(p, t - tau):
                    land(p, *flights.pop((k, p)))
            for p in range(P):
                if not starts(p, t):
                    continue
                sl = slice(p * per, (p + 1) * per)
                fresh = t + offset(p) == H
                errs = [np.zeros(per, F32) if fresh else residual[k][r][sl].copy() for r in range(world)]
                d, es = exchange([anchor[k][sl] - flat[r][sl] for r in range(world)], errs)
                if tau == 0:
                    land(p, d, es, fresh)
                else:
                    flights[(k, p)] = (d, es, fresh)
            for r in range(world):
                unflatten(flat[r], bucket, SHAPES, w[r])
        out.append([[x.copy() for x in wr] for wr in w])
    return out


class Worker(JaxWorker):
    def __init__(self):
        super().__init__()
        import bagua_jax

        self.group = bagua_jax.init_process_group()

    def torch_model(self, algorithm):
        return self.torch.fed_parameters(initial_weights(), algorithm, LR, MOMENTUM)

    def torch_matches(self, name):
        want = reference(self.world, CONFIGS[name])
        algorithm = self.torch.A.LocalStepsAlgorithm(**OUTER, **CONFIGS[name])
        fed = self.torch_model(algorithm)
        self.torch.train_fed(fed, lambda t: grads_of(self.rank, t), [w[self.rank] for w in want], STEPS)
        fed[0].bagua_ddp.close()

    def jax_matches(self, name):
        import bagua_jax

        jnp = self.jnp
        want = reference(self.world, CONFIGS[name])
        algorithm = bagua_jax.LocalStepsAlgorithm(**OUTER, **CONFIGS[name])
        tx = self.optax.chain(self.optax.sgd(LR, momentum=MOMENTUM), bagua_jax.transform(algorithm))
        state = tx.init([jnp.asarray(w) for w in initial_weights()])
        update = self.jax.jit(tx.update)
        for t in range(STEPS):
            prev = initial_weights() if t == 0 else want[t - 1][self.rank]
            u, state = update([jnp.asarray(g) for g in grads_of(self.rank, t)], state, [jnp.asarray(p) for p in prev])
            for i, (got, w, pv) in enumerate(zip(u, want[t][self.rank], prev)):
                np.testing.assert_array_equal(np.asarray(got), w - pv, err_msg=f"step {t}, leaf {i}")

    def overlap_is_real(self):
        """Rank 1 sleeps before the step that launches the first exchange:
        rank 0's launching step returns at once (blocking, it would wait the
        whole sleep) and its landing step waits for the rest of it."""
        pause = 3.0
        algorithm = self.torch.A.LocalStepsAlgorithm(
            sync_interval=4, overlap_steps=2, warmup_steps=0, outer_lr=1.0, outer_momentum=0.0, nesterov=False
        )
        model, params, opt, step_grads = self.torch_model(algorithm)
        took = []
        for t in range(7):  # launches at step 3, lands at step 5
            step_grads["g"] = grads_of(self.rank, t)
            opt.zero_grad()
            model().backward()
            if self.rank == 1 and t == 3:
                time.sleep(pause)
            start = time.monotonic()
            opt.step()
            took.append(time.monotonic() - start)
        if self.rank == 0:
            assert took[3] < pause / 3, took  # the launch did not wait for rank 1
            assert sum(took[3:6]) > pause / 3, took  # the landing did
        model.bagua_ddp.close()

    def settings(self):
        from bagua_core import algorithm_steps, algorithms as core
        from bagua_core.algorithms._base import Plan

        info = algorithm_steps.check_plan(core.LocalSteps(num_fragments=3, overlap_steps=2).plan(), self.group)
        assert info.alignment == 3 and info.description.endswith(", num_fragments=3, overlap_steps=2)"), info
        info = algorithm_steps.check_plan(
            core.LocalSteps(num_fragments=2, mixing=0.5, compression="fp4_e2m1").plan(), self.group
        )
        assert info.alignment == 2 * self.world and info.description.endswith(", num_fragments=2, mixing=0.5)"), info
        plain = core.LocalSteps().plan()
        assert not {"num_fragments", "overlap_steps", "mixing"} & set(plain.params)
        for params, fragment in (
            ({"num_fragments": 0}, "num_fragments must be in [1, sync_interval=8]"),
            ({"num_fragments": 9}, "num_fragments must be in [1, sync_interval=8]"),
            ({"overlap_steps": 8}, "overlap_steps must be in [0, sync_interval=8)"),
            ({"overlap_steps": -1}, "overlap_steps must be in [0, sync_interval=8)"),
            ({"mixing": "1.5"}, "mixing must be in [0, 1]"),
            ({"mixing": "nan"}, "mixing must be"),
        ):
            expect_error(
                ValueError,
                lambda: algorithm_steps.check_plan(Plan(step="local_steps", params=params), self.group),
                fragment,
            )


for _name in CONFIGS:
    setattr(Worker, f"torch_matches_reference_{_name}", lambda self, n=_name: self.torch_matches(n))
    setattr(Worker, f"jax_matches_reference_{_name}", lambda self, n=_name: self.jax_matches(n))


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, None, env={"BAGUA_BUCKET_SIZE": str(BUCKET_BYTES)}) for name, world in SESSIONS.items()},
    case_names,
    timeout=240,
    test_timeout=300,
    requires=("jax", "optax", "torch"),
)


def test_bad_settings_are_refused_at_construction():
    import pytest

    from bagua_core import algorithms as core

    for kwargs, fragment in (
        (dict(num_fragments=0), "num_fragments must be >= 1"),
        (dict(sync_interval=4, num_fragments=5), r"num_fragments must be in \[1, sync_interval=4\]"),
        (dict(sync_interval=4, overlap_steps=4), r"overlap_steps must be in \[0, sync_interval=4\)"),
        (dict(overlap_steps=-1), "overlap_steps must be >= 0"),
        (dict(overlap_steps=1, hierarchical=True), "overlap_steps > 0 is not supported with hierarchical=True"),
        (dict(mixing=-0.1), "mixing must be >= 0"),
        (dict(mixing=1.5), r"mixing must be in \[0, 1\]"),
    ):
        with pytest.raises(ValueError, match=fragment):
            core.LocalSteps(**kwargs)
    with pytest.raises(TypeError, match="LocalSteps: num_fragments must be an int"):
        core.LocalSteps(num_fragments=2.0)
    assert core.LocalSteps(sync_interval=4, num_fragments=4, overlap_steps=3, mixing=1).mixing == 1.0


if __name__ == "__main__":
    worker_main(Worker, case_names)
