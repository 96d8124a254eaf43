"""fuse_optimizer: fuse_step() gives bitwise the results of step() for every
torch optimizer with an elementwise update, alternating with step(), with
gradients kept or re-allocated (zero_grad set_to_none), and combined with a
model wrapped by with_bagua on 2 and 3 processes (same numbers as the same
training with the unfused optimizer, and Bagua 0.9.2's _bagua_fused_count for
each combination of who flattens and of fusing before or after wrapping). The reference is the same optimizer,
unfused, on an identical copy of the model."""

from __future__ import annotations

import copy
import os
import sys
import warnings

import pytest
import torch

from tests.harness.mp import launch

CONFIGS = [
    ("SGD", dict(lr=0.01)),
    ("SGD", dict(lr=0.01, momentum=0.9)),
    ("SGD", dict(lr=0.01, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.01, momentum=0.9, weight_decay=0.01, dampening=0.1)),
    ("SGD", dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True)),
    ("Adam", dict(lr=0.001)),
    ("Adam", dict(lr=0.001, amsgrad=True)),
    ("Adam", dict(lr=0.001, weight_decay=0.01, amsgrad=True, betas=(0.8, 0.99))),
    ("AdamW", dict(lr=0.001)),
    ("AdamW", dict(lr=0.001, amsgrad=True, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.001)),
    ("RMSprop", dict(lr=0.001, centered=True)),
    ("RMSprop", dict(lr=0.001, momentum=0.9)),
    ("RMSprop", dict(lr=0.001, centered=True, momentum=0.9, weight_decay=0.01)),
    ("Rprop", dict(lr=0.01)),
    ("Rprop", dict(lr=0.01, etas=(0.3, 1.5), step_sizes=(1e-5, 10))),
    ("ASGD", dict(lr=0.01)),
    ("ASGD", dict(lr=0.01, t0=20, weight_decay=0.01)),
    ("Adamax", dict(lr=0.01)),
    ("Adamax", dict(lr=0.01, weight_decay=0.01)),
    ("Adadelta", dict(lr=1.0)),
    ("Adadelta", dict(lr=1.0, rho=0.8, weight_decay=0.01)),
]


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    )


def _optimizer(model, name, kwargs):
    params = list(model.parameters())
    # two groups, the second with its own learning rate: fusion is per group
    return getattr(torch.optim, name)(
        [{"params": params[:4]}, {"params": params[4:], "lr": kwargs["lr"] * 0.5}], **kwargs
    )


def _train_step(model, opt, step, use_fuse, set_to_none):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)
    opt.zero_grad(set_to_none=set_to_none)
    torch.nn.functional.mse_loss(model(x), y).backward()
    (opt.fuse_step if use_fuse else opt.step)()


@pytest.mark.parametrize("set_to_none", [True, False], ids=["set_to_none", "zeroed"])
@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CONFIGS)])
def test_fuse_step_bitwise_equals_step(name, kwargs, set_to_none):
    from bagua_torch.contrib import fuse_optimizer

    ref_model, model = _model(), _model()
    ref_opt = _optimizer(ref_model, name, kwargs)
    opt = fuse_optimizer(_optimizer(model, name, kwargs))
    steps = 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every step must fuse: no "stepped unfused" warning
        for step in range(steps):
            _train_step(ref_model, ref_opt, step, False, set_to_none)
            # mostly fuse_step, with plain step() now and then: they share the state
            _train_step(model, opt, step, step % 7 != 3, set_to_none)
    for (n, a), b in zip(ref_model.named_parameters(), model.parameters()):
        assert torch.equal(a, b), f"{name} {kwargs}: parameter {n} differs"
    fused_steps = sum(1 for s in range(steps) if s % 7 != 3)
    assert opt._bagua_fused_count == 2 * fused_steps  # both groups fused at every fuse_step
    for a, b in zip(ref_model.parameters(), model.parameters()):
        sa, sb = ref_opt.state[a], opt.state[b]
        assert sa.keys() == sb.keys()
        for k in sa:
            va, vb = sa[k], sb[k]
            assert torch.equal(torch.as_tensor(va), torch.as_tensor(vb)), f"state {k} differs"


def test_calculate_mutual_groups():
    """The original's helper: index groups contiguous in every list (memory order)."""
    from bagua.torch_api.contrib.fuse.optimizer import calculate_mutual_groups

    flat, other = torch.zeros(10), torch.zeros(2)
    a, b, d = flat[0:3], flat[3:5], flat[5:10]
    params = [a, other, d, b]
    assert calculate_mutual_groups([params]) == [[0, 3, 2]]
    g = torch.zeros(5)
    grads_ab = [g[0:3], torch.zeros(2), torch.zeros(5), g[3:5]]  # only a and b back to back
    assert calculate_mutual_groups([params, grads_ab]) == []
    g2 = torch.zeros(10)
    grads_same = [g2[0:3], torch.zeros(2), g2[5:10], g2[3:5]]
    assert calculate_mutual_groups([params, grads_same]) == [[0, 3, 2]]
    assert calculate_mutual_groups([]) == []
    with pytest.raises(ValueError, match="equal lengths"):
        calculate_mutual_groups([params, params[:2]])


def test_weights_are_flattened_and_state_is_views():
    from bagua_torch.contrib import fuse_optimizer

    model = _model()
    opt = fuse_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    params = list(model.parameters())
    assert all(a.data_ptr() + a.numel() * 4 == b.data_ptr() for a, b in zip(params, params[1:]))
    _train_step(model, opt, 0, True, True)
    avgs = [opt.state[p]["exp_avg"] for p in params]
    assert all(a.data_ptr() + a.numel() * 4 == b.data_ptr() for a, b in zip(avgs, avgs[1:]))
    assert opt.state[params[0]]["step"] is not opt.state[params[1]]["step"]  # scalars are not shared


def test_without_flatten_nothing_moves_and_results_match():
    from bagua_torch.contrib import fuse_optimizer

    ref_model, model = _model(), _model()
    ptrs = [p.data_ptr() for p in model.parameters()]
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.01, momentum=0.9)
    opt = fuse_optimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), do_flatten=False)
    for step in range(10):
        _train_step(ref_model, ref_opt, step, False, True)
        _train_step(model, opt, step, True, True)
    assert [p.data_ptr() for p in model.parameters()] == ptrs
    assert opt._bagua_fused_count == 0  # separate allocations: nothing to fuse, same numbers
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_lr_scheduler_and_closure_and_hooks():
    from bagua_torch.contrib import fuse_optimizer

    ref_model, model = _model(), _model()
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.5)
    opt = fuse_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 3, gamma=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5)
    calls = []
    opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))
    x = torch.randn(4, 6)

    def closure_for(m, o):
        def closure():
            o.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            return loss

        return closure

    for _ in range(10):
        ref_loss = ref_opt.step(closure_for(ref_model, ref_opt))
        loss = opt.fuse_step(closure_for(model, opt))
        assert torch.equal(ref_loss, loss)
        ref_sched.step()
        sched.step()
    assert calls == ["pre", "post"] * 10
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_state_dict_round_trip_keeps_results_bitwise():
    from bagua_torch.contrib import fuse_optimizer

    ref_model, model = _model(), _model()
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=1e-3, amsgrad=True)
    opt = fuse_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=True))
    for step in range(20):
        if step == 10:  # state replaced by new tensors: fuse_step must notice and re-fuse
            opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        _train_step(ref_model, ref_opt, step, False, False)
        _train_step(model, opt, step, True, False)
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert opt._bagua_fused_count == 20


def test_bad_input():
    from bagua_torch.contrib import fuse_optimizer

    opt = fuse_optimizer(torch.optim.SGD(_model().parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="already fused"):
        fuse_optimizer(opt)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        fuse_optimizer(_model())


def test_unfusable_layout_warns_once_and_still_matches():
    from bagua_torch.contrib import fuse_optimizer

    ref_model, model = _model(), _model()
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=1e-3)
    opt = fuse_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    first = next(model.parameters())
    first.data = first.data.clone()  # someone re-points a weight: it leaves the flat buffer
    with pytest.warns(RuntimeWarning, match="stepped unfused"):
        for step in range(5):
            _train_step(ref_model, ref_opt, step, False, True)
            _train_step(model, opt, step, True, True)
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- with a wrapped model


WRAPPED_CASES = [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("Adam", dict(lr=1e-3, amsgrad=True)),
    ("RMSprop", dict(lr=1e-3, centered=True, momentum=0.9)),
]


def _wrapped_worker():
    import bagua_torch
    from bagua_torch.algorithms import GradientAllReduceAlgorithm
    from bagua_torch.contrib import fuse_optimizer
    from tests.harness.worker import run_cases

    torch.set_num_threads(1)
    group = bagua_torch.init_process_group()
    rank = group.rank

    def train_side_by_side(models, opts, steps, fuse_every):
        """The unfused and the fused pair on the same batches, the fused one
        calling fuse_step every ``fuse_every`` steps (step otherwise); asserts
        they end bitwise equal."""
        for step in range(steps):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
            for fused, (m, o) in enumerate(zip(models, opts)):
                o.zero_grad()
                torch.nn.functional.mse_loss(m(x), y).backward()
                (o.fuse_step if fused and step % fuse_every == 0 else o.step)()
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            assert torch.equal(a, b), "fused and unfused training differ"

    def case(name, kwargs, bagua_flattens):
        def run():
            models, opts = [], []
            for fused in (False, True):
                m = _model(seed=rank)  # different per rank: with_bagua broadcasts rank 0's
                o = _optimizer(m, name, kwargs)
                if fused:
                    o = fuse_optimizer(o)
                m = m.with_bagua([o], GradientAllReduceAlgorithm(), do_flatten=bagua_flattens)
                models.append(m)
                opts.append(o)
            train_side_by_side(models, opts, 100, fuse_every=1)
            if not bagua_flattens:  # the gradients this module flattened stay put: every group fuses
                assert opts[1]._bagua_fused_count == 200, opts[1]._bagua_fused_count
            flat = torch.cat([p.detach().reshape(-1) for p in models[1].parameters()])
            allv = bagua_torch.allgather(flat)
            assert all(torch.equal(allv[r], flat) for r in range(group.size)), "ranks differ"

        return run

    def counted(algorithm, fuse_first, opt_flattens, bagua_flattens):
        """Bagua 0.9.2's counts: fused groups only when this module flattens
        and with_bagua does not; the same numbers as unfused in every case."""
        from bagua_torch.algorithms import DecentralizedAlgorithm

        def run():
            models, opts = [], []
            for fused in (False, True):
                m = _model(seed=rank)
                o = _optimizer(m, "SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01))
                alg = GradientAllReduceAlgorithm() if algorithm == "allreduce" else DecentralizedAlgorithm()
                if fused and fuse_first:
                    o = fuse_optimizer(o, do_flatten=opt_flattens)
                m = m.with_bagua([o], alg, do_flatten=bagua_flattens)
                if fused and not fuse_first:
                    o = fuse_optimizer(o, do_flatten=opt_flattens)
                models.append(m)
                opts.append(o)
            train_side_by_side(models, opts, 20, fuse_every=2)
            want = 2 * 10 if opt_flattens and not bagua_flattens else 0  # 2 groups, 10 fuse_steps
            assert opts[1]._bagua_fused_count == want, (opts[1]._bagua_fused_count, want)
            for m in models:
                m.bagua_ddp.close()

        return run

    def qadam():
        """Bagua 0.9.2's QAdam case: wrap (do_flatten=False), then fuse
        (do_flatten=True), fuse_step and step alternating over 101 steps. The
        momentum lives in the engine's state, in bucket order; the weights
        follow it, so the one group fuses at each of the 51 fuse_steps (the
        original's test expected 102, two per fuse_step, from a QAdamOptimizer
        built with one group, and was disabled)."""
        from bagua_torch.algorithms import QAdamAlgorithm, QAdamOptimizer

        models, opts = [], []
        for fused in (False, True):
            m = _model(seed=rank)
            o = QAdamOptimizer(m.parameters(), lr=1e-2, warmup_steps=20)
            m = m.with_bagua([o], QAdamAlgorithm(o), do_flatten=False)
            if fused:
                o = fuse_optimizer(o, do_flatten=True)
            models.append(m)
            opts.append(o)
        train_side_by_side(models, opts, 101, fuse_every=2)
        assert opts[1]._bagua_fused_count == 51, opts[1]._bagua_fused_count
        for m in models:
            m.bagua_ddp.close()

    cases = [
        (f"{n}-{'bagua' if bf else 'fuse'}_flattens", case(n, k, bf)) for n, k in WRAPPED_CASES for bf in (False, True)
    ]
    cases.append(("qadam-wrap_first-opt1-bagua0", qadam))
    cases += [
        (f"count-{a}-{'fuse_first' if ff else 'wrap_first'}-opt{int(of)}-bagua{int(bf)}", counted(a, ff, of, bf))
        for a in ("allreduce", "decentralized")
        for ff in (True, False)
        for of in (True, False)
        for bf in (True, False)
    ]
    sys.exit(1 if run_cases(cases) else 0)


@pytest.mark.parametrize("world", [2, 3])
def test_fused_optimizer_with_wrapped_model(world):
    with warnings.catch_warnings():
        run = launch(os.path.abspath(__file__), world, timeout=240, args=["wrapped"])
    run.check()
    for n, _ in WRAPPED_CASES:
        for who in ("fuse", "bagua"):
            run.check_case(f"{n}-{who}_flattens", world)
    for a in ("allreduce", "decentralized"):
        for first in ("fuse_first", "wrap_first"):
            for of in (1, 0):
                for bf in (1, 0):
                    run.check_case(f"count-{a}-{first}-opt{of}-bagua{bf}", world)
    run.check_case("qadam-wrap_first-opt1-bagua0", world)


if __name__ == "__main__" and sys.argv[1:] == ["wrapped"]:
    _wrapped_worker()
