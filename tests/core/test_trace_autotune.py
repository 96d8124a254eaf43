"""BAGUA_TRACE and BAGUA_AUTOTUNE on real multi-process training (torch, gloo).

Trace: every rank writes a valid Chrome trace with, per step and bucket, the
engine's ready <= launch <= start <= end, and the backward spans of the driver.
Autotune: every rank switches plans at the same steps, training matches an
independent full-batch reference (SGD on the mean loss over every rank's
batch) and stays identical across ranks, rank 0 writes a log that plots, and a
peer that disagrees gets AutotuneMismatchError.

This file is also the worker: ``python tests/core/test_trace_autotune.py SESSION``.
"""

from __future__ import annotations

import os

from tests.harness.mp import Session, session_tests

AUTOTUNE_ENV = {
    "BAGUA_AUTOTUNE": "1",
    "BAGUA_AUTOTUNE_MAX_SAMPLES": "4",
    "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S": "0",
    "BAGUA_AUTOTUNE_WARMUP_TIME_S": "0",
    "BAGUA_AUTOTUNE_INTERVAL_STEPS": "3",
    "BAGUA_AUTOTUNE_CONFIRM_PAIRS": "2",
    "BAGUA_IS_OUTPUT_AUTOTUNE_LOG": "1",
}
TRACE_ENV = {"BAGUA_BUCKET_SIZE": "256"}  # several buckets for a small model
SESSIONS = {
    "trace2": Session(2, env=TRACE_ENV),
    "trace3": Session(3, env=TRACE_ENV),
    "autotune2": Session(2, env=AUTOTUNE_ENV),
    "autotune3": Session(3, env=AUTOTUNE_ENV),
}
STEPS = 45


def case_names(session):
    if session.startswith("trace"):
        return ["trace_has_every_bucket_and_step"]
    return [
        "autotune_switches_at_the_same_steps",
        "autotune_peer_disagrees",
        "autotune_setting_differs",
        "engine_lanes_setting_differs",
    ]


test_case, test_session_exits_cleanly = session_tests(
    __file__, SESSIONS, case_names, timeout=150, test_timeout=240, requires=["torch", "optuna"]
)


def test_summary_counts_overlapping_lanes_once():
    from bagua_core import trace

    def bucket(i, start, end):
        return {
            "ph": "X",
            "pid": 0,
            "name": f"bucket {i}",
            "ts": start / 1000,
            "args": {"model": "m", "step": 0, "bucket": i, "start_ns": start, "end_ns": end},
        }

    span = {
        "ph": "X",
        "pid": 0,
        "name": "forward start -> backward end",
        "ts": 0.0,
        "dur": 25.0,
        "args": {"model": "m", "step": 0},
    }
    # lanes 0 and 1 overlap from 20 to 30 us; communication covers 10-40 us, 15 us of it before backward ended
    [(key, row)] = trace.summary([bucket(0, 10_000, 30_000), bucket(1, 20_000, 40_000), span]).items()
    assert key == (0, "m") and row["buckets"] == 2
    assert abs(row["comm_ms"] - 0.030) < 1e-12 and abs(row["overlap"] - 0.5) < 1e-12, row


# ---------------------------------------------------------------- the worker

if __name__ == "__main__":
    import json
    import shutil
    import tempfile

    from tests.harness.torch_worker import TorchWorker, worker_main

    class Worker(TorchWorker):
        def model(self):
            nn = self.nn
            self.torch.manual_seed(0)
            return nn.Sequential(
                nn.Linear(4, 32),
                nn.ReLU(),
                nn.Linear(32, 32),
                nn.ReLU(),
                nn.Linear(32, 32),
                nn.ReLU(),
                nn.Linear(32, 3),
            )

        def train(self, model, opt, steps, full_batch=False):
            loss_fn = self.nn.CrossEntropyLoss()
            rank = self.rank
            for step in range(steps):
                if full_batch:  # every rank's batch: the gradient of the mean loss is the mean gradient
                    parts = []
                    for r in range(self.world):
                        self.rank = r
                        parts.append(self.batch(step))
                    self.rank = rank
                    x = self.torch.cat([p[0] for p in parts])
                    y = self.torch.cat([p[1] for p in parts])
                else:
                    x, y = self.batch(step)
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()

        def scratch(self, what):
            port = os.environ["MASTER_PORT"]
            return os.path.join(tempfile.gettempdir(), f"bagua_test_{what}_{port}")

        # ---- trace ----
        def trace_has_every_bucket_and_step(self):
            from bagua_core import trace

            folder = self.scratch("trace")
            os.environ["BAGUA_TRACE"] = os.path.join(folder, "trace.json")
            try:
                model = self.model()
                opt = self.torch.optim.SGD(model.parameters(), lr=0.1)
                model.with_bagua([opt], self.A.GradientAllReduceAlgorithm())
                steps = 5
                self.train(model, opt, steps)
                names = [b.name for b in model.bagua_ddp.buckets]
                assert len(names) >= 3, names
                trace.close()
                path = trace.rank_path(os.environ["BAGUA_TRACE"], self.rank)
                with open(path) as f:
                    events = json.load(f)  # valid JSON, closed at close()
                comm = [e for e in events if e.get("ph") == "X" and e["name"].startswith("bucket ")]
                seen = {(e["args"]["step"], e["args"]["bucket"]) for e in comm}
                assert seen == {(s, b) for s in range(steps) for b in range(len(names))}, sorted(seen)
                for e in comm:
                    a = e["args"]
                    assert e["pid"] == self.rank
                    assert 0 < a["ready_ns"] <= a["launch_ns"] <= a["start_ns"] <= a["end_ns"], a
                    assert abs(e["ts"] - a["start_ns"] / 1000) < 1 and e["dur"] >= 0
                backward = [e for e in events if e.get("ph") == "X" and e["name"].startswith("backward")]
                assert sorted(e["args"]["step"] for e in backward) == list(range(steps))
                for e in backward:  # the last bucket is ready within backward
                    last = max(c["args"]["ready_ns"] for c in comm if c["args"]["step"] == e["args"]["step"])
                    assert e["ts"] * 1000 - 1000 <= last <= (e["ts"] + e["dur"]) * 1000 + 1000
                lanes = model.bagua_ddp.engine.num_lanes
                assert lanes == 2  # the default on CPU: one row per lane, bucket i on lane i % 2
                rows = {e["args"]["name"]: e["tid"] for e in events if e.get("name") == "thread_name"}
                module = model.bagua_ddp.module_name
                for e in comm:
                    assert e["tid"] == rows[f"{module} comm lane {e['args']['bucket'] % lanes}"], e
                [(key, summary)] = trace.summary(events).items()
                assert key == (self.rank, model.bagua_ddp.module_name) and summary["steps"] == steps, summary
                assert summary["buckets"] == len(names) and 0 <= summary["overlap"] <= 1, summary
                self.dist.barrier()
                if self.rank == 0:  # every rank's file, merged
                    merged = os.path.join(folder, "merged.json")
                    trace.merge(merged, [trace.rank_path(os.environ["BAGUA_TRACE"], r) for r in range(self.world)])
                    with open(merged) as f:
                        pids = {e["pid"] for e in json.load(f)}
                    assert pids == set(range(self.world)), pids
                self.dist.barrier()
            finally:
                del os.environ["BAGUA_TRACE"]
                if self.rank == 0:
                    shutil.rmtree(folder, ignore_errors=True)

        # ---- autotune ----
        def autotune_switches_at_the_same_steps(self):
            from bagua_core.autotune import plot

            model = self.model()
            model.bagua_module_name = f"net_{os.environ['MASTER_PORT']}"
            opt = self.torch.optim.SGD(model.parameters(), lr=0.05)
            model.with_bagua([opt], self.A.GradientAllReduceAlgorithm())
            session = model.bagua_ddp.autotune
            assert session is not None
            self.train(model, opt, STEPS)
            assert session.completed, "autotune did not finish within the test's steps"
            switches = [(step, plan.id, plan.bucket_bytes, plan.order) for step, plan in session.switches]
            assert len(switches) >= 1, switches
            everyone = [None] * self.world
            self.dist.all_gather_object(everyone, switches)
            assert all(g == switches for g in everyone), everyone
            # the final buckets are the plan's, on every rank
            buckets = [b.tensor_names for b in model.bagua_ddp.buckets]
            assert buckets == session.buckets(), (buckets, session.buckets())
            self.same_everywhere(self.flat(model))
            reference = self.model()
            ref_opt = self.torch.optim.SGD(reference.parameters(), lr=0.05)
            self.train(reference, ref_opt, STEPS, full_batch=True)
            self.close_to(self.flat(model), self.flat(reference), rtol=1e-4, atol=1e-5)
            if self.rank == 0:
                # a plan other than the default is kept only when the paired confirmation showed it faster
                v = session.tuner.verdict
                assert v is not None and v.switched == (
                    session.plan.order is not None or session.plan.bucket_bytes != v.default_bytes
                ), (v, session.plan)
                assert session.log_path and os.path.exists(session.log_path)
                rows = plot.read_log(session.log_path)
                assert len(rows) >= 2 and {r["plan_id"] for r in rows} >= {0}, rows
                png = plot.plot(session.log_path, self.scratch("autotune") + ".png")
                with open(png, "rb") as f:
                    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
                os.unlink(png)
                os.unlink(session.log_path)
            print(f"rank {self.rank}: switches {[(s, i, b) for s, i, b, _ in switches]}")

        def autotune_peer_disagrees(self):
            import dataclasses

            from bagua_core import config
            from bagua_core.autotune import AutotuneMismatchError, AutotuneSession

            s = dataclasses.replace(config.load(), autotune_interval_steps=1, autotune_log=False)
            store = self.group.store
            decls = [("a", 100, "float32"), ("b", 100, "float32")]
            session = AutotuneSession(
                decls, 1024, store, f"disagree_{os.environ['MASTER_PORT']}", self.rank, self.world, "disagree", s
            )
            order = lambda: ["a", "b"]  # noqa: E731
            assert session.on_step_start(0, order) is None
            if self.rank == 0:
                session.on_step_start(1, order)  # decision #0: keep plan 0 from step 1
                self.expect_error(
                    AutotuneMismatchError,
                    lambda: session.on_step_start(2, order),
                    "rank 1 reports plan 99",
                    "rank 0 runs plan 0",
                )
            elif self.rank == 1:  # one step ahead of rank 0's decision
                self.expect_error(
                    AutotuneMismatchError,
                    lambda: session.on_step_start(2, order),
                    "decision #0",
                    "at step 1",
                    "rank 1 runs plan 0 at step 2",
                )
                # and a disagreeing acknowledgement, as a peer with another plan would send
                store.set(session._key("ack", 0, 1), json.dumps({"step": 1, "plan": 99}).encode())
            else:
                assert session.on_step_start(1, order) is None
            self.dist.barrier()

        def _wrapping_refused_when_the_last_rank_sets(self, name, value):
            """The last rank sets ``name`` to ``value``: wrapping raises ValueError naming it on every rank."""
            old = os.environ.get(name)
            if self.rank == self.world - 1:
                os.environ[name] = value
            try:
                model = self.model()
                opt = self.torch.optim.SGD(model.parameters(), lr=0.05)
                self.expect_error(
                    ValueError, lambda: model.with_bagua([opt], self.A.GradientAllReduceAlgorithm()), name
                )
            finally:
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old

        def autotune_setting_differs(self):
            self._wrapping_refused_when_the_last_rank_sets("BAGUA_AUTOTUNE_INTERVAL_STEPS", "7")

        def engine_lanes_setting_differs(self):
            self._wrapping_refused_when_the_last_rank_sets("BAGUA_ENGINE_LANES", "1")

    worker_main(Worker, case_names)
