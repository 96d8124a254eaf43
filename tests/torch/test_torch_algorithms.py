"""bagua_torch's algorithms trained across real processes against independent
references written with torch.distributed (gloo, in the same processes):

* GradientAllReduce == torch DDP after 20 steps (flat, no flatten, and
  hierarchical with 4 processes as 2 nodes); weights bitwise equal across ranks;
* ByteGrad == a reference of the MinMaxUInt8 scatter-reduce-gather built from
  the numpy compressor in tests/harness/reference and torch.distributed all_gather, at
  group sizes 2, 3 and 4, buckets not a multiple of the group size, several
  buckets;
* Decentralized == a D-PSGD reference ("all"; "shift_one" with interval 1 and
  2, the peer formula written out here); shift_one with 3 peers refused;
* the loss goes down on a small classification task with every algorithm
  (their default settings).

One multi-process session per configuration runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import sys

from tests.harness.mp import Session, session_tests

# session -> (world size, local world size)
SESSIONS = {
    "w2": (2, None),
    "w3": (3, None),
    "w4n2": (4, 2),
}

LOSS_DOWN = ["loss_goes_down_gradient_allreduce", "loss_goes_down_bytegrad", "loss_goes_down_decentralized"]


def case_names(session: str):
    world, local = SESSIONS[session]
    names = [
        "gradient_allreduce_equals_ddp",
        "bytegrad_equals_reference",
        "bytegrad_several_buckets_equal_reference",
        "decentralized_all_equals_reference",
    ]
    if session == "w2":
        names += ["gradient_allreduce_no_flatten_equals_ddp", "decentralized_no_flatten_equals_reference"]
    if world % 2 == 0:
        names += [
            "decentralized_shift_one_interval_1_equals_reference",
            "decentralized_shift_one_interval_2_equals_reference",
        ]
    else:
        names += ["shift_one_odd_peers_refused"]
    if local:
        names += ["hierarchical_gradient_allreduce_equals_ddp", "loss_goes_down_decentralized_hierarchical_shift_one"]
    return names + LOSS_DOWN


# ---------------------------------------------------------------- worker side

STEPS = 20


class Worker:
    def __init__(self):
        import torch
        import torch.distributed as dist

        import bagua_torch

        torch.set_num_threads(1)
        self.torch = torch
        self.dist = dist
        self.bt = bagua_torch
        self.group = bagua_torch.init_process_group()
        dist.init_process_group("gloo")  # MASTER_PORT; Bagua's store is on MASTER_PORT + 1
        self.rank = self.group.rank
        self.world = self.group.size
        self.centers = torch.tensor([[2.0, 0.0], [0.0, 2.0], [-2.0, 0.0], [0.0, -2.0]])

    # -- model, data, checks --
    def model(self, seed):
        nn = self.torch.nn
        self.torch.manual_seed(seed)
        return nn.Sequential(
            nn.Linear(2, 10, bias=False), nn.ReLU(), nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, 4, bias=False)
        )  # 770 parameters: not a multiple of 3 or 4

    def batch(self, step, rank=None, n=8):
        torch = self.torch
        g = torch.Generator().manual_seed(10007 * step + (self.rank if rank is None else rank))
        y = torch.randint(0, 4, (n,), generator=g)
        x = self.centers[y] + 0.7 * torch.randn(n, 2, generator=g)
        return x, y

    def loss(self, model, step):
        x, y = self.batch(step)
        return self.torch.nn.functional.cross_entropy(model(x), y)

    def train_step(self, model, opt, step):
        opt.zero_grad()
        loss = self.loss(model, step)
        loss.backward()
        opt.step()
        return loss.item()

    def flat(self, model):
        return self.torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def same_everywhere(self, t):
        allv = self.bt.allgather(t.contiguous())
        for r in range(self.world):
            assert self.torch.equal(allv[r], t), f"rank {r} differs from rank {self.rank}"

    def close_to(self, got, ref, rtol=1e-5, atol=1e-6):
        torch = self.torch
        err = (got - ref).abs().max().item()
        assert torch.allclose(got, ref, rtol=rtol, atol=atol), f"max abs difference {err:.3g}"

    # -- GradientAllReduce vs torch DDP --
    def _ga_vs_ddp(self, algorithm, do_flatten=True):
        torch = self.torch
        model = self.model(100 + self.rank)  # differs per rank: with_bagua broadcasts rank 0's
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model.with_bagua([opt], algorithm, do_flatten=do_flatten)
        ref = torch.nn.parallel.DistributedDataParallel(self.model(100))
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        assert torch.equal(self.flat(model), self.flat(ref.module)), "rank 0's weights were not broadcast"
        for step in range(STEPS):
            self.train_step(model, opt, step)
            self.train_step(ref, ropt, step)
        self.close_to(self.flat(model), self.flat(ref.module))
        self.same_everywhere(self.flat(model))
        if do_flatten:  # gradients live in the buckets
            b = model.bagua_buckets[0]
            lo = b.flat_view().address
            hi = lo + b.nbytes
            assert any(lo <= p.grad.data_ptr() < hi for p in model.parameters())
        model.bagua_ddp.close()

    def gradient_allreduce_equals_ddp(self):
        self._ga_vs_ddp(self.bt.algorithms.GradientAllReduceAlgorithm())

    def gradient_allreduce_no_flatten_equals_ddp(self):
        self._ga_vs_ddp(self.bt.algorithms.GradientAllReduceAlgorithm(), do_flatten=False)

    def hierarchical_gradient_allreduce_equals_ddp(self):
        self._ga_vs_ddp(self.bt.algorithms.GradientAllReduceAlgorithm(hierarchical=True))

    # -- ByteGrad vs a torch.distributed + numpy reference --
    def bytegrad_reference(self, flat):
        """MinMaxUInt8 scatter-reduce-gather of one flat float32 bucket."""
        from tests.harness.reference.compressed_exchange import scatter_reduce_gather_mean

        return scatter_reduce_gather_mean(self.dist, flat)

    def _bytegrad_vs_reference(self, bucket_cap_mb=None):
        import numpy as np

        torch = self.torch
        model = self.model(100 + self.rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = self.bt.algorithms.ByteGradAlgorithm(hierarchical=False)
        if bucket_cap_mb is None:
            model.with_bagua([opt], algo)
            buckets, wrapped = model.bagua_buckets, model
        else:
            wrapped = self.bt.DistributedDataParallel(
                model, optimizers=[opt], algorithm=algo, bucket_cap_mb=bucket_cap_mb
            )
            buckets = wrapped.bagua_buckets
            assert len(buckets) > 2, buckets
        layout = [(b.tensor_names, b.numel) for b in buckets]
        assert any(numel != b.payload_numel for (_, numel), b in zip(layout, buckets)) or self.world == 2, (
            "expected a padded bucket"
        )
        ref = self.model(100)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        params = dict(ref.named_parameters())
        for step in range(STEPS):
            self.train_step(wrapped, opt, step)
            ropt.zero_grad()
            self.loss(ref, step).backward()
            for names, numel in layout:
                flat = np.zeros(numel, np.float32)
                off = 0
                for name in names:
                    g = params[name].grad.reshape(-1).numpy()
                    flat[off : off + g.size] = g
                    off += g.size
                out = self.bytegrad_reference(flat)
                off = 0
                for name in names:
                    p = params[name]
                    p.grad.copy_(torch.from_numpy(out[off : off + p.numel()]).view_as(p))
                    off += p.numel()
            ropt.step()
        self.close_to(self.flat(model), self.flat(ref))
        self.same_everywhere(self.flat(model))
        (wrapped.close() if bucket_cap_mb is not None else model.bagua_ddp.close())

    def bytegrad_equals_reference(self):
        self._bytegrad_vs_reference()

    def bytegrad_several_buckets_equal_reference(self):
        self._bytegrad_vs_reference(bucket_cap_mb=0.001)  # ~1 KB buckets

    # -- Decentralized vs a torch.distributed D-PSGD reference --
    @staticmethod
    def shift_one_partner(rank, n, comm_step):
        h = n // 2
        return h + (comm_step + rank) % h if rank < h else (rank - h - comm_step) % h

    def _decentralized_vs_reference(self, mode, interval, do_flatten=True):
        torch, dist = self.torch, self.dist
        from torch.nn.utils import parameters_to_vector, vector_to_parameters

        model = self.model(100 + self.rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = self.bt.algorithms.DecentralizedAlgorithm(
            hierarchical=False, peer_selection_mode=mode, communication_interval=interval
        )
        model.with_bagua([opt], algo, do_flatten=do_flatten)
        ref = self.model(100)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(STEPS):
            self.train_step(model, opt, step)
            ropt.zero_grad()
            self.loss(ref, step).backward()  # gradient at x_t
            if step % interval == 0:
                with torch.no_grad():
                    x = parameters_to_vector(ref.parameters())
                    if mode == "all":
                        dist.all_reduce(x)
                        x /= self.world
                    else:
                        partner = self.shift_one_partner(self.rank, self.world, step // interval)
                        theirs = torch.empty_like(x)
                        reqs = [dist.isend(x.clone(), partner), dist.irecv(theirs, partner)]
                        for q in reqs:
                            q.wait()
                        x = (x + theirs) / 2
                    vector_to_parameters(x, ref.parameters())
            ropt.step()  # x_{t+1} = avg(x_t) - lr * g(x_t)
        self.close_to(self.flat(model), self.flat(ref))
        assert model.bagua_algorithm.step == STEPS
        model.bagua_ddp.close()

    def decentralized_all_equals_reference(self):
        self._decentralized_vs_reference("all", 1)

    def decentralized_no_flatten_equals_reference(self):
        self._decentralized_vs_reference("all", 1, do_flatten=False)

    def decentralized_shift_one_interval_1_equals_reference(self):
        self._decentralized_vs_reference("shift_one", 1)

    def decentralized_shift_one_interval_2_equals_reference(self):
        self._decentralized_vs_reference("shift_one", 2)

    def shift_one_odd_peers_refused(self):
        torch = self.torch
        model = self.model(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = self.bt.algorithms.DecentralizedAlgorithm(hierarchical=False, peer_selection_mode="shift_one")
        try:
            model.with_bagua([opt], algo)
        except ValueError as e:
            assert "shift_one" in str(e) and "even" in str(e), e
        else:
            raise AssertionError("shift_one with an odd number of peers was accepted")
        assert "bagua_ddp" not in model.__dict__

    # -- loss goes down with every algorithm (default settings) --
    def _loss_goes_down(self, algorithm):
        torch = self.torch
        model = self.model(7)
        opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
        model.with_bagua([opt], algorithm)
        with torch.no_grad():
            eval_x, eval_y = self.batch(10**6, rank=0, n=256)
            before = torch.nn.functional.cross_entropy(model(eval_x), eval_y).item()
        for step in range(40):
            self.train_step(model, opt, step)
        model.bagua_ddp.finish_step()
        with torch.no_grad():
            after = torch.nn.functional.cross_entropy(model(eval_x), eval_y).item()
        assert after < 0.5 * before, f"loss {before:.4f} -> {after:.4f}"
        model.bagua_ddp.close()

    def loss_goes_down_gradient_allreduce(self):
        self._loss_goes_down(self.bt.algorithms.GradientAllReduceAlgorithm())

    def loss_goes_down_bytegrad(self):
        self._loss_goes_down(self.bt.algorithms.ByteGradAlgorithm())

    def loss_goes_down_decentralized(self):
        self._loss_goes_down(self.bt.algorithms.DecentralizedAlgorithm())

    def loss_goes_down_decentralized_hierarchical_shift_one(self):
        self._loss_goes_down(self.bt.algorithms.DecentralizedAlgorithm(peer_selection_mode="shift_one"))


def worker_main():
    from tests.harness.worker import run_cases

    session = sys.argv[1]
    w = Worker()
    failures = run_cases([(c, getattr(w, c)) for c in case_names(session)])
    w.dist.destroy_process_group()
    sys.exit(1 if failures else 0)


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__, {name: Session(world, local) for name, (world, local) in SESSIONS.items()}, case_names
)

if __name__ == "__main__":
    worker_main()
