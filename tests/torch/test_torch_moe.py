"""Mixture of experts with expert parallelism (bagua_torch.moe, Bagua 0.9.2's
``model_parallel.moe``).

- The gate against a numpy reference written token by token
  (tests/harness/reference/moe_gating.py): choices, capacity and which
  tokens an over-full expert drops (the noise is replayed), slots, weights,
  the load-balancing loss and the expert counts, top-1 and top-2.
- On 2, 3 and 4 processes over the engine's all-to-all: output, input
  gradient, expert gradients and gate gradient against a single-process
  reference holding every expert of the job (each token's output is the
  gate-weighted sum of its experts applied to it), top-1 and top-2, one and
  two experts per rank, with tokens dropped, and with ranks holding
  different numbers of tokens.
- Training through with_bagua: GradientAllReduce against a reference
  (non-expert gradients averaged over the ranks, expert gradients summed),
  ByteGrad (experts stay per rank, the rest equal everywhere).
- Bagua 0.9's checkpoint layout (per-expert files, per-rank optimizer
  files) round-trips; a checkpoint of another number of experts is refused.
- Bad arguments, and a rank whose layer differs: ValueError on every rank
  at construction.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.harness.mp import session_tests
from tests.harness.reference import moe_gating as ref
from tests.harness.torch_worker import TorchWorker, worker_main

# ---------------------------------------------------------------- the gate, one process


@pytest.mark.parametrize("s,e,factor,min_cap", [(16, 4, 1.0, 4), (16, 4, 0.5, 1), (7, 3, 2.0, 0), (9, 5, 1.0, 4)])
@pytest.mark.parametrize("with_used", [False, True])
def test_top1_gating_against_numpy(s, e, factor, min_cap, with_used):
    import torch

    from bagua_torch.moe import gating

    g = torch.Generator().manual_seed(s * 100 + e)
    logits = torch.randn(s, e, generator=g) * 2
    noise = torch.rand(s, e, generator=g)
    routing = logits + torch.randn(s, e, generator=g)
    used = (torch.rand(s, generator=g) > 0.3).long() if with_used else None
    cap = gating.capacity(s, e, 1, factor, min_cap)
    assert cap == ref.capacity(s, e, 1, factor, min_cap)
    for r in (None, routing):
        out = gating.top1gating(logits, cap, used, selection_noise=noise, routing_logits=r)
        l_aux, combine, counts = ref.top1(
            logits.numpy(),
            cap,
            None if used is None else used.numpy(),
            noise.numpy(),
            None if r is None else r.numpy(),
        )
        np.testing.assert_allclose(out.combine_weights.numpy(), combine, atol=1e-6)
        assert np.array_equal(out.dispatch_mask.numpy(), combine > 0)
        assert np.array_equal(out.exp_counts.numpy(), counts) and out.exp_counts.device.type == "cpu"
        assert abs(float(out.l_aux) - l_aux) < 1e-5
    if factor < 1:  # some expert was over-full: its extra tokens were dropped
        assert int((out.dispatch_mask.sum(dim=(1, 2)) == 0).sum()) > (0 if used is None else int((used == 0).sum()))


@pytest.mark.parametrize("s,e,factor", [(16, 4, 1.0), (16, 4, 0.5), (7, 3, 2.0), (12, 6, 0.75)])
@pytest.mark.parametrize("with_used", [False, True])
def test_top2_gating_against_numpy(s, e, factor, with_used):
    import torch

    from bagua_torch.moe import gating

    g = torch.Generator().manual_seed(s * 10 + e)
    logits = torch.randn(s, e, generator=g) * 2
    noise = torch.randn(s, e, generator=g)
    used = (torch.rand(s, generator=g) > 0.3).long() if with_used else None
    cap = gating.capacity(s, e, 2, factor, 4)
    out = gating.top2gating(logits, cap, used, second_noise=noise)
    l_aux, combine, counts = ref.top2(logits.numpy(), cap, noise.numpy(), None if used is None else used.numpy())
    np.testing.assert_allclose(out.combine_weights.numpy(), combine, atol=1e-6)
    assert np.array_equal(out.dispatch_mask.numpy(), combine > 0)
    assert np.array_equal(out.exp_counts.numpy(), counts)
    assert abs(float(out.l_aux) - l_aux) < 1e-5


def test_one_process_layer_and_bad_arguments():
    import torch

    from bagua_torch.moe import MoE

    torch.manual_seed(0)
    layer = MoE(8, torch.nn.Linear(8, 8), num_local_experts=3, k=2, output_dropout_prob=0.1)
    x = torch.randn(4, 5, 8, requires_grad=True)
    y, l_aux, counts = layer(x)
    y.sum().backward()
    assert y.shape == x.shape and l_aux.requires_grad and int(counts.sum()) == 20 and x.grad is not None
    assert all(getattr(p, "expert", False) for p in layer.bagua_moe.experts.parameters())
    assert not getattr(layer.bagua_moe.gate.wg.weight, "expert", False)
    for kwargs, needle in (
        (dict(k=3), "k must be 1 or 2"),
        (dict(num_local_experts=0), "num_local_experts must be an integer >= 1"),
        (dict(capacity_factor=0), "capacity_factor must be a number > 0"),
        (dict(eval_capacity_factor=-1.0), "eval_capacity_factor must be a number > 0"),
        (dict(noisy_gate_policy="Gaussian"), "noisy_gate_policy"),
        (dict(output_dropout_prob=1.0), "output_dropout_prob"),
        (dict(expert=torch.nn.Linear(6, 6)), "does not take inputs of hidden_size 8"),
        (dict(expert=torch.nn.Linear(8, 6)), "must map [..., 8] to [..., 8]"),
        (dict(expert="linear"), "expert must be a torch.nn.Module"),
    ):
        args = dict(hidden_size=8, expert=torch.nn.Linear(8, 8))
        args.update(kwargs)
        with pytest.raises(ValueError, match=None) as info:
            MoE(**args)
        assert needle in str(info.value), (needle, info.value)
    with pytest.raises(ValueError, match="used_token must hold one value per token"):
        MoE(8, torch.nn.Linear(8, 8))(torch.randn(6, 8), torch.ones(5))


# ---------------------------------------------------------------- several processes

CASES = [
    "top1_one_expert_per_rank",
    "top1_two_experts_per_rank_tokens_dropped",
    "top2_one_expert_per_rank",
    "top2_two_experts_per_rank_tokens_dropped",
    "top1_jitter_and_rsample",
    "ranks_with_different_token_counts",
    "train_gradient_allreduce_against_reference",
    "train_bytegrad_experts_stay_per_rank",
    "train_qadam_experts_update_their_own_momentum",
    "checkpoint_round_trip",
    "a_rank_whose_layer_differs",
]

M = 6  # model dimension


class Worker(TorchWorker):
    def __init__(self):
        super().__init__()
        from bagua_torch.moe import MoE, TopKGate

        self.MoE, self.TopKGate = MoE, TopKGate

    # -- the job's experts, the same on every rank, and this rank's layer holding its share
    def expert(self):
        torch = self.torch
        return torch.nn.Sequential(torch.nn.Linear(M, 5), torch.nn.Tanh(), torch.nn.Linear(5, M))

    def job(self, local, k, **kw):
        """(layer with this rank's experts, every expert of the job, the gate's weight)."""
        torch = self.torch
        torch.manual_seed(7)
        everyone = [self.expert() for _ in range(local * self.world)]
        layer = self.MoE(M, self.expert(), num_local_experts=local, k=k, **kw)
        with torch.no_grad():
            for j, mine in enumerate(layer.bagua_moe.experts.bagua_experts):
                for a, b in zip(mine.parameters(), everyone[self.rank * local + j].parameters()):
                    a.copy_(b)
        return layer, everyone, layer.bagua_moe.gate.wg.weight.detach().clone()

    def tokens(self, r, n=12, step=0):
        g = self.torch.Generator().manual_seed(1000 * step + r)
        return self.torch.randn(n, M, generator=g), self.torch.randn(n, M, generator=g)

    def reference(self, everyone, gate_weight, k, x, cap, seed, training=True, **gate_kw):
        """One rank's tokens through every expert of the job in one process:
        output_t = sum_e w_te * expert_e(x_t), w the gate's combine weights
        (the gate replays the rank's noise: same seed, same draws)."""
        torch = self.torch
        gate = self.TopKGate(M, len(everyone), k, **gate_kw)
        gate.train(training)
        with torch.no_grad():
            gate.wg.weight.copy_(gate_weight)
        gate.wg.weight.requires_grad_(True)
        torch.manual_seed(seed)
        gating = gate(x, None, cap)
        w = gating.combine_weights.sum(dim=2)  # [S, E]
        out = sum(w[:, e : e + 1] * everyone[e](x) for e in range(len(everyone)))
        return out, gating, gate.wg.weight

    def forward_backward(self, local, k, factor=4.0, counts=None, **kw):
        torch = self.torch
        n = [12] * self.world if counts is None else counts
        layer, everyone, gate_w = self.job(local, k, capacity_factor=factor, min_capacity=0, **kw)
        x, up = self.tokens(self.rank, n[self.rank])
        x.requires_grad_(True)
        torch.manual_seed(50 + self.rank)
        y, l_aux, exp_counts = layer(x)
        ((y * up).sum() + 0.3 * l_aux).backward()
        # the capacity every rank used: the largest of the ranks' own
        cap = max(layer.bagua_moe.gate.capacity(c) for c in n)
        total = 0
        for r in range(self.world):
            xr, ur = self.tokens(r, n[r])
            xr.requires_grad_(True)
            out, gating, wg = self.reference(
                everyone, gate_w, k, xr, cap, 50 + r, capacity_factor=factor, min_capacity=0, **kw
            )
            loss = (out * ur).sum() + 0.3 * gating.l_aux
            if r == self.rank:
                close(y, out, 1e-5, "output")
                close(l_aux, gating.l_aux, 1e-6, "l_aux")
                assert torch.equal(exp_counts, gating.exp_counts), (exp_counts, gating.exp_counts)
                (gx, gw) = torch.autograd.grad(loss, [xr, wg], retain_graph=True)
                close(x.grad, gx, 1e-5, "input gradient")
                close(layer.bagua_moe.gate.wg.weight.grad, gw, 1e-5, "gate gradient (this rank's loss)")
            total = total + loss
        total.backward()
        for j, mine in enumerate(layer.bagua_moe.experts.bagua_experts):
            for (name, a), b in zip(mine.named_parameters(), everyone[self.rank * local + j].parameters()):
                close(a.grad, b.grad, 1e-5, f"expert {self.rank * local + j} {name} gradient (every rank's loss)")
        return layer

    # -- cases
    def top1_one_expert_per_rank(self):
        self.forward_backward(1, 1)

    def top1_two_experts_per_rank_tokens_dropped(self):
        layer = self.forward_backward(2, 1, factor=0.5)
        assert layer.bagua_moe.gate.capacity(12) < 12 / (2 * self.world) + 1

    def top2_one_expert_per_rank(self):
        self.forward_backward(1, 2)

    def top2_two_experts_per_rank_tokens_dropped(self):
        self.forward_backward(2, 2, factor=0.5)

    def top1_jitter_and_rsample(self):
        self.forward_backward(1, 1, noisy_gate_policy="Jitter")
        self.forward_backward(2, 1, factor=0.75, noisy_gate_policy="RSample")

    def ranks_with_different_token_counts(self):
        self.forward_backward(1, 1, factor=1.0, counts=[12, 5, 9, 3][: self.world])

    def model(self, local, seed):
        torch = self.torch
        torch.manual_seed(seed)

        class Net(torch.nn.Module):
            def __init__(net):
                super().__init__()
                net.inp = torch.nn.Linear(4, M)
                net.moe = self.MoE(M, self.expert(), num_local_experts=local, k=2, capacity_factor=4.0)
                net.out = torch.nn.Linear(M, 3)

            def forward(net, x):
                h, l_aux, _ = net.moe(torch.tanh(net.inp(x)))
                return net.out(h), l_aux

        return Net()

    def batch(self, r, step):
        g = self.torch.Generator().manual_seed(500 * step + r)
        return self.torch.randn(10, 4, generator=g), self.torch.randn(10, 3, generator=g)

    def train_gradient_allreduce_against_reference(self):
        """SGD through with_bagua(GradientAllReduce) against one process
        training the whole job: every rank's batch through all the experts;
        non-expert gradients averaged over the ranks, expert gradients summed."""
        torch = self.torch
        local, lr, steps, world = 2, 0.1, 3, self.world
        net = self.model(local, seed=11 + self.rank)  # with_bagua broadcasts rank 0's non-expert weights
        ref = self.model(local, seed=11)
        experts = [e for q in range(world) for e in self.model(local, seed=11 + q).moe.bagua_moe.experts.bagua_experts]
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        wrapped = net.with_bagua([opt], self.bt.algorithms.GradientAllReduceAlgorithm())
        dense = [p for n, p in ref.named_parameters() if "experts" not in n]
        expert_params = [p for e in experts for p in e.parameters()]
        gate = ref.moe.bagua_moe.gate
        for step in range(steps):
            x, y = self.batch(self.rank, step)
            torch.manual_seed(900 + 10 * step + self.rank)
            out, l_aux = wrapped(x)
            opt.zero_grad()
            (torch.nn.functional.mse_loss(out, y) + 0.01 * l_aux).backward()
            opt.step()
            total = 0
            for r in range(world):
                xr, yr = self.batch(r, step)
                h = torch.tanh(ref.inp(xr))
                torch.manual_seed(900 + 10 * step + r)
                gating = gate(h, None, gate.capacity(10))
                w = gating.combine_weights.sum(dim=2)
                moe_out = sum(w[:, e : e + 1] * experts[e](h) for e in range(len(experts)))
                total = total + torch.nn.functional.mse_loss(ref.out(moe_out), yr) + 0.01 * gating.l_aux
            grads = torch.autograd.grad(total, dense + expert_params)
            with torch.no_grad():
                for p, g in zip(dense, grads[: len(dense)]):
                    p -= lr * g / world
                for p, g in zip(expert_params, grads[len(dense) :]):
                    p -= lr * g
        mine = dict(net.named_parameters())
        for n, p in ref.named_parameters():
            if "experts" not in n:
                close(mine[n], p, 1e-5, n)
        for j, e in enumerate(net.moe.bagua_moe.experts.bagua_experts):
            for (n, a), b in zip(e.named_parameters(), experts[self.rank * local + j].parameters()):
                close(a, b, 1e-5, f"expert {self.rank * local + j} {n}")

    def train_bytegrad_experts_stay_per_rank(self):
        torch = self.torch
        net = self.model(2, seed=31 + self.rank)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        wrapped = net.with_bagua([opt], self.bt.algorithms.ByteGradAlgorithm())
        losses = []
        for step in range(12):
            x, y = self.batch(self.rank, step % 3)
            out, l_aux = wrapped(x)
            loss = torch.nn.functional.mse_loss(out, y) + 0.01 * l_aux
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        dense = torch.cat([p.detach().reshape(-1) for n, p in net.named_parameters() if "experts" not in n])
        experts = torch.cat([p.detach().reshape(-1) for p in net.moe.bagua_moe.experts.parameters()])
        every_dense, every_expert = self.bt.allgather(dense), self.bt.allgather(experts)
        assert all(torch.equal(every_dense[r], dense) for r in range(self.world)), "non-expert weights differ"
        assert all(not torch.equal(every_expert[r], experts) for r in range(self.world) if r != self.rank)
        passes = torch.tensor([sum(losses[:3]), sum(losses[9:])])  # the job's loss over the same batches
        self.bt.allreduce_inplace(passes)
        assert passes[1] < passes[0], passes

    def train_qadam_experts_update_their_own_momentum(self):
        """After QAdam's warm-up the engine updates the communicated momentum;
        the experts', which it does not communicate, follow the same rule
        from their own gradient: m = beta1 m + (1 - beta1) g."""
        torch = self.torch
        from bagua_torch.algorithms import QAdamAlgorithm, QAdamOptimizer

        net = self.model(1, seed=51 + self.rank)
        opt = QAdamOptimizer(net.parameters(), lr=1e-2, warmup_steps=3)
        wrapped = net.with_bagua([opt], QAdamAlgorithm(opt))
        experts = list(net.moe.bagua_moe.experts.parameters())
        for step in range(6):
            x, y = self.batch(self.rank, step)
            out, l_aux = wrapped(x)
            opt.zero_grad()
            (torch.nn.functional.mse_loss(out, y) + 0.01 * l_aux).backward()
            before = [opt.state[p]["exp_avg"].clone() if p in opt.state else None for p in experts]
            opt.step()
            if step >= 3:  # past the warm-up
                for p, m in zip(experts, before):
                    close(opt.state[p]["exp_avg"], 0.9 * m + 0.1 * p.grad, 1e-6, "an expert's momentum")
        dense = torch.cat([p.detach().reshape(-1) for n, p in net.named_parameters() if "experts" not in n])
        every = self.bt.allgather(dense)
        assert all(torch.equal(every[r], dense) for r in range(self.world)), "non-expert weights differ"
        net.bagua_ddp.close()
        assert opt.momentum_by_engine is None

    def checkpoint_round_trip(self):
        import glob

        torch = self.torch
        from bagua_torch.checkpoint import load_checkpoint, save_checkpoint

        path = self.shared_tmpdir()
        net = self.model(2, seed=41 + self.rank)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        wrapped = net.with_bagua([opt], self.bt.algorithms.GradientAllReduceAlgorithm())
        for step in range(2):
            x, y = self.batch(self.rank, step)
            out, l_aux = wrapped(x)
            opt.zero_grad()
            torch.nn.functional.mse_loss(out, y).backward()
            opt.step()
        save_checkpoint(3, path, wrapped, opt)
        files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(path, "iter_0000003", "*")))
        want = sorted(
            ["mp_rank_00_model_states.pt"]
            + [f"expert_{g}_mp_rank_00_model_states.pt" for g in range(2 * self.world)]
            + [f"expp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(self.world)]
            + [f"rng_rank_{r}.pt" for r in range(self.world)]
            + [f"manifest_rank_{r}.json" for r in range(self.world)]
        )
        assert files == want, files
        saved = {n: t.detach().clone() for n, t in net.state_dict().items()}
        saved_opt = opt.state_dict()
        fresh = self.model(2, seed=99)
        fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-2)
        assert load_checkpoint(path, fresh, fresh_opt) == 3
        for n, t in fresh.state_dict().items():
            assert torch.equal(t, saved[n]), n
        for pid, st in saved_opt["state"].items():
            for key, v in st.items():
                assert torch.equal(torch.as_tensor(fresh_opt.state_dict()["state"][pid][key]), torch.as_tensor(v)), (
                    pid,
                    key,
                )
        for local in (1, 3):  # another number of experts in the job: refused, naming both counts
            held, wanted = f"holds {2 * self.world} experts", f"this job {local * self.world} "
            self.expect_error(ValueError, lambda: load_checkpoint(path, self.model(local, seed=5)), held, wanted)
        self.bt.barrier()

    def a_rank_whose_layer_differs(self):
        torch = self.torch
        for kwargs, needle in (
            (dict(k=2 if self.rank == self.world - 1 else 1), "the MoE layer differs across ranks"),
            (dict(num_local_experts=0 if self.rank == 1 else 1), "the MoE layer differs across ranks"),
            (dict(k=3), "k must be 1 or 2"),  # invalid on every rank: each says why
        ):
            self.expect_error(ValueError, lambda: self.MoE(M, self.expert(), **kwargs), needle)
        layer = self.MoE(M, self.expert())  # the ranks are still in step
        y, _, _ = layer(torch.randn(8, M))
        assert y.shape == (8, M)


def close(got, want, tol, what):
    import torch

    got, want = got.detach().double(), want.detach().double()
    err = (got - want).abs().max().item() if got.numel() else 0.0
    assert torch.allclose(got, want, rtol=tol, atol=tol), f"{what}: max abs difference {err:.3g}"


def case_names(session):
    return CASES


test_case, test_session_exits_cleanly = session_tests(
    __file__, {"w2": 2, "w3": 3, "w4": 4}, case_names, timeout=240, test_timeout=300
)

if __name__ == "__main__":
    worker_main(Worker, case_names)
