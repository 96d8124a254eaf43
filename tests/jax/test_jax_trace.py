"""BAGUA_TRACE for bagua_jax.transform, across real processes (3 ranks, Gloo):

* off (BAGUA_TRACE unset): the engine records no step timings and no file is
  written;
* on: every rank writes its own Chrome trace (the torch format,
  bagua_core/trace.py) with, for each jitted training step and each bucket of
  the transform, one comm-thread slice whose ready <= launch <= start <= end,
  under the transform's name, on that rank's row; two transforms in one
  program get their own rows; the ranks' files merge; training still equals
  full-batch training on one process (tracing changes no number);
* the summary has steps and buckets, and no overlap share (JAX has no backward
  span: documented in bagua_core/trace.py).

This file is also the worker script: ``python tests/jax/test_jax_trace.py SESSION``.
"""

from __future__ import annotations

import os

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests

SESSIONS = {"w3": Session(3, env={"BAGUA_BUCKET_SIZE": "256"})}  # several buckets for a small model
STEPS = 6


def case_names(session: str):
    return ["off_records_nothing", "on_traces_every_bucket_and_step"]  # in this order: on is process-wide


class Worker(JaxWorker):
    def __init__(self):
        super().__init__()
        import bagua_jax

        self.group = bagua_jax.init_process_group()

    def scratch(self, what):
        import tempfile

        return os.path.join(tempfile.gettempdir(), f"bagua_test_{what}_{os.environ['MASTER_PORT']}")

    def train(self, tx, steps):
        """Data-parallel training of a small MLP under jit; returns the params."""
        jax, jnp, optax = self.jax, self.jnp, self.optax
        rng = np.random.default_rng(0)
        params = {
            "w1": jnp.asarray(rng.standard_normal((4, 16)) * 0.5, jnp.float32),
            "b1": jnp.zeros(16, jnp.float32),
            "w2": jnp.asarray(rng.standard_normal((16, 16)) * 0.5, jnp.float32),
            "w3": jnp.asarray(rng.standard_normal((16, 3)) * 0.5, jnp.float32),
        }

        def loss(p, x, y):
            h = jnp.tanh(jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"])
            return optax.softmax_cross_entropy_with_integer_labels(h @ p["w3"], y).mean()

        @jax.jit
        def step(p, s, x, y):
            u, s = tx.update(jax.grad(loss)(p, x, y), s, p)
            return optax.apply_updates(p, u), s

        p, s = params, tx.init(params)
        for t in range(steps):
            x, y = self.batch(t, self.rank)
            p, s = step(p, s, x, y)
        jax.block_until_ready(p)
        return params, loss, p

    @staticmethod
    def batch(step, rank):
        g = np.random.default_rng(10007 * step + rank)
        return g.standard_normal((8, 4)).astype(np.float32), g.integers(0, 3, 8)

    def barrier(self):
        from bagua_core import comm

        comm.barrier(self.group)

    # -- cases --
    def off_records_nothing(self):
        import bagua_jax
        from bagua_core import _C, trace

        assert "BAGUA_TRACE" not in os.environ
        tx = self.optax.chain(bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm()), self.optax.sgd(0.1))
        self.train(tx, 2)
        assert not _C.ffi_step_timings_on()
        records, dropped = _C.drain_ffi_step_timings()
        assert records == [] and dropped == 0
        assert trace._writer is None and trace._follower is None

    def on_traces_every_bucket_and_step(self):
        import json
        import shutil

        import bagua_jax
        from bagua_core import _C, trace

        jax, optax = self.jax, self.optax
        folder = self.scratch("jax_trace")
        path = os.path.join(folder, "trace.json")
        os.environ["BAGUA_TRACE"] = path
        try:
            tx = optax.chain(bagua_jax.transform(bagua_jax.GradientAllReduceAlgorithm(), name="mlp"), optax.sgd(0.1))
            assert _C.ffi_step_timings_on()
            params, loss, p = self.train(tx, STEPS)
            # a second transform in the same process: its own rows, under its default name
            other = bagua_jax.transform(bagua_jax.ByteGradAlgorithm(hierarchical=False))
            other_state = other.init({"g": jax.numpy.zeros(64)})
            jax.jit(other.update)({"g": jax.numpy.full(64, float(self.rank))}, other_state)[0]["g"].block_until_ready()
            trace.close()
            assert not _C.ffi_step_timings_on()  # closed: recording stops

            # tracing changes no number: training equals full-batch training on one process
            ref_tx = optax.sgd(0.1)
            rp, rs = params, ref_tx.init(params)
            for t in range(STEPS):
                xs, ys = zip(*[self.batch(t, r) for r in range(self.world)])
                u, rs = ref_tx.update(jax.grad(loss)(rp, np.concatenate(xs), np.concatenate(ys)), rs, rp)
                rp = optax.apply_updates(rp, u)
            for k in params:
                np.testing.assert_allclose(np.asarray(p[k]), np.asarray(rp[k]), rtol=1e-5, atol=1e-6)

            with open(trace.rank_path(path, self.rank)) as f:
                events = json.load(f)  # valid JSON, closed by close()
            comm = [e for e in events if e.get("ph") == "X" and e["name"].startswith("bucket ")]
            mlp = [e for e in comm if e["args"]["model"] == "mlp"]
            buckets = {e["args"]["bucket"] for e in mlp}
            assert len(buckets) >= 3, buckets  # 256-byte buckets: w3, w2 and w1+b1 are separate
            seen = sorted((e["args"]["step"], e["args"]["bucket"]) for e in mlp)
            assert seen == [(s, b) for s in range(STEPS) for b in sorted(buckets)], seen
            for e in comm:
                a = e["args"]
                assert e["pid"] == self.rank
                assert 0 < a["ready_ns"] <= a["launch_ns"] <= a["start_ns"] <= a["end_ns"], a
                assert abs(e["ts"] - a["start_ns"] / 1000) < 1 and e["dur"] >= 0
            for s in range(STEPS):  # the steps of one update run in bucket order (chained by XLA's token)
                ends = [
                    e["args"]["end_ns"]
                    for e in sorted(mlp, key=lambda e: e["args"]["bucket"])
                    if e["args"]["step"] == s
                ]
                assert ends == sorted(ends), ends
            others = {e["args"]["model"] for e in comm} - {"mlp"}
            assert len(others) == 1 and next(iter(others)).endswith("_bytegrad"), others
            rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
            assert "mlp comm thread" in rows and not any("framework" in r for r in rows), rows
            summary = trace.summary(events)
            s = summary[(self.rank, "mlp")]
            assert s["steps"] == STEPS and s["buckets"] == len(buckets) and s["comm_ms"] > 0, s
            assert np.isnan(s["overlap"]), s  # no backward span in JAX
            self.barrier()
            if self.rank == 0:
                merged = os.path.join(folder, "merged.json")
                trace.merge(merged, [trace.rank_path(path, r) for r in range(self.world)])
                with open(merged) as f:
                    assert {e["pid"] for e in json.load(f)} == set(range(self.world))
            self.barrier()
        finally:
            del os.environ["BAGUA_TRACE"]
            if self.rank == 0:
                shutil.rmtree(folder, ignore_errors=True)


test_case, test_session_exits_cleanly = session_tests(
    __file__, SESSIONS, case_names, timeout=150, test_timeout=240, requires=["jax", "optax"]
)

if __name__ == "__main__":
    worker_main(Worker, case_names)
