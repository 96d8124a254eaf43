"""bagua_torch._overlap in one process: the optimizer step run bucket by
bucket (param_groups narrowed to one bucket's parameters at a time, buckets
in any completion order) gives bitwise the weights and state of the ordinary
step, for every optimizer it accepts, with their default, foreach and fused
paths, several parameter groups and parameters without gradients; the
accepted and refused optimizers. Across processes with the engine:
test_torch_overlap_optimizer.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from bagua_torch import _overlap  # noqa: E402
from bagua_torch.algorithms.q_adam import QAdamOptimizer  # noqa: E402

O = torch.optim


class FakeOwner:
    """What _BucketGroups asks of a wrapped model: its buckets' parameters,
    whether its step is open, and which bucket finishes next (here the
    highest pending: not launch order)."""

    def __init__(self, bucket_params):
        self.bucket_params = bucket_params
        self.step_pending = True
        self.waited = []

    def wait_bucket_of_step(self, pending):
        i = max(pending)
        self.waited.append(i)
        return i

    def record_optimizer_span(self, bucket, t0, t1):
        pass


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)
    )


OPTIMIZERS = {
    "sgd": lambda ps: O.SGD(ps, lr=0.1),
    "sgd_momentum_nesterov_wd": lambda ps: O.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "sgd_foreach": lambda ps: O.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
    "sgd_fused": lambda ps: O.SGD(ps, lr=0.1, momentum=0.9, fused=True),
    "adam": lambda ps: O.Adam(ps, lr=0.01),
    "adam_amsgrad_foreach": lambda ps: O.Adam(ps, lr=0.01, amsgrad=True, foreach=True),
    "adam_fused": lambda ps: O.Adam(ps, lr=0.01, fused=True),
    "adamw": lambda ps: O.AdamW(ps, lr=0.01, weight_decay=0.1),
    "adamw_foreach": lambda ps: O.AdamW(ps, lr=0.01, foreach=True),
    "adamax": lambda ps: O.Adamax(ps, lr=0.01),
    "nadam": lambda ps: O.NAdam(ps, lr=0.01),
    "radam": lambda ps: O.RAdam(ps, lr=0.01),
    "adagrad": lambda ps: O.Adagrad(ps, lr=0.1),
    "adadelta": lambda ps: O.Adadelta(ps),
    "rmsprop": lambda ps: O.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
    "rprop": lambda ps: O.Rprop(ps, lr=0.01),
    "asgd": lambda ps: O.ASGD(ps, lr=0.01),
    "qadam": lambda ps: QAdamOptimizer(ps, lr=0.01, warmup_steps=2),
}
if hasattr(O, "Adafactor"):
    OPTIMIZERS["adafactor"] = lambda ps: O.Adafactor(ps, lr=0.01)


def two_groups(ps, make):
    """The optimizer over two parameter groups (the second at half the lr)."""
    opt = make(ps[:3])
    opt.add_param_group({"params": ps[3:], "lr": opt.param_groups[0]["lr"] / 2})
    return opt


def train(make, overlapped, steps=4):
    m = model()
    ps = list(m.parameters())
    opt = two_groups(ps, make)
    # buckets as the engine builds them: reverse parameter order, several tensors each
    buckets = [[ps[5], ps[4]], [ps[3]], [ps[2], ps[1]], [ps[0]]]
    owner = FakeOwner(buckets)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(9, 5, generator=g), torch.randint(0, 2, (9,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        if step == 1:
            ps[2].grad = None  # no gradient this step: skipped by the optimizer, in both runs
        if overlapped:
            _overlap.step_by_bucket(opt, [owner], opt.step, (), {})
            assert opt.param_groups[0]["params"] == ps[:3] and opt.param_groups[1]["params"] == ps[3:]
        else:
            opt.step()
    if overlapped:
        assert owner.waited[:4] == [3, 2, 1, 0], owner.waited
    state = [t for p in ps for t in opt.state[p].values() if isinstance(t, torch.Tensor)]
    return ps, state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_step_by_bucket_is_bitwise_the_step(name):
    make = OPTIMIZERS[name]
    want_p, want_s = train(make, False)
    got_p, got_s = train(make, True)
    assert len(got_s) == len(want_s) > 0 or name == "sgd"
    for a, b in zip(got_p + got_s, want_p + want_s):
        assert torch.equal(a, b), (a - b).abs().max()


def test_parameters_outside_open_buckets_step_first_without_waiting():
    m = model()
    ps = list(m.parameters())
    opt = O.SGD(ps, lr=0.1)
    owner = FakeOwner([[ps[5], ps[4]]])
    seen = []
    orig = owner.wait_bucket_of_step

    def wait(pending):
        seen.append([len(g["params"]) for g in list.__iter__(opt.param_groups)])
        return orig(pending)

    owner.wait_bucket_of_step = wait
    torch.nn.functional.mse_loss(m(torch.ones(1, 5)), torch.zeros(1, 2)).backward()
    _overlap.step_by_bucket(opt, [owner], opt.step, (), {})
    assert owner.waited == [0] and seen == [[6]]  # restored between units
    owner.step_pending = False  # a closed step: one plain pass, nothing waited
    _overlap.step_by_bucket(opt, [owner], opt.step, (), {})
    assert owner.waited == [0]


@pytest.mark.parametrize("make", [lambda ps: O.LBFGS(ps), lambda ps: O.SparseAdam(ps)])
def test_refused_optimizers(make):
    with pytest.raises(ValueError, match="supported: SGD"):
        _overlap.check_optimizer(make(list(model().parameters())))


def test_subclasses_are_accepted_only_with_their_parents_step():
    class Same(O.AdamW):
        pass

    class Own(O.SGD):
        def step(self, closure=None):
            return super().step(closure)

    ps = list(model().parameters())
    _overlap.check_optimizer(Same(ps))
    with pytest.raises(ValueError, match="Own"):
        _overlap.check_optimizer(Own(ps, lr=0.1))
    for make in OPTIMIZERS.values():
        _overlap.check_optimizer(make(ps))
