"""SyncBatchNorm over Bagua's collectives on 2 and 3 processes (batches of
different sizes per rank, one rank possibly empty): outputs, running
statistics, input and weight/bias gradients equal those of a single-process
``torch.nn.BatchNorm`` on the concatenated batch, which every rank computes
itself from the seeded inputs of all ranks. ``torch.nn.SyncBatchNorm`` cannot
be the reference here: in torch 2.13 it refuses CPU inputs ("SyncBatchNorm
expected input tensor to be on GPU"), and these tests run on CPU over Gloo.
Also: a converted conv net trained with ``with_bagua`` matches single-process
training on the concatenated batch; eval mode is local; bad input raises.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.harness.mp import launch

CASES = [
    "bn1d_flat",
    "bn1d_sequence",
    "bn2d",
    "bn3d",
    "bn2d_no_affine",
    "bn2d_cumulative_momentum",
    "bn2d_float64",
    "eval_mode_is_local",
    "converted_net_trains_like_one_process",
    "bad_input",
]


def _batch_sizes(world):
    return [5, 0, 7][:world] if world == 3 else [6, 3]


class Worker:
    def __init__(self):
        import torch

        import bagua_torch

        torch.set_num_threads(1)
        self.torch = torch
        self.bt = bagua_torch
        self.group = bagua_torch.init_process_group()
        self.rank, self.world = self.group.rank, self.group.size
        from bagua_torch.contrib import SyncBatchNorm, convert_sync_batchnorm

        self.SyncBatchNorm, self.convert = SyncBatchNorm, convert_sync_batchnorm

    def inputs(self, step, shape, dtype=None):
        """Every rank's (x, upstream gradient) for this step: seeded, no communication."""
        torch = self.torch
        xs, gs = [], []
        for r, n in enumerate(_batch_sizes(self.world)):
            g = torch.Generator().manual_seed(100 * step + r)
            xs.append(torch.randn(n, *shape, generator=g, dtype=dtype or torch.float32) * 3 + 2)
            gs.append(torch.randn(n, *shape, generator=g, dtype=dtype or torch.float32))
        return xs, gs

    def compare(self, ref_cls, shape, steps=3, dtype=None, tol=1e-5, **kw):
        torch = self.torch
        c = shape[0]
        ref = ref_cls(c, **kw)
        mine = self.SyncBatchNorm(c, **kw)
        if dtype is not None:
            ref, mine = ref.to(dtype), mine.to(dtype)
        if mine.affine:
            with torch.no_grad():
                for m in (ref, mine):
                    m.weight.copy_(torch.linspace(0.5, 1.5, c))
                    m.bias.copy_(torch.linspace(-1, 1, c))
        for step in range(steps):
            xs, gs = self.inputs(step, shape, dtype)
            x_all = torch.cat(xs).requires_grad_()
            y_ref = ref(x_all)
            y_ref.backward(torch.cat(gs))
            x = xs[self.rank].clone().requires_grad_()
            y = mine(x)
            y.backward(gs[self.rank])
            lo = sum(len(t) for t in xs[: self.rank])
            own = slice(lo, lo + len(x))
            close(y, y_ref[own], tol, "output")
            close(x.grad, x_all.grad[own], tol, "input gradient")
            close(mine.running_mean, ref.running_mean, tol, "running mean")
            close(mine.running_var, ref.running_var, tol, "running var")
            assert int(mine.num_batches_tracked) == int(ref.num_batches_tracked)
            if mine.affine:  # the rank's share: their sum is the whole batch's gradient
                for p_ref, p in ((ref.weight, mine.weight), (ref.bias, mine.bias)):
                    close(self.bt.allreduce(p.grad.clone()), p_ref.grad, tol, "weight/bias gradient")
                    p.grad = None
                    p_ref.grad = None

    def bn1d_flat(self):
        self.compare(self.torch.nn.BatchNorm1d, (5,))

    def bn1d_sequence(self):
        self.compare(self.torch.nn.BatchNorm1d, (4, 9))

    def bn2d(self):
        self.compare(self.torch.nn.BatchNorm2d, (8, 6, 5))

    def bn3d(self):
        self.compare(self.torch.nn.BatchNorm3d, (3, 4, 3, 2))

    def bn2d_no_affine(self):
        self.compare(self.torch.nn.BatchNorm2d, (4, 3, 3), affine=False)

    def bn2d_cumulative_momentum(self):
        self.compare(self.torch.nn.BatchNorm2d, (4, 3, 3), steps=4, momentum=None)

    def bn2d_float64(self):
        self.compare(self.torch.nn.BatchNorm2d, (4, 5, 5), dtype=self.torch.float64, tol=1e-12)

    def eval_mode_is_local(self):
        torch = self.torch
        bn = self.SyncBatchNorm(3).eval()
        with torch.no_grad():
            bn.running_mean.copy_(torch.tensor([1.0, 2.0, 3.0]))
        x = torch.randn(2 + self.rank, 3)  # different sizes per rank, no collective in eval mode
        ref = torch.nn.BatchNorm1d(3).eval()
        ref.load_state_dict(bn.state_dict())
        assert torch.equal(bn(x), ref(x))

    def converted_net_trains_like_one_process(self):
        torch = self.torch
        from bagua_torch.algorithms import GradientAllReduceAlgorithm

        def net():
            torch.manual_seed(0)
            return torch.nn.Sequential(
                torch.nn.Conv2d(2, 4, 3),
                torch.nn.BatchNorm2d(4),
                torch.nn.ReLU(),
                torch.nn.Flatten(),
                torch.nn.Linear(4 * 4 * 4, 3),
            )

        ref = net()
        model = self.convert(net())
        assert isinstance(model[1], self.SyncBatchNorm) and model[1].weight is not None
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model = model.with_bagua([opt], GradientAllReduceAlgorithm())
        for step in range(5):
            xs, gs = self.inputs(step, (2, 6, 6))
            targets = [torch.randn(len(x), 3, generator=torch.Generator().manual_seed(step)) for x in xs]
            # Bagua averages the ranks' gradients: the one-process loss is the ranks' mean
            ref_opt.zero_grad()
            ref_loss = (ref(torch.cat(xs)) - torch.cat(targets)).square().sum() / (16 * self.world)
            ref_loss.backward()
            ref_opt.step()
            opt.zero_grad()
            ((model(xs[self.rank]) - targets[self.rank]).square().sum() / 16).backward()
            opt.step()
        for (n, a), b in zip(ref.named_parameters(), model.parameters()):
            close(b, a, 1e-4, n)
        close(model[1].running_mean, ref[1].running_mean, 1e-5, "running mean")

    def bad_input(self):
        torch = self.torch
        bn = self.SyncBatchNorm(4)
        for x, needle in ((torch.randn(4), "at least 2 dimensions"), (torch.randn(3, 5), "4 features")):
            try:
                bn(x)
            except ValueError as e:
                assert needle in str(e), e
            else:
                raise AssertionError("expected ValueError")


def close(got, ref, tol, what):
    import torch

    err = (got.detach() - ref.detach()).abs().max().item() if got.numel() else 0.0
    assert torch.allclose(got.detach(), ref.detach(), rtol=tol, atol=tol), f"{what}: max abs difference {err:.3g}"


@pytest.mark.parametrize("world", [2, 3])
def test_sync_batchnorm(world):
    run = launch(os.path.abspath(__file__), world, timeout=180)
    for case in CASES:
        run.check_case(case, world)
    run.check()


if __name__ == "__main__":
    from tests.harness.worker import run_cases

    w = Worker()
    sys.exit(1 if run_cases([(c, getattr(w, c)) for c in CASES]) else 0)
