"""AsyncModelAverageAlgorithm across real processes.

* a fixed schedule where the outcome is deterministic: with a sync interval
  longer than the run no background round happens until ``abort``, whose last
  round averages the weights each rank trained on its own; this equals an
  independent reference (plain torch training, torch.distributed all_gather,
  numpy mean), and the warm-up equals gradients averaged with
  torch.distributed;
* invariants where timing decides: no optimizer step is torn by an average
  (an optimizer that moves every weight by the same amount keeps all weights
  equal only if steps and averages never interleave), the weights reach the
  average once training stops, abort/resume cycles, the loss goes down;
* the copy-back ``w = avg + (w - snapshot)``: a round held between its
  snapshot and its apply (the engine's test hook) while every rank takes an
  optimizer step leaves each rank with the numpy mean of the snapshots plus
  its own step;
* a peer dying during background averaging raises on the survivors within
  the timeout (session "dead");
* ``abort`` on some ranks only raises CommTimeoutError within the timeout,
  withdraws the request (a later lone ``abort`` times out too) and leaves the
  averaging running, until every rank aborts (session "abort_timeout");
* bad input raises at wrap time.

One multi-process session per world size runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import os
import sys
import time

from tests.harness.mp import Session, session_tests
from tests.harness.torch_worker import TorchWorker, worker_main

NEVER_MS = 10**7  # a sync interval longer than any test: rounds only at abort()
DEAD_TIMEOUT_S = 4.0
ABORT_TIMEOUT_S = 3.0
VICTIM, VICTIM_RC = 2, 3
SESSIONS = {
    "w2": Session(2),
    "w3": Session(3),
    "dead": Session(3, env={"BAGUA_TIMEOUT": str(DEAD_TIMEOUT_S)}),
    "abort_timeout": Session(3, env={"BAGUA_TIMEOUT": str(ABORT_TIMEOUT_S)}),
}


def case_names(session: str):
    if session == "dead":
        return ["survivors_raise_within_timeout"]
    if session == "abort_timeout":
        return ["abort_times_out_unless_every_rank_aborts"]
    names = [
        "abort_gives_exact_average",
        "warmup_allreduces_then_abort_averages",
        "weights_reach_average_when_idle",
        "abort_resume_cycles",
        "state_dict_keeps_step",
        "bad_input_refused",
        "loss_goes_down",
        "torch_api_and_init_by_name",
        "buffers_broadcast_at_abort",
        "fast_rank_not_blocked_by_slow_peer",
    ]
    from tests.harness.built_with import HAS_TEST_BINDINGS  # here: workers import torch first

    if HAS_TEST_BINDINGS:  # the case holds a round through the averager's test hooks
        names.insert(0, "update_during_round_kept")
    if session == "w2":
        names.append("no_torn_step")  # exact with two ranks: a + b == b + a, (x + x) / 2 == x
    return names


class Worker(TorchWorker):
    def algo(self, **kw):
        return self.A.AsyncModelAverageAlgorithm(**kw)

    def train_step(self, model, opt, step):
        x, y = self.batch(step)
        opt.zero_grad()
        loss = self.torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    def reference_mean(self, model):
        """The mean over the ranks of a plain model's weights (numpy, float64)."""
        import numpy as np

        t = self.flat(model)
        every = [self.torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(every, t)
        return self.torch.from_numpy(np.mean(np.stack([e.double().numpy() for e in every]), axis=0))

    def _schedule(self, warmup):
        torch = self.torch
        model, ref = self.mlp(3), self.mlp(3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        algo = self.algo(sync_interval_ms=NEVER_MS, warmup_steps=warmup)
        model.with_bagua([opt], algo)
        for step in range(8):
            self.train_step(model, opt, step)
            x, y = self.batch(step)
            ropt.zero_grad()
            torch.nn.functional.cross_entropy(ref(x), y).backward()
            if step < warmup:  # the reference warm-up: torch.distributed averages the gradients
                for p in ref.parameters():
                    self.dist.all_reduce(p.grad)
                    p.grad /= self.world
            ropt.step()
            if step == warmup - 1:
                self.close_to(self.flat(model), self.flat(ref))
                self.same_everywhere(self.flat(model))
        assert model.bagua_ddp.averager.rounds == 0, "a round ran before abort"
        self.close_to(self.flat(model), self.flat(ref))  # trained alone since the warm-up
        algo.abort(model)
        got = self.flat(model)
        self.same_everywhere(got)
        self.close_to(got.double(), self.reference_mean(ref), rtol=0, atol=1e-6)
        assert model.bagua_ddp.averager.rounds == 1
        model.bagua_ddp.close()

    def abort_gives_exact_average(self):
        self._schedule(warmup=0)

    def warmup_allreduces_then_abort_averages(self):
        self._schedule(warmup=3)

    def update_during_round_kept(self):
        """One round held (engine test hook) after its snapshot w0: every
        rank takes an optimizer step (ranks > 0 with their allreduce in
        flight, waiting for rank 0, still held), then the round applies:
        each rank must hold mean(w0) + (w1 - w0), w1 its weights after the step."""
        import numpy as np

        torch = self.torch
        model = self.mlp(11)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        algo = self.algo(sync_interval_ms=5)
        model.with_bagua([opt], algo)
        averager = model.bagua_ddp.averager
        hook = averager._core
        with torch.no_grad():  # different weights per rank (the loop does not run yet)
            g = torch.Generator().manual_seed(300 + self.rank)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g))
        hook._test_hold(True)
        try:
            averager.start()
            assert hook._test_wait_held(30.0), "no round took its snapshot"
            w0 = self.flat(model).clone()  # the snapshot: nothing changed the weights since
            if self.rank > 0:
                hook._test_release_held()  # its allreduce now waits for rank 0
            self.train_step(model, opt, 7)  # takes the weight lock while the round is in flight
            w1 = self.flat(model).clone()
            self.dist.barrier()  # every rank stepped before rank 0 lets the allreduce finish
            if self.rank == 0:
                hook._test_release_held()
            deadline = time.monotonic() + 30.0
            while averager.rounds < 1:
                assert time.monotonic() < deadline, "the held round did not finish"
                time.sleep(0.005)
            got = self.flat(model).clone()  # the next round, if any, is held after its snapshot
        finally:
            hook._test_hold(False)
        every = [torch.empty_like(w0) for _ in range(self.world)]
        self.dist.all_gather(every, w0)
        mean = np.mean(np.stack([e.double().numpy() for e in every]), axis=0)
        want = torch.from_numpy(mean + (w1.double().numpy() - w0.double().numpy()))
        step = (w1 - w0).abs().max().item()
        assert step > 1e-3 and (w0.double() - mean).abs().max().item() > 1e-2, "the test would not tell"
        self.close_to(got.double(), want, rtol=0, atol=1e-5)
        algo.abort(model)
        self.same_everywhere(self.flat(model))
        model.bagua_ddp.close()

    def weights_reach_average_when_idle(self):
        torch = self.torch
        model = self.mlp(4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = self.algo(sync_interval_ms=5)
        model.with_bagua([opt], algo)
        for step in range(10):
            self.train_step(model, opt, step + 10 * self.rank)
        self.dist.barrier()
        # Training stopped everywhere: rounds run on idle weights. (Whether the
        # weights differed at the barrier is a race: a round may already have
        # averaged them; the rounds counted below are what must happen.)
        rounds = model.bagua_ddp.averager.rounds
        time.sleep(0.3)
        after = self.flat(model)
        assert model.bagua_ddp.averager.rounds > rounds, "no round ran while idle"
        allv = self.gathered(after)
        for r in range(self.world):
            self.close_to(allv[r], after, rtol=0, atol=1e-6)
        algo.abort(model)
        self.same_everywhere(self.flat(model))
        model.bagua_ddp.close()

    def abort_resume_cycles(self):
        torch = self.torch
        model = self.mlp(5)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        algo = self.algo(sync_interval_ms=2, warmup_steps=2)
        model.with_bagua([opt], algo)
        algo.abort(model)  # before the loop started: a no-op
        algo.resume(model)
        averager = model.bagua_ddp.averager
        step = 0
        for _cycle in range(3):
            for _ in range(8):
                self.train_step(model, opt, step)
                step += 1
                time.sleep(0.005)
            algo.abort(model)
            algo.abort(model)  # idempotent
            assert not averager.running
            w = self.flat(model)
            self.same_everywhere(w)
            model.eval()
            with torch.no_grad():
                model(torch.randn(2, 4))
            model.train()
            assert self.flat(model).equal(w), "evaluation changed the weights"
            algo.resume(model)
            algo.resume(model)  # idempotent
            assert averager.running
        rounds = averager.rounds
        assert rounds >= 3, rounds
        algo.abort(model)
        model.bagua_ddp.close()

    def state_dict_keeps_step(self):
        torch = self.torch
        model = self.mlp(6)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = self.algo(sync_interval_ms=NEVER_MS, warmup_steps=4)
        model.with_bagua([opt], algo)
        for step in range(3):
            self.train_step(model, opt, step)
        saved = model.bagua_ddp.state_dict()
        assert saved == {"algorithm": "async", "state": {"step": 3}}, saved
        model.bagua_ddp.load_state_dict({"algorithm": "async", "state": {"step": 1}})
        self.expect_error(
            ValueError, lambda: model.bagua_ddp.load_state_dict({"algorithm": "async", "state": {"step": -1}}), "step"
        )
        algo.abort(model)
        model.bagua_ddp.close()

    def bad_input_refused(self):
        torch = self.torch
        self.expect_error(ValueError, lambda: self.algo(sync_interval_ms=-1), "sync_interval_ms", ">= 0")
        self.expect_error(ValueError, lambda: self.algo(warmup_steps=-2), "warmup_steps", ">= 0")
        self.expect_error(ValueError, lambda: self.algo(peer_selection_mode="shift_one"), "peer_selection_mode")
        self.expect_error(ValueError, lambda: self.algo(peer_selection_mode="ring"), "peer_selection_mode")
        self.expect_error(TypeError, lambda: self.algo(sync_interval_ms="5"), "sync_interval_ms")
        self.expect_error(TypeError, lambda: self.algo(warmup_steps=1.5), "warmup_steps")
        model = self.mlp(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.expect_error(
            ValueError, lambda: self.bt.distributed.wrap(model, [opt], self.algo(), do_flatten=False), "do_flatten=True"
        )
        self.expect_error(TypeError, lambda: self.algo().abort(torch.nn.Linear(2, 2)), "with_bagua")

    def _loss(self, model, x, y):
        with self.torch.no_grad():
            return self.torch.nn.functional.cross_entropy(model(x), y).item()

    def loss_goes_down(self):
        torch = self.torch
        model = self.mlp(7)
        opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
        algo = self.algo(sync_interval_ms=5, warmup_steps=5)
        model.with_bagua([opt], algo)
        g = torch.Generator().manual_seed(99)
        w = torch.randn(4, 3, generator=g)

        def data(step, n=32):
            gg = torch.Generator().manual_seed(1000 * step + self.rank)
            x = torch.randn(n, 4, generator=gg)
            return x, (x @ w).argmax(1)

        ex, ey = data(10**6, 512)
        before = self._loss(model, ex, ey)
        for step in range(60):
            x, y = data(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        algo.abort(model)
        after = self._loss(model, ex, ey)
        assert after < 0.6 * before, f"loss {before:.4f} -> {after:.4f}"
        assert model.bagua_ddp.averager.rounds > 0
        model.bagua_ddp.close()

    def torch_api_and_init_by_name(self):
        import bagua.torch_api as bagua
        from bagua.torch_api.algorithms import Algorithm
        from bagua.torch_api.algorithms.async_model_average import AsyncModelAverageAlgorithm

        a = Algorithm.init("async", sync_interval_ms=20, warmup_steps=1)
        assert isinstance(a, AsyncModelAverageAlgorithm) and a.sync_interval_ms == 20 and a.warmup_steps == 1
        torch = self.torch
        model = self.mlp(8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model = model.with_bagua([opt], a)
        for step in range(4):
            self.train_step(model, opt, step)
        a.abort(model)
        self.same_everywhere(self.flat(model))
        assert bagua.get_world_size() == self.world
        model.bagua_ddp.close()

    def buffers_broadcast_at_abort(self):
        torch = self.torch
        torch.manual_seed(9)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = self.algo(sync_interval_ms=5)
        model.with_bagua([opt], algo)
        for step in range(6):
            self.train_step(model, opt, step)
        mean = model[1].running_mean.clone()
        if self.world > 1:  # each rank's own statistics while the loop runs
            assert not torch.equal(self.gathered(mean)[0], self.gathered(mean)[1])
        algo.abort(model)
        self.same_everywhere(model[1].running_mean)
        self.same_everywhere(model[1].running_var)
        self.same_everywhere(self.flat(model))
        model.bagua_ddp.close()

    def fast_rank_not_blocked_by_slow_peer(self):
        """Rank 1 pauses 3 s before training; the others' 10 steps do not wait for it."""
        torch = self.torch
        model = self.mlp(10)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = self.algo(sync_interval_ms=5)
        model.with_bagua([opt], algo)
        if self.rank == 1:
            time.sleep(3.0)
        t0 = time.monotonic()
        for step in range(10):
            self.train_step(model, opt, step)
        elapsed = time.monotonic() - t0
        if self.rank != 1:
            assert elapsed < 2.0, f"10 steps took {elapsed:.1f} s: they waited for the paused rank"
        algo.abort(model)
        self.same_everywhere(self.flat(model))
        model.bagua_ddp.close()

    def abort_times_out_unless_every_rank_aborts(self):
        """The last rank does not call abort (it waits in a torch.distributed
        barrier, its loop averaging): the others' abort raises within the
        timeout; then the last rank's lone abort times out too (the others'
        requests were withdrawn); then every rank aborts."""
        from bagua_core import CommTimeoutError

        torch = self.torch
        model = self.mlp(12)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = self.algo(sync_interval_ms=5)
        model.with_bagua([opt], algo)
        averager = model.bagua_ddp.averager
        for step in range(3):
            self.train_step(model, opt, step)
        late = self.world - 1

        def abort_times_out():
            t0 = time.monotonic()
            e = self.expect_error(
                CommTimeoutError,
                lambda: algo.abort(model),
                "abort() waited 3 s",
                "other ranks to call abort()",
                "call abort() on every rank",
            )
            elapsed = time.monotonic() - t0
            assert ABORT_TIMEOUT_S - 0.1 <= elapsed < ABORT_TIMEOUT_S + 3, f"raised after {elapsed:.1f} s: {e}"
            assert averager.running, "the averaging stopped after a timed-out abort"
            self.train_step(model, opt, 100)  # training goes on

        if self.rank != late:
            abort_times_out()
        self.dist.barrier()
        if self.rank == late:
            abort_times_out()
        self.dist.barrier()
        algo.abort(model)
        assert not averager.running
        self.same_everywhere(self.flat(model))
        model.bagua_ddp.close()

    def no_torn_step(self):
        torch = self.torch
        rank = self.rank

        class Uniform(torch.nn.Module):
            """Three weights, all elements equal; forward checks they still
            are (it runs with the weights held, as the optimizer step does)."""

            def __init__(self):
                super().__init__()
                self.a = torch.nn.Parameter(torch.zeros(64))
                self.b = torch.nn.Parameter(torch.zeros(32))
                self.c = torch.nn.Parameter(torch.zeros(16))
                self.torn = 0

            def forward(self, x):
                flat = torch.cat([self.a.detach(), self.b.detach(), self.c.detach()])
                self.torn += int(not torch.all(flat == flat[0]))
                return (self.a.sum() + self.b.sum() + self.c.sum()) * x

        class SlowShift(torch.optim.Optimizer):
            """Moves every weight by rank + 1, one tensor at a time, slowly:
            an average between two tensors would leave them unequal."""

            def __init__(self, params):
                super().__init__(params, {})

            @torch.no_grad()
            def step(self, closure=None):
                for group in self.param_groups:
                    for p in group["params"]:
                        p.add_(float(rank + 1))
                        time.sleep(0.002)

        model = Uniform()
        opt = SlowShift(model.parameters())
        algo = self.algo(sync_interval_ms=0)
        model.with_bagua([opt], algo)
        for _ in range(40):
            opt.zero_grad()
            model(torch.ones(())).backward()
            opt.step()
        algo.abort(model)
        rounds = model.bagua_ddp.averager.rounds
        assert rounds >= 10, f"only {rounds} rounds ran during training"
        assert model.torn == 0, f"{model.torn} of 40 steps saw unequal weights (a torn step)"
        flat = self.flat(model)
        assert torch.all(flat == flat[0]), "unequal weights after abort"
        self.same_everywhere(flat)
        model.bagua_ddp.close()


def dead_main() -> None:
    """Rank 2 exits after 5 steps; ranks 0 and 1 keep training and must get
    the background loop's failure from a training step within the timeout."""
    import torch

    import bagua_torch
    from bagua_core import BaguaError
    from bagua_torch.algorithms import AsyncModelAverageAlgorithm
    from tests.harness.worker import report

    torch.set_num_threads(1)
    rank = bagua_torch.init_process_group().rank
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.with_bagua([opt], AsyncModelAverageAlgorithm(sync_interval_ms=5))
    case = "survivors_raise_within_timeout"
    t0 = None
    for step in range(2000):
        if step == 5:
            if rank == VICTIM:
                os._exit(VICTIM_RC)
            t0 = time.monotonic()
        try:
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        except BaguaError as e:
            elapsed = time.monotonic() - t0
            report(
                case, elapsed < DEAD_TIMEOUT_S + 6, f"{type(e).__name__} after {elapsed:.1f} s: {e}", elapsed=elapsed
            )
            sys.exit(0)
        time.sleep(0.01)
    report(case, False, "no training step raised")
    sys.exit(1)


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    SESSIONS,
    case_names,
    timeout=150,
    test_timeout=240,
    reporting_ranks=lambda session, case: 2 if session == "dead" else SESSIONS[session].world_size,
    returncode=lambda session, rank: VICTIM_RC if session == "dead" and rank == VICTIM else 0,
)


if __name__ == "__main__":
    if sys.argv[1] == "dead":
        dead_main()
    else:
        worker_main(Worker, case_names)
