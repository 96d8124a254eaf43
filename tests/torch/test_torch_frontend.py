"""bagua_torch's frontend behaviour across real processes: communication
primitives on torch tensors, overlap of communication with backward,
no_sync() accumulation, algorithm switching, buffer and optimizer-state
broadcasts, rejected models (differing across ranks, sparse gradients),
unused parameters, zero_grad placements, the DDP-style wrapper.

References are torch DDP (gloo, in the same processes) and plain arithmetic.
One multi-process session per configuration runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

from tests.harness.mp import session_tests
from tests.harness.torch_worker import TorchWorker, worker_main as run_worker

SESSIONS = {"w2": 2, "w3": 3}

COMMON = [
    "differing_shapes_rejected",
    "differing_names_rejected",
    "differing_dtypes_rejected",
    "sparse_gradients_rejected",
    "buffers_broadcast_before_each_forward",
    "find_unused_parameters_equals_ddp",
    "unused_parameter_without_find_unused_raises",
]
W2_ONLY = [
    "primitives_on_torch_tensors",
    "first_bucket_communicates_before_backward_ends",
    "no_sync_accumulation_equals_ddp",
    "no_sync_decentralized_does_not_communicate",
    "algorithm_switching",
    "optimizer_state_broadcast",
    "zero_grad_placements_equal_ddp",
    "ddp_wrapper_and_core_descriptions",
    "mixed_dtypes_equal_ddp",
]
W3_ONLY = ["subgroup_trains_alone"]


def case_names(session: str):
    return (W2_ONLY if session == "w2" else W3_ONLY) + COMMON


# ---------------------------------------------------------------- worker side


class Worker(TorchWorker):
    def loss(self, model, step):
        x, y = self.batch(step)
        return self.nn.functional.cross_entropy(model(x), y)

    # -- primitives --
    def primitives_on_torch_tensors(self):
        torch, bt, r, n = self.torch, self.bt, self.rank, self.world
        x = torch.arange(4, dtype=torch.float32) + r
        total = sum(torch.arange(4, dtype=torch.float32) + k for k in range(n))
        out = bt.allreduce(x)
        assert isinstance(out, torch.Tensor) and torch.equal(out, total), out
        avg = torch.empty(4)
        assert bt.allreduce(x, avg, op=bt.ReduceOp.AVG) is avg and torch.allclose(avg, total / n)
        y = x.clone().requires_grad_()  # used through .detach(): same memory
        bt.allreduce_inplace(y)
        assert torch.equal(y.detach(), total)
        g = bt.allgather(x)
        assert g.shape == (n, 4) and torch.equal(g[1], torch.arange(4.0) + 1)
        b = torch.full((3,), float(r))
        bt.broadcast(b, src=1)
        assert torch.equal(b, torch.ones(3))
        assert bt.broadcast_object({"rank": r}, src=1) == {"rank": 1}
        rs = bt.reduce_scatter(torch.ones(2 * n) * (r + 1))
        assert torch.equal(rs, torch.full((2,), float(sum(range(1, n + 1)))))
        a2a = bt.alltoall(torch.arange(n, dtype=torch.int64) + 10 * r)
        assert a2a.tolist() == [10 * k + r for k in range(n)], a2a
        red = bt.reduce(x, dst=0, op=bt.ReduceOp.MAX)
        if r == 0:
            assert torch.equal(red, torch.arange(4.0) + n - 1)
        if r == 0:
            bt.send(torch.tensor([7, 8], dtype=torch.int32), dst=1)
        elif r == 1:
            got = torch.zeros(2, dtype=torch.int32)
            bt.recv(got, src=0)
            assert got.tolist() == [7, 8]
        sc = torch.empty(2)
        bt.scatter(torch.arange(2.0 * n) if r == 0 else None, sc, src=0)
        assert sc.tolist() == [2.0 * r, 2.0 * r + 1]
        bt.barrier()
        assert bt.get_world_size() == n and bt.get_rank() == r and bt.get_local_size() == n
        self.expect_error(ValueError, lambda: bt.allreduce_inplace(torch.zeros(3, 4).t()), "contiguous")

    # -- overlap --
    def first_bucket_communicates_before_backward_ends(self):
        import time

        torch, nn = self.torch, self.nn

        class SlowBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                time.sleep(0.3)  # backward of the first layers takes a while
                return g

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.l1, self.l2, self.l3 = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 4)

            def forward(self, x):
                return self.l3(torch.relu(self.l2(SlowBackward.apply(torch.relu(self.l1(x))))))

        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        first_layer_grad = []
        model.l1.weight.register_post_accumulate_grad_hook(lambda p: first_layer_grad.append(time.monotonic_ns()))
        ddp = self.bt.DistributedDataParallel(
            model, optimizers=[opt], algorithm=self.A.GradientAllReduceAlgorithm(), bucket_cap_mb=0.0001
        )  # one bucket per tensor
        assert len(ddp.bagua_buckets) == 6 and ddp.bagua_buckets[0].tensor_names == ["l3.bias"]
        for _step in range(2):
            opt.zero_grad()
            ddp(torch.randn(4, 8)).sum().backward()
            backward_end = time.monotonic_ns()
            timings = ddp.inner.engine.timings()
            t_l1 = first_layer_grad[-1]
            first = timings[0]
            assert 0 < first.launch_ns < t_l1, (timings, t_l1)
            assert 0 < first.end_ns < t_l1, "the first bucket did not finish while backward still ran"
            assert all(0 < t.end_ns <= backward_end for t in timings), "backward returned before communication ended"
            opt.step()
        ddp.close()

    # -- no_sync --
    def no_sync_accumulation_equals_ddp(self):
        torch = self.torch
        model = self.mlp(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ddp = self.bt.DistributedDataParallel(model, optimizers=[opt])
        ref = torch.nn.parallel.DistributedDataParallel(self.mlp(1))
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for it in range(4):
            for wrapped, o in ((ddp, opt), (ref, ropt)):
                o.zero_grad()
                with wrapped.no_sync():
                    for micro in range(2):
                        self.loss(wrapped, 3 * it + micro).backward()
                self.loss(wrapped, 3 * it + 2).backward()
                o.step()
        assert ddp.inner.engine.steps == 4
        self.close_to(self.flat(model), self.flat(ref.module))
        self.same_everywhere(self.flat(model))
        ddp.close()

    def no_sync_decentralized_does_not_communicate(self):
        torch = self.torch
        model = self.mlp(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ddp = self.bt.DistributedDataParallel(
            model, optimizers=[opt], algorithm=self.A.DecentralizedAlgorithm(hierarchical=False)
        )
        engine = ddp.inner.engine
        for it in range(3):
            opt.zero_grad()
            before = engine.launches
            with ddp.no_sync():
                self.loss(ddp, 2 * it).backward()
            assert engine.launches == before, "no_sync() communicated"
            self.loss(ddp, 2 * it + 1).backward()
            assert engine.launches == before + 1
            opt.step()
        assert ddp.bagua_algorithm.step == 3
        ddp.close()

    # -- switching --
    def algorithm_switching(self):
        torch = self.torch
        model = self.mlp(10 + self.rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step = 0
        algos = [
            self.A.GradientAllReduceAlgorithm(),
            self.A.ByteGradAlgorithm(),
            self.A.DecentralizedAlgorithm(hierarchical=False),
            self.A.GradientAllReduceAlgorithm(hierarchical=True),
        ]
        engines = []
        for algo in algos:
            model.with_bagua([opt], algo)
            engines.append(model.bagua_ddp.engine)
            assert model.bagua_ddp.algorithm == algo
            for p in model.parameters():
                assert len(p._post_accumulate_grad_hooks) == 1, "old hooks were not removed"
            assert len(model._forward_pre_hooks) == 1
            self.same_everywhere(self.flat(model))  # rank 0's weights at every switch
            for _ in range(3):
                opt.zero_grad()
                loss = self.loss(model, step)
                loss.backward()
                opt.step()
                step += 1
                assert torch.isfinite(loss)
            if isinstance(algo, self.A.DecentralizedAlgorithm):
                b = model.bagua_buckets[0]
                lo, hi = b.flat_view().address, b.flat_view().address + b.nbytes
                assert all(lo <= p.data_ptr() < hi for p in model.parameters()), "weights are not bucket views"
        self.same_everywhere(self.flat(model))
        assert [e.steps for e in engines] == [3, 3, 3, 3]
        model.bagua_ddp.close()

    # -- broadcasts --
    def buffers_broadcast_before_each_forward(self):
        torch, nn = self.torch, self.nn
        for broadcast in (True, False):
            torch.manual_seed(self.rank)  # buffers differ per rank before wrapping
            model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
            model[1].running_mean.uniform_()
            seen = []
            model[1].register_forward_pre_hook(lambda m, i: seen.append(m.running_mean.clone()))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ddp = self.bt.DistributedDataParallel(model, optimizers=[opt], broadcast_buffers=broadcast)
            self.same_everywhere(model[1].running_mean)  # at wrap time, always
            for step in range(3):
                opt.zero_grad()
                self.loss(ddp, step).backward()
                opt.step()
            assert int(model[1].num_batches_tracked) == 3
            allv = self.gathered(seen[-1])
            equal = all(torch.equal(allv[r], seen[-1]) for r in range(self.world))
            assert equal == broadcast, f"broadcast_buffers={broadcast} but buffers equal across ranks: {equal}"
            ddp.close()

    def optimizer_state_broadcast(self):
        torch = self.torch
        model = self.mlp(20 + self.rank)
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (self.rank + 1), betas=(0.8, 0.99))
        for step in range(2 + self.rank):  # local training: state differs per rank
            opt.zero_grad()
            self.loss(model, step).backward()
            opt.step()
        model.with_bagua([opt], self.A.GradientAllReduceAlgorithm())
        assert opt.param_groups[0]["lr"] == 0.01
        for p in model.parameters():
            st = opt.state[p]
            assert float(st["step"]) == 2.0, st["step"]
            self.same_everywhere(st["exp_avg"])
            self.same_everywhere(st["exp_avg_sq"])
        self.same_everywhere(self.flat(model))
        opt.zero_grad()
        self.loss(model, 9).backward()
        opt.step()
        self.same_everywhere(self.flat(model))
        model.bagua_ddp.close()

    # -- rejected models --
    def _rejected(self, build_mine, *needles):
        torch = self.torch
        odd = self.world - 1  # the last rank differs
        model = build_mine(self.rank == odd)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        e = self.expect_error(
            ValueError, lambda: model.with_bagua([opt], self.A.GradientAllReduceAlgorithm()), f"rank {odd}", *needles
        )
        assert "differs across ranks" in str(e)
        assert "bagua_ddp" not in model.__dict__

    def differing_shapes_rejected(self):
        self._rejected(lambda odd: self.mlp(0, hidden=17 if odd else 16), "'0.weight'", "(17, 4)", "(16, 4)")

    def differing_names_rejected(self):
        nn = self.nn

        def build(odd):
            m = nn.Sequential()
            m.add_module("second" if odd else "first", nn.Linear(4, 3))
            return m

        self._rejected(build, "'first.weight'", "'second.weight'")

    def differing_dtypes_rejected(self):
        self._rejected(lambda odd: self.mlp(0).double() if odd else self.mlp(0), "torch.float64", "torch.float32")

    def sparse_gradients_rejected(self):
        nn = self.nn
        model = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2))
        opt = self.torch.optim.SGD(model.parameters(), lr=0.1)
        self.expect_error(
            ValueError, lambda: model.with_bagua([opt], self.A.GradientAllReduceAlgorithm()), "sparse", "Embedding"
        )

    # -- unused parameters --
    def _branchy(self):
        torch, nn = self.torch, self.nn
        rank = self.rank

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(3)
                self.a, self.b, self.never = nn.Linear(4, 3), nn.Linear(4, 3), nn.Linear(4, 3)

            def forward(self, x):
                out = self.a(x)
                return out + self.b(x) if rank == 0 else out  # b used on rank 0 only

        return Net()

    def find_unused_parameters_equals_ddp(self):
        torch = self.torch
        model = self._branchy()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ddp = self.bt.DistributedDataParallel(model, optimizers=[opt], find_unused_parameters=True)
        ref = torch.nn.parallel.DistributedDataParallel(self._branchy(), find_unused_parameters=True)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(4):
            for wrapped, o in ((ddp, opt), (ref, ropt)):
                o.zero_grad()
                self.loss(wrapped, step).backward()
                o.step()
        self.close_to(self.flat(model), self.flat(ref.module))
        self.same_everywhere(self.flat(model))
        ddp.close()

    def unused_parameter_without_find_unused_raises(self):
        import time

        torch = self.torch
        model = self._branchy()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ddp = self.bt.DistributedDataParallel(model, optimizers=[opt])
        for step in range(2):
            opt.zero_grad()
            t0 = time.monotonic()
            self.expect_error(
                RuntimeError, lambda: self.loss(ddp, step).backward(), "'never.weight'", "find_unused_parameters=True"
            )
            assert time.monotonic() - t0 < 10, "took a timeout to notice"
        ddp.close()

    # -- zero_grad placements --
    def zero_grad_placements_equal_ddp(self):
        torch = self.torch
        model = self.mlp(5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model.with_bagua([opt], self.A.GradientAllReduceAlgorithm())
        ref = torch.nn.parallel.DistributedDataParallel(self.mlp(5))
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for step in range(6):
            for wrapped, o in ((model, opt), (ref, ropt)):
                if step % 3 == 0:  # before forward, set_to_none (the default)
                    o.zero_grad()
                    loss = self.loss(wrapped, step)
                elif step % 3 == 1:  # between forward and backward
                    loss = self.loss(wrapped, step)
                    o.zero_grad()
                else:  # zeroed in place
                    o.zero_grad(set_to_none=False)
                    loss = self.loss(wrapped, step)
                loss.backward()
                o.step()
        self.close_to(self.flat(model), self.flat(ref.module))
        self.same_everywhere(self.flat(model))
        model.bagua_ddp.close()

    # -- the DDP-style wrapper and framework-neutral descriptions --
    def ddp_wrapper_and_core_descriptions(self):
        torch = self.torch
        from bagua_core import algorithms as core

        model = self.mlp(6)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ddp = self.bt.DistributedDataParallel(model, optimizers=[opt], algorithm=core.ByteGrad(hierarchical=False))
        assert isinstance(ddp.bagua_algorithm.algorithm, self.A.ByteGradAlgorithm)
        assert ddp.bagua_buckets[0].numel % self.world == 0
        for step in range(3):
            opt.zero_grad()
            self.loss(ddp, step).backward()
            opt.step()
        self.same_everywhere(self.flat(model))
        ddp.close()
        model.with_bagua([opt], core.Decentralized(hierarchical=False, communication_interval=2))
        assert model.bagua_algorithm.algorithm.to_core() == core.Decentralized(False, "all", 2)
        model.bagua_ddp.close()

    def mixed_dtypes_equal_ddp(self):
        torch, nn = self.torch, self.nn

        class Mixed(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(8)
                self.a, self.b = nn.Linear(4, 6).double(), nn.Linear(6, 3)

            def forward(self, x):
                return self.b(torch.relu(self.a(x.double())).float())

        build = Mixed

        def loss(model, step):
            x, y = self.batch(step)
            return nn.functional.cross_entropy(model(x), y)

        for algo in (self.A.GradientAllReduceAlgorithm(), self.A.DecentralizedAlgorithm(hierarchical=False)):
            model = build()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ddp = self.bt.DistributedDataParallel(model, optimizers=[opt], algorithm=algo)
            assert sorted(b.dtype.name for b in ddp.bagua_buckets) == ["float32", "float64"], ddp.bagua_buckets
            for step in range(4):
                opt.zero_grad()
                loss(ddp, step).backward()
                opt.step()
            if isinstance(algo, self.A.GradientAllReduceAlgorithm):
                ref = torch.nn.parallel.DistributedDataParallel(build())
                ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
                for step in range(4):
                    ropt.zero_grad()
                    loss(ref, step).backward()
                    ropt.step()
                for p, q in zip(model.parameters(), ref.module.parameters()):
                    assert p.dtype == q.dtype
                    self.close_to(p.detach(), q.detach())
            ddp.close()

    def subgroup_trains_alone(self):
        torch = self.torch
        members = [0, 2]
        group = self.bt.new_group(members)  # every rank creates it, in the same order
        if self.rank not in members:
            return
        model = self.mlp(30 + self.rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.with_bagua([opt], self.A.ByteGradAlgorithm(), process_group=group)
        assert model.bagua_buckets[0].numel % 2 == 0
        for step in range(3):
            opt.zero_grad()
            self.loss(model, step).backward()
            opt.step()
        flat = self.flat(model)
        allv = self.bt.allgather(flat, comm=group)
        assert allv.shape[0] == 2 and torch.equal(allv[0], allv[1])
        model.bagua_ddp.close()


def worker_main():
    run_worker(Worker, case_names)


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(__file__, SESSIONS, case_names)

if __name__ == "__main__":
    worker_main()
