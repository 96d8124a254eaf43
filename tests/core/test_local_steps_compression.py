"""LocalSteps with a compressed pseudo-gradient (``compression="minmax_uint8"``
with and without ``error_feedback``; the low-bit codecs minmax_uint4,
minmax_uint2, fp4_e2m1, topk_uint4 and topk_uint2 with it) across
real processes, against a numpy simulation of every rank: each rank's inner
SGD with momentum (lr and momentum 0.5: exact in float32, so torch, optax and
numpy agree bitwise), the uncompressed warm-up average, then at each
synchronisation per bucket (64 bytes: several, padded ones among them) the
pseudo-gradient plus this rank's residual, the codec's compressed
scatter-reduce-gather or (top-k) allgather
(tests/harness/reference/compressed_exchange.py, shared with the ByteGrad
tests) and the outer Nesterov SGD in float32, on 2 and 3 ranks,
and hierarchical on 4 ranks as 2 nodes (the node average exchanged among
the leaders, which keep the residual):

* torch's weights after every step and its checkpointed residual
  (``bagua.step_state.<i>``) equal the simulation bitwise;
* the JAX transform's updates equal it bitwise (so torch and JAX agree), the
  residual lives in the optax state, and a state pickled mid-training and
  restored into a fresh transform continues bitwise (with a zeroed residual
  it does not); torch's checkpoints: tests/torch/test_torch_state_dict.py;
* a state saved under 64-byte buckets goes on under one bucket, in torch
  (``bagua_ddp.load_state_dict``) and JAX (the first ``update``), as the
  simulation that moves each tensor's anchor, momentum and residual does;
  a state that is not these tensors' under any bucket size is refused;
* the compression matters (the result is not the float average), and so does
  the error feedback;
* a NaN in one rank's pseudo-gradient is an error on every rank at that
  synchronisation, naming the rank that held it, and that bucket's weights
  are the last synchronisation's (the failure breaks the engine: the other
  buckets of the step synchronised or not, as their lanes met it); a rank
  that dies at a synchronisation is an error on every other rank, whose
  buckets are each at the last synchronisation or at their inner step;
* the step's alignment, state spans and description follow the settings
  (plain LocalSteps unchanged); bad settings are refused by the description
  and by the C++ step (every frontend raises the description's errors:
  tests/core/test_algorithm_surfaces.py).
"""

from __future__ import annotations

import os
import pickle

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests
from tests.harness.worker import exit_as_dead_peer, expect_error, expect_failure_within

SESSIONS = {"w2": (2, None), "w3": (3, None), "w4n2": (4, 2)}
BUCKET_BYTES = 64
ONE_BUCKET_BYTES = 1 << 20  # a restored state's new layout: every tensor in one bucket
SHAPES = [(6, 5), (7,), (3, 4), (11,)]  # 89 elements: not a multiple of 2 or 3
STEPS = 11
# inner SGD: lr and momentum powers of two, so torch's fused a + alpha * b rounds as numpy does
LR, MOMENTUM = 0.5, 0.5
# one warm-up step: its average sums values exactly representable in float32, in any order
OUTER = dict(sync_interval=3, warmup_steps=1, outer_lr=0.7, outer_momentum=0.9, nesterov=True)
F32 = np.float32
LOW_BIT = ("minmax_uint4", "minmax_uint2", "fp4_e2m1", "topk_uint4", "topk_uint2")
TOPK_DENSITY = 0.02  # 6 of 256: fewer than a 64-byte bucket holds, so the selection matters


def case_names(session: str):
    return [
        "torch_matches_reference",
        "torch_matches_reference_without_error_feedback",
        "jax_matches_reference",
        "jax_matches_reference_without_error_feedback",
        "jax_checkpoint_resumes_bitwise",
        "torch_state_moves_to_another_bucket_size",
        "jax_state_moves_to_another_bucket_size",
        "compression_and_error_feedback_matter",
        "settings_and_state",
        "nan_is_refused_on_every_rank",
        *(f"{frontend}_matches_reference_{codec}" for codec in LOW_BIT for frontend in ("torch", "jax")),
        "dead_peer_at_synchronisation",  # last: a rank exits
    ]


def codec_args(codec):
    return dict(compression=codec, **({"topk_density": TOPK_DENSITY} if codec.startswith("topk") else {}))


def grads_of(rank, step):
    """Rank ``rank``'s gradients at ``step``: multiples of 1/64, so sums of
    the first step's weights are exact (the warm-up average's order does not
    matter)."""
    rng = np.random.default_rng([41, rank, step])
    return [(np.rint(rng.standard_normal(s) * 64) / 64).astype(F32) for s in SHAPES]


def initial_weights():
    """Equal on every rank and not zero (the residual span starts as a copy
    of them, which the first synchronisation must not read); multiples of
    1/64 as the gradients."""
    rng = np.random.default_rng(43)
    return [(np.rint(rng.standard_normal(s) * 64) / 64).astype(F32) for s in SHAPES]


def reference(world, local, error_feedback, compressed=True, codec="minmax_uint8", rebucket=None):
    """The whole scheme on every rank in float32: (each step's weights of
    every rank, each bucket's final residual of every rank, the layout).
    ``rebucket=(step, bytes)``: from that step on the buckets are of
    ``bytes``, each tensor's momentum and residual moved to its new place."""
    from tests.harness.reference import lowbit
    from tests.harness.reference.buckets import flatten, padded_buckets, payload, unflatten
    from tests.harness.reference.compressed_exchange import allgather_reduce, scatter_reduce_gather

    sparse = codec.startswith("topk")
    exchange = allgather_reduce if sparse else scatter_reduce_gather
    keep = lowbit.codec_k(TOPK_DENSITY) if sparse else 0
    layout = padded_buckets(SHAPES, F32, BUCKET_BYTES, 1 if sparse else world)
    H, warmup = OUTER["sync_interval"], OUTER["warmup_steps"]
    lr, mu = F32(OUTER["outer_lr"]), F32(OUTER["outer_momentum"])
    per_node = local or 1
    groups = world // per_node  # who takes part in the exchange: node leaders, or every rank
    w = [initial_weights() for _ in range(world)]
    buf = [None] * world
    anchor = initial_weights()
    momentum = [np.zeros(p, F32) for _, p in layout]
    residual = [[np.zeros(p, F32) for _ in range(groups)] for _, p in layout]  # zero at the first synchronisation

    def group_mean(xs):  # the node's (hierarchical) or the group's average, summed in rank order
        total = xs[0].copy()
        for x in xs[1:]:
            total = total + x
        return total / F32(len(xs))

    def moved(vectors, old, new):  # per-bucket vectors of the layout old, laid out as new
        leaves = [None] * len(SHAPES)
        for v, bucket in zip(vectors, old):
            unflatten(v, bucket, SHAPES, leaves)
        return [flatten(leaves, bucket) for bucket in new]

    out = []
    for t in range(STEPS):
        if rebucket and t == rebucket[0]:
            new = padded_buckets(SHAPES, F32, rebucket[1], 1 if sparse else world)
            momentum = moved(momentum, layout, new)
            by_group = [moved([residual[k][n] for k in range(len(layout))], layout, new) for n in range(groups)]
            residual = [[by_group[n][k] for n in range(groups)] for k in range(len(new))]
            layout = new
        for r in range(world):
            g = grads_of(r, t)
            buf[r] = [x.copy() for x in g] if buf[r] is None else [F32(MOMENTUM) * b + x for b, x in zip(buf[r], g)]
            w[r] = [x - F32(LR) * b for x, b in zip(w[r], buf[r])]
        if t < warmup:  # uncompressed
            node_means = [
                [group_mean([w[n * per_node + i][k] for i in range(per_node)]) for k in range(len(SHAPES))]
                for n in range(groups)
            ]
            mean = [group_mean([m[k] for m in node_means]) for k in range(len(SHAPES))]
            anchor = [x.copy() for x in mean]
            w = [[x.copy() for x in mean] for _ in range(world)]
        elif (t - warmup + 1) % H == 0:
            fresh = t - warmup + 1 == H
            for k, bucket in enumerate(layout):
                a = flatten(anchor, bucket)
                xs = [a - flatten(w[r], bucket) for r in range(world)]
                xs = [group_mean(xs[n * per_node : (n + 1) * per_node]) for n in range(groups)]  # node averages
                if compressed:
                    for e in residual[k]:
                        e[payload(bucket, SHAPES) :] = 0  # the adapters zero the state's padding before each run
                    d, es = exchange(xs, True, F32, residual[k] if error_feedback else None, codec, keep)
                    if error_feedback:
                        residual[k] = es
                else:
                    d = group_mean(xs)
                m = d if fresh else mu * momentum[k] + d
                momentum[k] = m
                a = a - lr * (d + mu * m)
                unflatten(a, bucket, SHAPES, anchor)
            w = [[x.copy() for x in anchor] for _ in range(world)]
        out.append([[x.copy() for x in wr] for wr in w])
    return out, residual, layout


def inner_weights(rank, after_warmup, last):
    """Rank ``rank``'s weights after its inner steps up to ``last`` (before
    the first synchronisation), from the warm-up average ``after_warmup``."""
    buf, w = None, [x.copy() for x in after_warmup]
    for t in range(last + 1):
        g = grads_of(rank, t)
        buf = [x.copy() for x in g] if buf is None else [F32(MOMENTUM) * b + x for b, x in zip(buf, g)]
        if t >= OUTER["warmup_steps"]:
            w = [x - F32(LR) * b for x, b in zip(w, buf)]
    return w


class Worker(JaxWorker):
    def __init__(self):
        super().__init__()
        import bagua_jax

        self.group = bagua_jax.init_process_group()

    @property
    def local(self):
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        return local if local < self.world else None

    def algorithm_args(self, error_feedback=True, codec="minmax_uint8"):
        return dict(OUTER, hierarchical=self.local is not None, error_feedback=error_feedback, **codec_args(codec))

    def my_residual(self, residual, k):
        """This rank's residual of bucket k in the simulation: the node
        leader's when hierarchical (other ranks keep zeros)."""
        if self.local is None:
            return residual[k][self.rank]
        return residual[k][self.rank // self.local] if self.rank % self.local == 0 else np.zeros_like(residual[k][0])

    # -- torch --
    def torch_model(self, algorithm):
        return self.torch.fed_parameters(initial_weights(), algorithm, LR, MOMENTUM)

    def _torch_matches_reference(self, error_feedback, codec="minmax_uint8"):
        from tests.harness.reference.buckets import payload

        want, residual, layout = reference(self.world, self.local, error_feedback, codec=codec)
        algorithm = self.torch.A.LocalStepsAlgorithm(**self.algorithm_args(error_feedback, codec))
        fed = self.torch_model(algorithm)
        model = fed[0]
        buckets = model.bagua_buckets
        assert [b.numel for b in buckets] == [p for _, p in layout]
        if not codec.startswith("topk"):  # the allgather of top-k needs no padding
            assert any(b.numel != b.payload_numel for b in buckets), "expected a padded bucket"
        self.torch.train_fed(fed, lambda t: grads_of(self.rank, t), [w[self.rank] for w in want], STEPS)
        state = model.bagua_ddp.state_dict()["state"]["step_state"]
        spans = 3 if error_feedback else 2
        for k, (s, bucket) in enumerate(zip(state, layout)):
            assert s.numel() == spans * bucket[1], (tuple(s.shape), bucket)
            if error_feedback:
                n = payload(bucket, SHAPES)
                np.testing.assert_array_equal(s.reshape(spans, -1)[2, :n].numpy(), self.my_residual(residual, k)[:n])
        model.bagua_ddp.close()

    def torch_matches_reference(self):
        self._torch_matches_reference(True)

    def torch_matches_reference_without_error_feedback(self):
        self._torch_matches_reference(False)

    # -- JAX: updates under jit, compared as the simulation's weight differences --
    def jax_transform(self, error_feedback=True, codec="minmax_uint8"):
        import bagua_jax

        algorithm = bagua_jax.LocalStepsAlgorithm(**self.algorithm_args(error_feedback, codec))
        return self.optax.chain(self.optax.sgd(LR, momentum=MOMENTUM), bagua_jax.transform(algorithm))

    def jax_run(self, tx, state, want, steps):
        """Runs ``steps`` from ``state`` with the simulation's weights as
        params, checking each update against it; returns the state."""
        jnp = self.jnp
        update = self.jax.jit(tx.update)
        for t in steps:
            prev = initial_weights() if t == 0 else want[t - 1][self.rank]
            u, state = update([jnp.asarray(g) for g in grads_of(self.rank, t)], state, [jnp.asarray(p) for p in prev])
            for i, (got, w, pv) in enumerate(zip(u, want[t][self.rank], prev)):
                np.testing.assert_array_equal(np.asarray(got), w - pv, err_msg=f"step {t}, leaf {i}")
        return state

    def _jax_matches_reference(self, error_feedback, codec="minmax_uint8"):
        from tests.harness.reference.buckets import payload

        want, residual, layout = reference(self.world, self.local, error_feedback, codec=codec)
        tx = self.jax_transform(error_feedback, codec)
        state = tx.init([self.jnp.asarray(w) for w in initial_weights()])
        spans = 3 if error_feedback else 2
        assert [s.shape for s in state[1].step_state] == [(spans * p,) for _, p in layout]
        state = self.jax_run(tx, state, want, range(STEPS))
        if error_feedback:
            for k, (s, bucket) in enumerate(zip(state[1].step_state, layout)):
                n, p = payload(bucket, SHAPES), bucket[1]
                np.testing.assert_array_equal(np.asarray(s)[2 * p : 2 * p + n], self.my_residual(residual, k)[:n])

    def jax_matches_reference(self):
        self._jax_matches_reference(True)

    def jax_matches_reference_without_error_feedback(self):
        self._jax_matches_reference(False)

    def jax_checkpoint_resumes_bitwise(self):
        """Saved after the first synchronisation (a residual is there),
        restored into a fresh transform: the next synchronisations match the
        simulation; the same state with a zeroed residual does not."""
        jax, jnp = self.jax, self.jnp
        want, _, layout = reference(self.world, self.local, True)
        saved_after = OUTER["warmup_steps"] + OUTER["sync_interval"] + 1  # steps run before the save
        tx = self.jax_transform()
        state = self.jax_run(tx, tx.init([jnp.asarray(w) for w in initial_weights()]), want, range(saved_after))
        saved = pickle.dumps(jax.device_get(state))

        tx2 = self.jax_transform()
        fresh = tx2.init([jnp.asarray(w) for w in initial_weights()])
        restored = jax.tree_util.tree_map(jnp.asarray, pickle.loads(saved))
        assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(restored)
        residuals = [np.asarray(s)[2 * p :] for s, (_, p) in zip(restored[1].step_state, layout)]
        leader = self.local is None or self.rank % self.local == 0
        assert any(np.abs(e).max() > 0 for e in residuals) == leader
        self.jax_run(tx2, restored, want, range(saved_after, STEPS))

        zeroed = [
            jnp.asarray(np.concatenate([np.asarray(s)[: 2 * p], np.zeros(p, F32)]))
            for s, (_, p) in zip(restored[1].step_state, layout)
        ]
        without = (restored[0], restored[1]._replace(step_state=tuple(zeroed)))
        update = jax.jit(tx2.update)
        next_sync = OUTER["warmup_steps"] + 2 * OUTER["sync_interval"] - 1
        for t in range(saved_after, next_sync + 1):
            prev = want[t - 1][self.rank]
            u, without = update(
                [jnp.asarray(g) for g in grads_of(self.rank, t)], without, [jnp.asarray(p) for p in prev]
            )
        # every rank's weights move: the leaders' residuals reach everyone through the exchange
        assert any(
            not np.array_equal(np.asarray(a), w - p)
            for a, w, p in zip(u, want[next_sync][self.rank], want[next_sync - 1][self.rank])
        )

    def torch_state_moves_to_another_bucket_size(self):
        """The same through torch (``bagua_ddp.state_dict()``): saved with
        64-byte buckets, loaded into a model wrapped with one bucket."""
        saved_after = OUTER["warmup_steps"] + OUTER["sync_interval"] + 1
        want, _, _ = reference(self.world, self.local, True, rebucket=(saved_after, ONE_BUCKET_BYTES))
        mine = [w[self.rank] for w in want]
        fed = self.torch_model(self.torch.A.LocalStepsAlgorithm(**self.algorithm_args(True)))
        self.torch.train_fed(fed, lambda t: grads_of(self.rank, t), mine, saved_after)
        model, _, opt, _ = fed
        saved = pickle.loads(pickle.dumps((model.state_dict(), opt.state_dict(), model.bagua_ddp.state_dict())))
        model.bagua_ddp.close()
        os.environ["BAGUA_BUCKET_SIZE"] = str(ONE_BUCKET_BYTES)
        try:
            fed = self.torch_model(self.torch.A.LocalStepsAlgorithm(**self.algorithm_args(True)))
        finally:
            os.environ["BAGUA_BUCKET_SIZE"] = str(BUCKET_BYTES)
        model, _, opt, _ = fed
        assert len(model.bagua_buckets) == 1 < len(saved[2]["state"]["step_state"])
        model.load_state_dict(saved[0])
        opt.load_state_dict(saved[1])
        other = {"algorithm": saved[2]["algorithm"], "state": {"step_state": [self.torch.torch.zeros(3, 8)] * 2}}
        expect_error(ValueError, lambda: model.bagua_ddp.load_state_dict(other), "not their state under another bucket")
        model.bagua_ddp.load_state_dict(saved[2])
        self.torch.train_fed(fed, lambda t: grads_of(self.rank, t), mine, STEPS, start=saved_after)
        fed[0].bagua_ddp.close()

    def jax_state_moves_to_another_bucket_size(self):
        """Saved under 64-byte buckets after the first synchronisation,
        restored into a transform of one bucket: each tensor's anchor,
        momentum and residual move to their new buckets and training goes on
        as the simulation that moves them does."""
        jax, jnp = self.jax, self.jnp
        saved_after = OUTER["warmup_steps"] + OUTER["sync_interval"] + 1
        want, _, layout = reference(self.world, self.local, True, rebucket=(saved_after, ONE_BUCKET_BYTES))
        tx = self.jax_transform()
        state = self.jax_run(tx, tx.init([jnp.asarray(w) for w in initial_weights()]), want, range(saved_after))
        saved = pickle.loads(pickle.dumps(jax.device_get(state)))
        os.environ["BAGUA_BUCKET_SIZE"] = str(ONE_BUCKET_BYTES)
        try:
            tx2 = self.jax_transform()
            fresh = tx2.init([jnp.asarray(w) for w in initial_weights()])
        finally:
            os.environ["BAGUA_BUCKET_SIZE"] = str(BUCKET_BYTES)
        assert len(fresh[1].step_state) == 1 < len(saved[1].step_state)
        other = (saved[0], saved[1]._replace(step_state=(jnp.zeros(3 * 8), jnp.zeros(3 * 8))))
        params = [jnp.asarray(p) for p in want[saved_after - 1][self.rank]]
        expect_error(ValueError, lambda: tx2.update(params, other, params), "not theirs under another bucket size")
        state = self.jax_run(tx2, jax.tree_util.tree_map(jnp.asarray, saved), want, range(saved_after, STEPS))
        assert [s.shape for s in state[1].step_state] == [s.shape for s in fresh[1].step_state]

    def nan_is_refused_on_every_rank(self):
        """Rank 1's gradient is NaN in the last step before the first
        synchronisation: every rank raises there, rank 1 naming its own."""
        import bagua_core

        algorithm = self.torch.A.LocalStepsAlgorithm(**self.algorithm_args(True, "topk_uint2"))
        model, params, opt, step_grads = self.torch_model(algorithm)
        sync = OUTER["warmup_steps"] + OUTER["sync_interval"] - 1
        for t in range(sync + 1):
            g = grads_of(self.rank, t)
            if t == sync and self.rank == 1:
                g[0] = g[0].copy()
                g[0][0, 0] = np.nan
            step_grads["g"] = g
            opt.zero_grad()
            model().backward()
            if t < sync:
                opt.step()
                continue
            whose = "this rank's own holds 1 of its" if self.rank == 1 else "came from another rank"
            expect_error(
                bagua_core.BaguaError, opt.step, f"NaN or Inf in the pseudo-gradient on rank {self.rank}", whose
            )
        # the NaN's bucket is back at the last synchronisation (the warm-up average), on every
        # rank. The failure breaks the engine: each other bucket synchronised as usual, still
        # holds this rank's inner step (its lane met the failure first), or is back at the last
        # synchronisation too (the failure broke its exchange midway).
        want, _, layout = reference(self.world, self.local, True, codec="topk_uint2")
        inner = inner_weights(self.rank, want[OUTER["warmup_steps"] - 1][self.rank], sync)
        before = inner_weights(self.rank, want[OUTER["warmup_steps"] - 1][self.rank], sync - 1)
        assert all(np.array_equal(a, b) for a, b in zip(before, want[sync - 1][self.rank]))  # as the simulation's
        for leaves, _ in layout:
            got = [params[i].detach().numpy() for i in leaves]
            outcomes = {"restored": [want[OUTER["warmup_steps"] - 1][0][i] for i in leaves]}
            if 0 not in leaves:
                outcomes["synchronised"] = [want[sync][0][i] for i in leaves]
                outcomes["skipped"] = [inner[i] for i in leaves]
            assert any(all(np.array_equal(a, b) for a, b in zip(got, w)) for w in outcomes.values()), (
                f"leaves {leaves} are none of {sorted(outcomes)}"
            )
        model.bagua_ddp.close()

    def dead_peer_at_synchronisation(self):
        """The last rank exits before the first synchronisation: every other
        rank raises there, and no bucket is left holding a part-averaged
        pseudo-gradient: each is back at the last synchronisation (its
        exchange had started) or still holds this rank's inner step."""
        algorithm = self.torch.A.LocalStepsAlgorithm(**self.algorithm_args(True))
        model, params, opt, step_grads = self.torch_model(algorithm)
        sync = OUTER["warmup_steps"] + OUTER["sync_interval"] - 1
        for t in range(sync):
            step_grads["g"] = grads_of(self.rank, t)
            opt.zero_grad()
            model().backward()
            opt.step()
        step_grads["g"] = grads_of(self.rank, sync)
        opt.zero_grad()
        model().backward()
        exit_as_dead_peer("dead_peer_at_synchronisation", self.rank, self.world)
        expect_failure_within(60, opt.step, "local_steps")
        want, _, layout = reference(self.world, self.local, True)
        last_sync = want[OUTER["warmup_steps"] - 1][0]
        inner = inner_weights(self.rank, last_sync, sync)
        seen = set()
        for leaves, _ in layout:
            got = [params[i].detach().numpy() for i in leaves]
            outcomes = {"restored": [last_sync[i] for i in leaves], "kept": [inner[i] for i in leaves]}
            matched = [k for k, w in outcomes.items() if all(np.array_equal(a, b) for a, b in zip(got, w))]
            assert matched, f"leaves {leaves} are none of {sorted(outcomes)}"
            seen.update(matched)
        assert "restored" in seen, "no bucket's exchange started"

    def compression_and_error_feedback_matter(self):
        with_ef, residual, _ = reference(self.world, self.local, True)
        without_ef, _, _ = reference(self.world, self.local, False)
        plain, _, _ = reference(self.world, self.local, False, compressed=False)
        last = STEPS - 1
        for other in (without_ef, plain):
            assert any(not np.array_equal(a, b) for a, b in zip(with_ef[last][0], other[last][0]))
        # compressed, the weights stay close to the float average's
        for a, b in zip(with_ef[last][0], plain[last][0]):
            np.testing.assert_allclose(a, b, atol=0.05)
        assert max(np.abs(e).max() for es in residual for e in es) > 0
        # the warm-up average is the float one (the compressed exchange would round it)
        assert all(np.array_equal(a, b) for a, b in zip(with_ef[0][0], plain[0][0]))

    def settings_and_state(self):
        from bagua_core import algorithm_steps, algorithms as core
        from bagua_core.algorithms._base import Plan

        hier = self.local is not None
        plain = core.LocalSteps(hierarchical=hier).plan()
        assert "compression" not in plain.params and "error_feedback" not in plain.params
        info = algorithm_steps.check_plan(plain, self.group)
        assert info.alignment == 1 and info.num_state == 2, info
        assert "compression" not in info.description and "error_feedback" not in info.description, info
        squeezed = algorithm_steps.check_plan(
            core.LocalSteps(hierarchical=hier, compression="minmax_uint8").plan(), self.group
        )
        assert squeezed.alignment == self.world and squeezed.num_state == 2, squeezed
        assert squeezed.description.endswith(", compression=minmax_uint8)"), squeezed
        ef_plan = core.LocalSteps(hierarchical=hier, compression="minmax_uint8", error_feedback=True).plan()
        ef = algorithm_steps.check_plan(ef_plan, self.group)
        assert ef.alignment == self.world and ef.num_state == 3, ef
        assert ef.description.endswith(", compression=minmax_uint8, error_feedback=true)"), ef
        n = 2 * self.world
        layout = algorithm_steps.state_layout(
            ef_plan, algorithm_steps.communicators(self.group, hier), "float32", [(n,)], n
        )
        assert layout[:2] == (3, n) and layout.init == "copy_of_data" and layout.data_shaped, layout
        # the C++ step refuses what the description refuses, for callers that bypass it
        for params, fragment in (
            ({"compression": "zstd"}, "unknown compression 'zstd'"),
            ({"compression": 8}, "compression must be a string"),
            ({"error_feedback": True}, "error_feedback needs a compression"),
            ({"compression": "minmax_uint3"}, "unknown compression 'minmax_uint3'"),
            ({"compression": "topk_uint2", "topk_density": "0"}, "topk_density must be in (0, 1]"),
            ({"compression": "minmax_uint4", "topk_density": "0.1"}, "topk_density is for the top-k"),
            ({"compression": "minmax_uint8", "error_feedback": "yes"}, "error_feedback must be a bool"),
        ):
            expect_error(
                ValueError,
                lambda: algorithm_steps.check_plan(Plan(step="local_steps", params=params), self.group),
                fragment,
            )


for _codec in LOW_BIT:
    setattr(Worker, f"torch_matches_reference_{_codec}", lambda self, c=_codec: self._torch_matches_reference(True, c))
    setattr(Worker, f"jax_matches_reference_{_codec}", lambda self, c=_codec: self._jax_matches_reference(True, c))


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {
        name: Session(world, local, env={"BAGUA_BUCKET_SIZE": str(BUCKET_BYTES)})
        for name, (world, local) in SESSIONS.items()
    },
    case_names,
    timeout=240,
    test_timeout=300,
    requires=("jax", "optax", "torch"),
)


def test_bad_settings_are_refused_at_construction():
    import pytest

    from bagua_core import algorithms as core

    with pytest.raises(ValueError, match=r"LocalSteps: unknown compression 'zstd' \(use one of none, minmax_uint8, "):
        core.LocalSteps(compression="zstd")
    for bad in (None, 8, b"minmax_uint8"):
        with pytest.raises(TypeError, match="LocalSteps: compression must be a str"):
            core.LocalSteps(compression=bad)
    for bad in (1, 0, "yes", None, np.bool_(True)):
        with pytest.raises(TypeError, match="LocalSteps: error_feedback must be a bool"):
            core.LocalSteps(compression="minmax_uint8", error_feedback=bad)
    with pytest.raises(ValueError, match="LocalSteps: error_feedback needs a compression"):
        core.LocalSteps(error_feedback=True)
    for bad in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="LocalSteps: topk_density must be"):
            core.LocalSteps(compression="topk_uint4", topk_density=bad)
    with pytest.raises(TypeError, match="LocalSteps: topk_density must be a number"):
        core.LocalSteps(compression="topk_uint4", topk_density="0.1")
    with pytest.raises(ValueError, match="LocalSteps: topk_density is for the top-k compressions, not 'fp4_e2m1'"):
        core.LocalSteps(compression="fp4_e2m1", topk_density=0.1)
    assert core.LocalSteps(compression="topk_uint2", topk_density=1).plan().params["topk_density"] == "1.0"
    assert core.LocalSteps().compression == "none" and core.LocalSteps().error_feedback is False
    params = core.LocalSteps(compression="minmax_uint8", error_feedback=True).plan().params
    assert params["compression"] == "minmax_uint8" and params["error_feedback"] is True


if __name__ == "__main__":
    worker_main(Worker, case_names)
