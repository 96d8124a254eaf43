"""Shared setup of torch test workers: Bagua and torch.distributed (gloo) in one
process, a small model, per-rank data and the checks the tests repeat."""

from __future__ import annotations

import sys

from tests.harness.worker import expect_error


class TorchWorker:
    def __init__(self):
        import torch
        import torch.distributed as dist

        import bagua_torch

        torch.set_num_threads(1)
        self.torch = torch
        self.nn = torch.nn
        self.dist = dist
        self.bt = bagua_torch
        self.A = bagua_torch.algorithms
        self.group = bagua_torch.init_process_group()
        dist.init_process_group("gloo")  # MASTER_PORT; Bagua's store is on MASTER_PORT + 1
        self.rank = self.group.rank
        self.world = self.group.size

    def shared_tmpdir(self) -> str:
        """A new directory every rank sees (made by rank 0, removed when it exits)."""
        path = None
        if self.rank == 0:
            import atexit
            import shutil
            import tempfile

            path = tempfile.mkdtemp(prefix="bagua-test-")
            atexit.register(shutil.rmtree, path, True)
        return self.bt.broadcast_object(path, 0)

    def mlp(self, seed, hidden=16, out_bias=True):
        """4 inputs -> ``hidden`` -> 3 classes, initialised from ``seed``."""
        nn = self.nn
        self.torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3, bias=out_bias))

    def fed_parameters(self, weights, algorithm, lr, momentum):
        """Parameters from the numpy arrays ``weights`` whose gradients are
        whatever ``step_grads["g"]`` holds at backward, wrapped with
        ``algorithm`` and SGD(lr, momentum): (model, params, optimizer, step_grads)."""
        torch = self.torch
        params = torch.nn.ParameterList([torch.nn.Parameter(torch.from_numpy(w)) for w in weights])
        model = torch.nn.Module()
        model.params = params
        step_grads = {}
        model.forward = lambda: sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, step_grads["g"]))
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        return model.with_bagua([opt], algorithm), params, opt, step_grads

    def train_fed(self, fed, grads, want, steps, start=0):
        """Steps a ``fed_parameters`` model from step ``start`` up to ``steps``,
        the gradients of step t being ``grads(t)``; after each, every parameter
        must equal ``want[t]`` (this rank's arrays) bitwise."""
        import numpy as np

        model, params, opt, step_grads = fed
        for t in range(start, steps):
            step_grads["g"] = grads(t)
            opt.zero_grad()
            model().backward()
            opt.step()
            for i, p in enumerate(params):
                np.testing.assert_array_equal(p.detach().numpy(), want[t][i], err_msg=f"step {t}, leaf {i}")

    def optimizer_and_algorithm(self, name, model, hierarchical=False):
        """(optimizer, algorithm) for ``model``, by short name: gradient_allreduce,
        bytegrad, bytegrad_error_feedback, decentralized (all),
        decentralized_shift_one, low_precision_decentralized, low_rank,
        local_steps, local_steps_compressed (with error feedback), qadam
        (which brings its own optimizer)."""
        A = self.A
        if name == "qadam":
            opt = A.q_adam.QAdamOptimizer(model.parameters(), lr=0.01, warmup_steps=2)
            return opt, A.q_adam.QAdamAlgorithm(opt, hierarchical=hierarchical)
        opt = self.torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return opt, {
            "gradient_allreduce": lambda: A.gradient_allreduce.GradientAllReduceAlgorithm(hierarchical=hierarchical),
            "bytegrad": lambda: A.bytegrad.ByteGradAlgorithm(hierarchical=hierarchical),
            "bytegrad_error_feedback": lambda: A.bytegrad.ByteGradAlgorithm(
                hierarchical=hierarchical, error_feedback=True
            ),
            "decentralized": lambda: A.decentralized.DecentralizedAlgorithm(hierarchical=hierarchical),
            "decentralized_shift_one": lambda: A.decentralized.DecentralizedAlgorithm(
                hierarchical=hierarchical, peer_selection_mode="shift_one"
            ),
            "low_precision_decentralized": lambda: A.low_precision_decentralized.LowPrecisionDecentralizedAlgorithm(
                hierarchical=hierarchical
            ),
            # compressed from step 1 on; every matrix of a small mlp pays at rate 1
            "low_rank": lambda: A.LowRankAlgorithm(rank=2, start_iter=1, min_compression_rate=1.0),
            # steps 0-3: a warm-up average, a local step, a synchronisation, a local step
            "local_steps": lambda: A.LocalStepsAlgorithm(sync_interval=2, warmup_steps=1, hierarchical=hierarchical),
            # synchronisations after steps 1 (the first) and 3 (which reads the residual and momentum)
            "local_steps_compressed": lambda: A.LocalStepsAlgorithm(
                sync_interval=2, hierarchical=hierarchical, compression="minmax_uint8", error_feedback=True
            ),
        }[name]()

    def batch(self, step, n=8):
        g = self.torch.Generator().manual_seed(1000 * step + self.rank)
        return self.torch.randn(n, 4, generator=g), self.torch.randint(0, 3, (n,), generator=g)

    def flat(self, *models):
        return self.torch.cat([p.detach().reshape(-1) for m in models for p in m.parameters()])

    def gathered(self, t):
        return self.bt.allgather(t.detach().contiguous())

    def same_everywhere(self, t):
        allv = self.gathered(t)
        for r in range(self.world):
            assert self.torch.equal(allv[r], t), f"rank {r} differs from rank {self.rank}"

    def close_to(self, got, ref, rtol=1e-5, atol=1e-6):
        err = (got - ref).abs().max().item()
        assert self.torch.allclose(got, ref, rtol=rtol, atol=atol), f"max abs difference {err:.3g}"

    def assert_training_reduces_loss(self, model, opt, steps=60, factor=0.6):
        """Trains ``model`` (4 inputs, 3 classes, wrapped with ``opt``) on a
        separable task, each rank its own batches; the loss on a held-out
        batch must fall below ``factor`` times its start."""
        torch = self.torch
        w = torch.randn(4, 3, generator=torch.Generator().manual_seed(99))

        def data(step, n=32):
            g = torch.Generator().manual_seed(1000 * step + self.rank)
            x = torch.randn(n, 4, generator=g)
            return x, (x @ w).argmax(1)

        with torch.no_grad():
            ex, ey = data(10**6, 512)
            before = torch.nn.functional.cross_entropy(model(ex), ey).item()
        for step in range(steps):
            x, y = data(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        with torch.no_grad():
            after = torch.nn.functional.cross_entropy(model(ex), ey).item()
        assert after < factor * before, f"loss {before:.4f} -> {after:.4f}"

    expect_error = staticmethod(expect_error)


def worker_main(worker_class, case_names) -> None:
    """Runs the cases of the session named in argv[1] and exits non-zero on a failure."""
    from tests.harness.worker import run_cases

    w = worker_class()
    failures = run_cases([(c, getattr(w, c)) for c in case_names(sys.argv[1])])
    w.dist.destroy_process_group()
    sys.exit(1 if failures else 0)
