"""``with_bagua(..., overlap_optimizer=True)``: the optimizer steps bucket by
bucket as each bucket's exchange finishes, with exactly (bitwise) the weights
and optimizer state of the ordinary step, across real processes (2 and 3
ranks, several buckets: BAGUA_BUCKET_SIZE=2048 bytes):

* every supported algorithm (GradientAllReduce, ByteGrad with and without
  error feedback, LowRank, QAdam with its optimizer) x SGD (momentum;
  Nesterov with weight decay), Adam (two parameter groups), AdamW; with an LR
  scheduler; bagua_torch.DistributedDataParallel with do_flatten=False; a closure; a checkpoint round trip (model,
  optimizer, scheduler and algorithm state) resumed with the overlap;
* the step is really left open at the end of backward and ends in step();
  step hooks run once per step;
* skipped steps: gradient accumulation with no_sync, a step skipped with
  zero_grad, a step skipped without it (the next forward ends it), two
  forwards then two backwards (the second backward ends the first's step);
  gradients clipped after ``bagua_ddp.finish_step()``;
* refusals at wrap time, on every rank: algorithms that communicate weights,
  optimizers that are not per-parameter (LBFGS, a subclass with its own
  step), no optimizer, a parameter no optimizer updates.

The failure of a peer mid-step is in test_torch_failures.py ("dead_overlap").
This file is also the worker script (one session per world size).
"""

from __future__ import annotations

import sys

from tests.harness.mp import Session, session_tests

BUCKET_BYTES = 2048
SESSIONS = {
    "w2": Session(2, env={"BAGUA_BUCKET_SIZE": str(BUCKET_BYTES)}),
    "w3": Session(3, env={"BAGUA_BUCKET_SIZE": str(BUCKET_BYTES)}),
}
ALGORITHMS = ["gradient_allreduce", "bytegrad", "bytegrad_ef", "low_rank"]
OPTIMIZERS = ["sgd_momentum", "sgd_nesterov_wd", "adam_two_groups", "adamw"]
MATRIX = [f"bitwise_{a}_{o}" for a in ALGORITHMS for o in OPTIMIZERS] + ["bitwise_qadam"]
OTHERS = [
    "bitwise_with_lr_scheduler",
    "bitwise_no_flatten",
    "bitwise_closure",
    "checkpoint_round_trip",
    "step_is_open_after_backward_and_ends_in_step",
    "step_hooks_run_once",
    "no_sync_accumulation",
    "skipped_step_with_zero_grad",
    "skipped_step_next_forward_ends_it",
    "clipping_after_finish_step",
    "two_forwards_then_two_backwards",
    "refuses_weight_algorithms",
    "refuses_optimizers_not_per_parameter",
    "refuses_missing_optimizer",
]


def case_names(session: str):
    return MATRIX + OTHERS


STEPS = 6


class Worker:
    def __init__(self):
        from tests.harness.torch_worker import TorchWorker

        self.w = TorchWorker()
        self.torch = self.w.torch
        self.A = self.w.A
        self.rank, self.world = self.w.rank, self.w.world

    # -- model, data, runs --
    def model(self):
        nn = self.torch.nn
        self.torch.manual_seed(7)
        return nn.Sequential(
            nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 20), nn.Tanh(), nn.Linear(20, 3)
        )

    def batch(self, step):
        g = self.torch.Generator().manual_seed(1000 * step + self.rank)
        return self.torch.randn(8, 6, generator=g), self.torch.randint(0, 3, (8,), generator=g)

    def loss(self, model, step):
        x, y = self.batch(step)
        return self.torch.nn.functional.cross_entropy(model(x), y)

    def optimizer(self, name, model):
        optim = self.torch.optim
        ps = list(model.parameters())
        return {
            "sgd_momentum": lambda: optim.SGD(ps, lr=0.1, momentum=0.9),
            "sgd_nesterov_wd": lambda: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
            "adam_two_groups": lambda: optim.Adam([{"params": ps[:4]}, {"params": ps[4:], "lr": 3e-3}], lr=1e-2),
            "adamw": lambda: optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
        }[name]()

    def algorithm(self, name, opt=None):
        A = self.A
        return {
            "gradient_allreduce": lambda: A.GradientAllReduceAlgorithm(),
            "bytegrad": lambda: A.ByteGradAlgorithm(),
            "bytegrad_ef": lambda: A.ByteGradAlgorithm(error_feedback=True),
            "low_rank": lambda: A.LowRankAlgorithm(rank=2, start_iter=1, min_compression_rate=1.0),
            "qadam": lambda: A.QAdamAlgorithm(opt),
        }[name]()

    def wrapped(self, algo, opt_name, overlap, do_flatten=True):
        model = self.model()
        if algo == "qadam":
            opt = self.A.QAdamOptimizer(model.parameters(), lr=0.01, warmup_steps=3)
        else:
            opt = self.optimizer(opt_name, model)
        model.with_bagua([opt], self.algorithm(algo, opt), do_flatten=do_flatten, overlap_optimizer=overlap)
        assert len(model.bagua_buckets) >= 3, model.bagua_buckets
        return model, opt

    def train(self, model, opt, steps, sched=None, first=0):
        for step in range(first, first + steps):
            opt.zero_grad()
            self.loss(model, step).backward()
            opt.step()
            if sched is not None:
                sched.step()

    def state(self, model, opt):
        """Weights, then every tensor of the optimizer's state, in a fixed order."""
        out = [p.detach().clone() for p in model.parameters()]
        sd = opt.state_dict()
        for k in sorted(sd["state"]):
            for key in sorted(sd["state"][k]):
                v = sd["state"][k][key]
                out.append(v.detach().clone() if isinstance(v, self.torch.Tensor) else self.torch.tensor(v))
        return out

    def assert_bitwise(self, got, want):
        assert len(got) == len(want), (len(got), len(want))
        for i, (a, b) in enumerate(zip(got, want)):
            if not self.torch.equal(a, b):
                raise AssertionError(f"tensor {i} differs: max abs difference {(a - b).abs().max().item():.3g}")

    def compare(self, run):
        """run(overlap) -> list of tensors; the overlapped run must equal the plain one bitwise."""
        want = run(False)
        got = run(True)
        self.assert_bitwise(got, want)
        weights = got[: len(list(self.model().parameters()))]  # the steps' state (error feedback) is per rank
        self.w.same_everywhere(self.torch.cat([t.reshape(-1) for t in weights]))

    def _matrix(self, algo, opt_name):
        def run(overlap):
            model, opt = self.wrapped(algo, opt_name, overlap)
            self.train(model, opt, STEPS)
            out = self.state(model, opt) + [
                t.clone() for t in model.bagua_ddp.state_dict()["state"].get("step_state", [])
            ]
            model.bagua_ddp.close()
            return out

        self.compare(run)

    # -- cases --
    def bitwise_qadam(self):
        self._matrix("qadam", None)

    def bitwise_with_lr_scheduler(self):
        def run(overlap):
            model, opt = self.wrapped("bytegrad", "sgd_momentum", overlap)
            sched = self.torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
            self.train(model, opt, STEPS, sched)
            lr = self.torch.tensor(sched.get_last_lr())
            model.bagua_ddp.close()
            return self.state(model, opt) + [lr]

        self.compare(run)

    def bitwise_no_flatten(self):
        """bagua_torch.DistributedDataParallel, gradients in their own memory (copied per bucket)."""

        def run(overlap):
            model = self.model()
            opt = self.optimizer("adam_two_groups", model)
            ddp = self.w.bt.DistributedDataParallel(
                model, [opt], self.A.ByteGradAlgorithm(), gradient_as_bucket_view=False, overlap_optimizer=overlap
            )
            assert len(ddp.bagua_buckets) >= 3 and ddp.inner.overlap_optimizer == overlap
            self.train(ddp, opt, STEPS)
            ddp.close()
            return self.state(model, opt)

        self.compare(run)

    def bitwise_closure(self):
        def run(overlap):
            model, opt = self.wrapped("gradient_allreduce", "sgd_momentum", overlap)
            for step in range(STEPS):

                def closure():
                    opt.zero_grad()
                    loss = self.loss(model, step)
                    loss.backward()
                    return loss

                opt.step(closure)
            model.bagua_ddp.close()
            return self.state(model, opt)

        self.compare(run)

    def checkpoint_round_trip(self):
        """Three steps, a checkpoint, three more; a fresh overlapped model
        resumed from the checkpoint ends bitwise where the first did, and
        where the plain run does."""
        torch = self.torch

        def make(overlap):
            model, opt = self.wrapped("bytegrad_ef", "adamw", overlap)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
            return model, opt, sched

        def run(overlap):
            model, opt, sched = make(overlap)
            self.train(model, opt, 3, sched)
            ckpt = {
                "model": {k: v.clone() for k, v in model.state_dict().items()},
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "bagua": model.bagua_ddp.state_dict(),
            }
            ckpt["opt"] = {
                "state": {
                    k: {kk: vv.clone() if isinstance(vv, torch.Tensor) else vv for kk, vv in v.items()}
                    for k, v in ckpt["opt"]["state"].items()
                },
                "param_groups": [dict(g) for g in ckpt["opt"]["param_groups"]],
            }
            ckpt["bagua"] = {
                "algorithm": ckpt["bagua"]["algorithm"],
                "state": {
                    k: [t.clone() for t in v] if isinstance(v, list) else v for k, v in ckpt["bagua"]["state"].items()
                },
            }
            self.train(model, opt, 3, sched, first=3)
            out = self.state(model, opt)
            model.bagua_ddp.close()
            return out, ckpt

        want, _ = run(False)
        got, ckpt = run(True)
        self.assert_bitwise(got, want)
        model, opt, sched = make(True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        sched.load_state_dict(ckpt["sched"])
        model.bagua_ddp.load_state_dict(ckpt["bagua"])
        self.train(model, opt, 3, sched, first=3)
        self.assert_bitwise(self.state(model, opt), want)
        model.bagua_ddp.close()

    def step_is_open_after_backward_and_ends_in_step(self):
        model, opt = self.wrapped("bytegrad", "sgd_momentum", True)
        ddp = model.bagua_ddp
        for step in range(3):
            opt.zero_grad()
            self.loss(model, step).backward()
            assert ddp.step_pending and ddp.engine.in_step, "backward waited for the exchange"
            before = ddp.engine.steps
            opt.step()
            assert not ddp.step_pending and not ddp.engine.in_step and ddp.engine.steps == before + 1
        ddp.close()

    def step_hooks_run_once(self):
        model, opt = self.wrapped("gradient_allreduce", "adamw", True)
        calls = []
        opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
        opt.register_step_post_hook(lambda o, a, k: calls.append("post"))
        seen = []
        opt.register_step_post_hook(lambda o, a, k: seen.append(sum(len(g["params"]) for g in o.param_groups)))
        self.train(model, opt, 2)
        assert calls == ["pre", "post"] * 2, calls
        assert seen == [len(list(model.parameters()))] * 2, seen  # the groups are whole again
        model.bagua_ddp.close()

    def no_sync_accumulation(self):
        def run(overlap):
            model, opt = self.wrapped("bytegrad", "sgd_momentum", overlap)
            for step in range(STEPS):
                if step % 2 == 0:
                    with model.bagua_ddp.no_sync():
                        self.loss(model, step).backward()
                else:
                    self.loss(model, step).backward()
                    opt.step()
                    opt.zero_grad()
            model.bagua_ddp.close()
            return self.state(model, opt)

        self.compare(run)

    def skipped_step_with_zero_grad(self):
        def run(overlap):
            model, opt = self.wrapped("bytegrad", "adamw", overlap)
            for step in range(STEPS):
                opt.zero_grad(set_to_none=False)  # writes the buckets: must not race the exchange
                assert not model.bagua_ddp.engine.in_step, "zero_grad() did not end the open step"
                self.loss(model, step).backward()
                if step % 3 != 1:  # e.g. a step skipped for a non-finite loss
                    opt.step()
            model.bagua_ddp.close()
            return self.state(model, opt)

        self.compare(run)

    def skipped_step_next_forward_ends_it(self):
        def run(overlap):
            model, opt = self.wrapped("gradient_allreduce", "sgd_momentum", overlap)
            for step in range(STEPS):
                self.loss(model, step).backward()  # gradients of skipped steps accumulate
                if step % 2 == 1:
                    opt.step()
                    opt.zero_grad()
            model.bagua_ddp.close()
            return self.state(model, opt)

        self.compare(run)

    def clipping_after_finish_step(self):
        """The contract's way to read gradients between backward and step:
        finish_step() makes them final (that step is not overlapped)."""

        def run(overlap):
            model, opt = self.wrapped("bytegrad", "sgd_momentum", overlap)
            for step in range(STEPS):
                opt.zero_grad()
                self.loss(model, step).backward()
                model.bagua_ddp.finish_step()
                self.torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                opt.step()
            model.bagua_ddp.close()
            return self.state(model, opt)

        self.compare(run)

    def two_forwards_then_two_backwards(self):
        def run(overlap):
            model, opt = self.wrapped("bytegrad", "sgd_momentum", overlap)
            for step in range(0, STEPS, 2):
                opt.zero_grad()
                a, b = self.loss(model, step), self.loss(model, step + 1)
                a.backward()
                b.backward()  # starts while a's step is open: ends it first
                opt.step()
            model.bagua_ddp.close()
            return self.state(model, opt)

        self.compare(run)

    def _refused(self, model, opts, algo, *needles):
        self.w.expect_error(ValueError, lambda: model.with_bagua(opts, algo, overlap_optimizer=True), *needles)
        assert "bagua_ddp" not in model.__dict__

    def refuses_weight_algorithms(self):
        A = self.A
        model = self.model()
        opt = self.torch.optim.SGD(model.parameters(), lr=0.1)
        for algo in (
            A.DecentralizedAlgorithm(),
            A.LowPrecisionDecentralizedAlgorithm(),
            A.LocalStepsAlgorithm(),
            A.AsyncModelAverageAlgorithm(),
        ):
            self._refused(model, [opt], algo, "overlap_optimizer", "communicates weights")

    def refuses_optimizers_not_per_parameter(self):
        torch = self.torch
        model = self.model()
        self._refused(
            model, [torch.optim.LBFGS(model.parameters())], self.A.ByteGradAlgorithm(), "LBFGS", "supported: SGD, Adam"
        )

        class Clipped(torch.optim.SGD):
            def step(self, closure=None):
                torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], 1.0)
                return super().step(closure)

        class Plain(torch.optim.Adam):
            pass

        self._refused(model, [Clipped(model.parameters(), lr=0.1)], self.A.GradientAllReduceAlgorithm(), "Clipped")
        model.with_bagua([Plain(model.parameters())], self.A.GradientAllReduceAlgorithm(), overlap_optimizer=True)
        model.bagua_ddp.close()

    def refuses_missing_optimizer(self):
        torch = self.torch
        model = self.model()
        self._refused(model, [], self.A.ByteGradAlgorithm(), "needs the optimizers")
        ps = list(model.parameters())
        self._refused(
            model, [torch.optim.SGD(ps[:-2], lr=0.1)], self.A.ByteGradAlgorithm(), "'6.weight'", "not updated"
        )
        model.with_bagua(
            [torch.optim.SGD(ps[:-2], lr=0.1), torch.optim.Adam(ps[-2:])],
            self.A.ByteGradAlgorithm(),
            overlap_optimizer=True,
        )
        model.bagua_ddp.close()


for _a in ALGORITHMS:
    for _o in OPTIMIZERS:
        setattr(Worker, f"bitwise_{_a}_{_o}", lambda self, a=_a, o=_o: self._matrix(a, o))


if __name__ == "__main__":
    from tests.harness.worker import run_cases

    w = Worker()
    failures = run_cases([(c, getattr(w, c)) for c in case_names(sys.argv[1])])
    w.w.dist.destroy_process_group()
    sys.exit(1 if failures else 0)

test_case, test_session_exits_cleanly = session_tests(__file__, SESSIONS, case_names, timeout=600, test_timeout=700)
