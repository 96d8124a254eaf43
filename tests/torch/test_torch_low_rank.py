"""LowRankAlgorithm (PowerSGD) across real processes, against torch's own
``powerSGD_hook`` registered on torch DDP over a gloo group of the same
processes:

* equal settings (rank 2: torch orthogonalises with Gram-Schmidt; rank 4: with
  QR), equal inputs and the same initial Q (the step's documented seeded Q,
  written in numpy in tests/harness/reference/low_rank.py and injected into the hook's
  state) give the same gradients, within float rounding, at every step of the
  warm-up and after it; a matrix that does not pay and the biases travel
  uncompressed, as torch's;
* a rank larger than every matrix's smaller side, and bad settings, raise at
  wrap time (every rank);
* the error memory and Q survive the wrapper's state_dict() (``bagua.step_state.0``):
  a run resumed mid-training continues bitwise as the uninterrupted one.

One multi-process session per world size runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

from tests.harness.mp import Session, session_tests
from tests.harness.reference.low_rank import initial_q
from tests.harness.torch_worker import TorchWorker, worker_main

SESSIONS = {"w2": 2, "w3": 3}
CASES = [
    "matches_powersgd_hook_rank_2",
    "matches_powersgd_hook_rank_4",
    "matches_without_error_feedback",
    "rank_too_large_refused",
    "bad_settings_refused",
    "checkpoint_resumes_bitwise",
    "loss_goes_down",
]
START = 2  # torch needs start_powerSGD_iter >= 2 with error feedback or warm start
STEPS = 7


def case_names(_session):
    return CASES


class Worker(TorchWorker):
    def model(self, seed):
        """(24, 16) and (24, 24) compress; (3, 24) does not pay; biases are 1-D."""
        nn = self.nn
        self.torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 3))

    def data(self, step, n=32):
        g = self.torch.Generator().manual_seed(1000 * step + self.rank)
        return self.torch.randn(n, 16, generator=g), self.torch.randint(0, 3, (n,), generator=g)

    def step(self, model, opt, step):
        x, y = self.data(step)
        opt.zero_grad()
        loss = self.torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    def algo(self, **kw):
        return self.A.LowRankAlgorithm(**{"start_iter": START, **kw})

    def torch_reference(self, rank, error_feedback, bagua_names):
        """Torch DDP with powerSGD_hook on the same model; the hook starts
        from the low-rank step's initial Q of each matrix, found by parameter
        name in Bagua's bucket (``bagua_names``: its tensors in layout order)."""
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        torch = self.torch
        model = self.model(5)
        names = {id(p): n for n, p in model.named_parameters()}
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = ps.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=START,
            min_compression_rate=2,
            use_error_feedback=error_feedback,
            warm_start=True,
        )

        def hook(state, bucket):
            if state.iter == START and bucket.index() not in state.p_memory_dict:
                qs, p_size = [], 0
                for p, g in zip(bucket.parameters(), bucket.gradients()):
                    n = g.shape[0]
                    m = g.numel() // n
                    r = min(n, m, rank)
                    if g.dim() >= 2 and ps._should_compress(n, m, r, 2)[0]:
                        tensor = bagua_names.index(names[id(p)])
                        qs.append(torch.from_numpy(initial_q(0, START, tensor, m, r)).reshape(-1))
                        p_size += n * r
                state.p_memory_dict[bucket.index()] = torch.empty(p_size)
                state.q_memory_dict[bucket.index()] = torch.cat(qs)
            return ps.powerSGD_hook(state, bucket)

        ddp.register_comm_hook(state, hook)
        return model, ddp

    def _matches_hook(self, rank, error_feedback=True):
        torch = self.torch
        model = self.model(5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.with_bagua([opt], self.algo(rank=rank, error_feedback=error_feedback))
        [bucket] = model.bagua_ddp.buckets
        ref, ddp = self.torch_reference(rank, error_feedback, list(bucket.tensor_names))
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        worst = 0.0
        for t in range(STEPS):
            self.step(model, opt, t)
            self.step(ddp, ref_opt, t)
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                scale = q.grad.abs().max().item()
                err = (p.grad - q.grad).abs().max().item()
                worst = max(worst, err / scale)
                assert err <= 2e-4 * scale + 1e-7, (
                    f"step {t}, {name}: gradients differ by {err:.3g} (scale {scale:.3g})"
                )
                if p.dim() == 2 and p.shape[0] == 24:  # the compressed matrices: rank r after the warm-up
                    got = torch.linalg.matrix_rank(p.grad).item()
                    assert (got <= rank) == (t >= START), f"step {t}, {name}: gradient of rank {got}"
        self.close_to(self.flat(model), self.flat(ref), rtol=1e-4, atol=1e-6)
        assert model.bagua_ddp.impl.step == STEPS
        print(f"low rank {rank}: largest gradient difference to torch's hook {worst:.2g} of the gradient's scale")
        model.bagua_ddp.close()

    def matches_powersgd_hook_rank_2(self):
        self._matches_hook(2)

    def matches_powersgd_hook_rank_4(self):
        self._matches_hook(4)

    def matches_without_error_feedback(self):
        self._matches_hook(2, error_feedback=False)

    def rank_too_large_refused(self):
        model = self.model(1)
        opt = self.torch.optim.SGD(model.parameters(), lr=0.1)
        self.expect_error(
            ValueError, lambda: model.with_bagua([opt], self.algo(rank=25)), "rank 25", "smaller side", "rank <= 24"
        )
        model.with_bagua([opt], self.algo(rank=24)).bagua_ddp.close()  # the (24, 24) matrix takes it

    def bad_settings_refused(self):
        A = self.A
        self.expect_error(ValueError, lambda: A.LowRankAlgorithm(rank=0), "rank must be >= 1")
        self.expect_error(ValueError, lambda: A.LowRankAlgorithm(start_iter=-1), "start_iter")
        self.expect_error(ValueError, lambda: A.LowRankAlgorithm(min_compression_rate=-1.0), "min_compression_rate")
        self.expect_error(TypeError, lambda: A.LowRankAlgorithm(warm_start=1), "warm_start")
        self.expect_error(
            TypeError, lambda: A.LowRankAlgorithm(orthogonalization_epsilon="0"), "orthogonalization_epsilon"
        )

    def checkpoint_resumes_bitwise(self):
        torch, bt = self.torch, self.bt
        cut = START + 2  # past the warm-up: error memory and Q are in use

        def wrapped(seed):
            model = self.model(seed)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            return bt.DistributedDataParallel(model, [opt], algorithm=self.algo(rank=2)), opt

        ddp, opt = wrapped(3)
        for t in range(cut):
            self.step(ddp, opt, t)
        saved = {k: v.clone() for k, v in ddp.state_dict().items()}
        saved_opt = {
            "state": {k: {n: v.clone() for n, v in s.items()} for k, s in opt.state_dict()["state"].items()},
            "param_groups": opt.state_dict()["param_groups"],
        }
        state = saved["bagua.step_state.0"]
        numel = sum(p.numel() for p in ddp.module.parameters())
        assert state.dtype == torch.float32 and state.shape[0] == 1 and state.shape[1] > numel, state.shape
        assert bool(state[0, :numel].abs().sum() > 0) and bool(state[0, numel:].abs().sum() > 0)
        for t in range(cut, STEPS):
            self.step(ddp, opt, t)
        want, want_state = self.flat(ddp.module), ddp.state_dict()["bagua.step_state.0"].clone()
        ddp.close()

        ddp2, opt2 = wrapped(11)  # other weights: everything comes from the checkpoint
        ddp2.load_state_dict(saved)
        opt2.load_state_dict(saved_opt)
        for t in range(cut, STEPS):
            self.step(ddp2, opt2, t)
        assert torch.equal(self.flat(ddp2.module), want)
        assert torch.equal(ddp2.state_dict()["bagua.step_state.0"], want_state)
        ddp2.close()

    def loss_goes_down(self):
        model = self.mlp(7)
        opt = self.torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
        model.with_bagua([opt], self.A.LowRankAlgorithm(rank=1, start_iter=5, min_compression_rate=1.0))
        self.assert_training_reduces_loss(model, opt)
        model.bagua_ddp.close()


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__, {name: Session(world) for name, world in SESSIONS.items()}, lambda s: CASES, timeout=150, test_timeout=240
)


if __name__ == "__main__":
    worker_main(Worker, case_names)
