"""Several wrapped models and their life cycle, across real processes: two
models whose backward passes overlap (one loss through both, as in a GAN),
engines freeing their communicators and threads (switching, close,
destroy_process_group, process exit), algorithm state in checkpoints
(Decentralized step counter), ignore lists.

References are torch.distributed (gloo, in the same processes) and plain
arithmetic. One multi-process session per world size runs every case (this
file is also the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import time

from tests.harness.mp import Session, session_tests
from tests.harness.torch_worker import TorchWorker, worker_main as run_worker
from tests.harness.worker import threads, wait_for_threads

SESSIONS = {"w2": 2, "w3": 3}
# a collective paired with the wrong one may hang until the timeout: keep it short
ENV = {"BAGUA_TIMEOUT": "20"}

CASES = [
    "overlapping_backward_of_two_models_equals_reference",
    "closing_engines_frees_their_threads",
    "decentralized_checkpoint_resumes_exactly",
    "ddp_wrapper_state_dict_carries_algorithm_state",
    "ignored_parameters_neither_broadcast_nor_communicated",
    "ignore_lists_use_named_parameters_names",
    "destroy_process_group_frees_engines",  # last: re-initialises, leaves a model wrapped for exit
]


# ---------------------------------------------------------------- worker side


class Worker(TorchWorker):
    def train_step(self, model, opts, step):
        for o in opts:
            o.zero_grad()
        x, y = self.batch(step)
        self.nn.functional.cross_entropy(model(x), y).backward()
        for o in opts:
            o.step()

    def allreduce_mean_grads(self, params):
        for p in params:
            self.dist.all_reduce(p.grad)
            p.grad /= self.world

    # -- two models, one backward --
    def gan(self, seed=5):
        nn, torch = self.nn, self.torch
        torch.manual_seed(seed)
        gen = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
        disc = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
        return gen, disc

    def overlapping_backward_of_two_models_equals_reference(self):
        """The generator's loss flows through the discriminator: the
        discriminator's buckets still communicate when the generator's become
        ready, on two engines of one group (one bucket per tensor)."""
        torch = self.torch
        gen, disc = self.gan()
        ref_gen, ref_disc = self.gan()
        opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
        opt_d = torch.optim.SGD(disc.parameters(), lr=0.05, momentum=0.9)
        ref_opt_g = torch.optim.SGD(ref_gen.parameters(), lr=0.1)
        ref_opt_d = torch.optim.SGD(ref_disc.parameters(), lr=0.05, momentum=0.9)
        tiny = 1e-4  # MiB: every tensor its own bucket
        g = self.bt.DistributedDataParallel(gen, [opt_g], bucket_cap_mb=tiny)
        d = self.bt.DistributedDataParallel(disc, [opt_d], bucket_cap_mb=tiny)
        assert len(g.bagua_buckets) == 6 and len(d.bagua_buckets) == 6
        assert g.inner.engine.group is not d.inner.engine.group
        for step in range(6):
            x, y = self.batch(step)
            opt_g.zero_grad()
            opt_d.zero_grad()
            self.nn.functional.cross_entropy(d(g(x)), y).backward()
            opt_d.step()
            opt_g.step()

            ref_opt_g.zero_grad()
            ref_opt_d.zero_grad()
            self.nn.functional.cross_entropy(ref_disc(ref_gen(x)), y).backward()
            self.allreduce_mean_grads(list(ref_gen.parameters()) + list(ref_disc.parameters()))
            ref_opt_d.step()
            ref_opt_g.step()
        got = self.flat(gen, disc)
        self.same_everywhere(got)
        self.close_to(got, self.flat(ref_gen, ref_disc))
        g.close()
        d.close()

    # -- life cycle --
    def closing_engines_frees_their_threads(self):
        torch, A = self.torch, self.A
        warm = self.mlp(1)
        warm.with_bagua([torch.optim.SGD(warm.parameters(), lr=0.1)], A.GradientAllReduceAlgorithm())
        warm.bagua_ddp.close()
        self.bt.barrier()
        before = threads()

        gen, disc = self.gan()
        opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
        opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
        gen.with_bagua([opt_g], A.GradientAllReduceAlgorithm())
        disc.with_bagua([opt_d], A.ByteGradAlgorithm(hierarchical=True))  # intra/inter clones too

        def step(s):
            x, y = self.batch(s)
            opt_g.zero_grad()
            opt_d.zero_grad()
            self.nn.functional.cross_entropy(disc(gen(x)), y).backward()
            opt_d.step()
            opt_g.step()

        step(0)
        assert threads() > before
        first = gen.bagua_ddp.engine.group
        gen.with_bagua([opt_g], A.ByteGradAlgorithm(hierarchical=False))  # switching closes the old engine
        assert first.closed and not self.group.closed
        step(1)
        self.same_everywhere(self.flat(gen, disc))
        clones = [gen.bagua_ddp.engine.group, disc.bagua_ddp.engine.group]
        gen.bagua_ddp.close()
        disc.bagua_ddp.close()
        assert all(c.closed for c in clones)
        wait_for_threads(before)

    def destroy_process_group_frees_engines(self):
        import bagua_core

        torch, A = self.torch, self.A
        bagua_core.destroy_process_group()
        time.sleep(0.2)
        without_bagua = threads()
        self.group = self.bt.init_process_group()
        gen, disc = self.gan()
        opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
        opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
        gen.with_bagua([opt_g], A.GradientAllReduceAlgorithm())
        disc.with_bagua([opt_d], A.DecentralizedAlgorithm(hierarchical=True))
        x, y = self.batch(0)
        self.nn.functional.cross_entropy(disc(gen(x)), y).backward()
        opt_d.step()
        opt_g.step()
        engines = [gen.bagua_ddp.engine, disc.bagua_ddp.engine]
        bagua_core.destroy_process_group()
        assert all(e.group.closed for e in engines)
        wait_for_threads(without_bagua)
        # the process exits with a wrapped model whose engine is still running
        self.group = self.bt.init_process_group()
        last = self.mlp(2)
        opt = torch.optim.SGD(last.parameters(), lr=0.1)
        last.with_bagua([opt], A.GradientAllReduceAlgorithm())
        self.train_step(last, [opt], 0)
        self._keep = last

    # -- checkpoints --
    def decentralized_algorithm(self):
        mode = "shift_one" if self.world % 2 == 0 else "all"
        return self.A.DecentralizedAlgorithm(hierarchical=False, peer_selection_mode=mode, communication_interval=2)

    def fresh(self, seed):
        model = self.mlp(seed)
        return model, self.torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def decentralized_checkpoint_resumes_exactly(self):
        """Interval 2 and 3 steps before the checkpoint: a counter restarted at 0
        would communicate on the wrong steps (and, with 4 or more peers,
        pair shift_one differently)."""
        import copy
        import io

        torch = self.torch
        before, after = 3, 4
        model, opt = self.fresh(11)
        model.with_bagua([opt], self.decentralized_algorithm())
        for s in range(before + after):
            self.train_step(model, [opt], s)
        uninterrupted = self.flat(model)
        model.bagua_ddp.close()

        model, opt = self.fresh(11)
        model.with_bagua([opt], self.decentralized_algorithm())
        for s in range(before):
            self.train_step(model, [opt], s)
        saved = model.bagua_ddp.state_dict()
        assert saved == {"algorithm": "decentralized", "state": {"step": before}}, saved
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "bagua": saved}, buf)
        model.bagua_ddp.close()

        buf.seek(0)
        ckpt = torch.load(buf)
        resumed, opt2 = self.fresh(99)  # other weights: all must come from the checkpoint
        resumed.with_bagua([opt2], self.decentralized_algorithm())
        resumed.load_state_dict(copy.deepcopy(ckpt["model"]))  # this rank's replica, after the wrap's broadcast
        opt2.load_state_dict(ckpt["opt"])
        resumed.bagua_ddp.load_state_dict(ckpt["bagua"])
        assert resumed.bagua_algorithm.step == before
        for s in range(before, before + after):
            self.train_step(resumed, [opt2], s)
        assert torch.equal(self.flat(resumed), uninterrupted), (self.flat(resumed) - uninterrupted).abs().max()
        self.expect_error(
            ValueError,
            lambda: resumed.bagua_ddp.load_state_dict({"algorithm": "gradient_allreduce", "state": {}}),
            "gradient_allreduce",
            "decentralized",
        )
        self.expect_error(
            ValueError,
            lambda: resumed.bagua_ddp.load_state_dict({"algorithm": "decentralized", "state": {"step": -1}}),
            "step",
        )
        resumed.bagua_ddp.close()

    def ddp_wrapper_state_dict_carries_algorithm_state(self):
        torch, bt = self.torch, self.bt
        model, opt = self.fresh(12)
        ddp = bt.DistributedDataParallel(model, [opt], algorithm=self.decentralized_algorithm())
        for s in range(3):
            self.train_step(ddp, [opt], s)
        sd = ddp.state_dict()
        assert bytes(sd["bagua.algorithm"].tolist()).decode() == "decentralized" and int(sd["bagua.step"]) == 3
        assert sorted(k for k in sd if not k.startswith("bagua.")) == sorted("module." + k for k in model.state_dict())
        assert all(isinstance(v, torch.Tensor) for v in sd.values())
        ddp.close()

        model2, opt2 = self.fresh(13)
        ddp2 = bt.DistributedDataParallel(model2, [opt2], algorithm=self.decentralized_algorithm())
        ddp2.load_state_dict(sd)
        assert ddp2.bagua_algorithm.step == 3 and torch.equal(self.flat(model2), self.flat(model))
        plain = {k: v for k, v in sd.items() if not k.startswith("bagua.")}  # e.g. saved by torch DDP
        ddp2.load_state_dict(plain)
        assert ddp2.bagua_algorithm.step == 3
        ddp2.close()

        model3, opt3 = self.fresh(14)
        ddp3 = bt.DistributedDataParallel(model3, [opt3])  # GradientAllReduce
        self.expect_error(RuntimeError, lambda: ddp3.load_state_dict(sd), "'bagua.*'", "decentralized")
        ddp3.load_state_dict(plain)
        ddp3.close()

    # -- ignore lists --
    def ignored_parameters_neither_broadcast_nor_communicated(self):
        """A per-rank "expert" (its shape differs across ranks, as in mixture of
        experts) and a per-rank buffer are listed to be ignored: they keep
        their own values and optimizer state, while the rest is broadcast and
        averaged."""
        import copy

        torch, nn, r = self.torch, self.nn, self.rank

        class Net(nn.Module):
            def __init__(self, rank):
                super().__init__()
                torch.manual_seed(100 + rank)  # differs across ranks: the wrap broadcasts rank 0's
                self.shared = nn.Linear(4, 8)
                torch.manual_seed(200 + rank)
                self.expert = nn.Linear(8, 3 + rank)
                self.register_buffer("forwards", torch.full((1,), 100.0 * rank))  # ignored
                self.register_buffer("seen", torch.full((1,), 100.0 * rank))  # broadcast from rank 0

            def forward(self, x):
                self.forwards += 1
                self.seen += 1
                return self.expert(torch.relu(self.shared(x)))[:, :3]

        model = Net(r)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        self.train_step(model, [opt], 100)  # local: every rank's optimizer state differs
        ref = copy.deepcopy(model)
        ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
        ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        # the reference wrap: rank 0's shared weights, their optimizer state and the "seen" buffer
        with torch.no_grad():
            for p in ref.shared.parameters():
                self.dist.broadcast(p, 0)
                for v in ref_opt.state[p].values():
                    if torch.is_tensor(v):
                        self.dist.broadcast(v, 0)
        model._bagua_params_and_buffers_to_ignore = ["expert.weight"]
        model._ddp_params_and_buffers_to_ignore = ["expert.bias", "forwards"]
        model.with_bagua([opt], self.A.GradientAllReduceAlgorithm())
        names = {n for b in model.bagua_buckets for n in b.tensor_names}
        assert names == {"shared.weight", "shared.bias"}, names
        for s in range(3):
            self.train_step(model, [opt], s)
            ref_opt.zero_grad()
            x, y = self.batch(s)
            self.nn.functional.cross_entropy(ref(x), y).backward()
            self.allreduce_mean_grads(ref.shared.parameters())
            ref_opt.step()
        self.same_everywhere(self.flat(model.shared))
        self.close_to(self.flat(model.shared), self.flat(ref.shared))
        self.close_to(self.flat(model.expert), self.flat(ref.expert))  # its own: never averaged
        assert model.expert.weight.shape == (3 + r, 8)
        assert model.forwards.item() == 100.0 * r + 4, model.forwards  # never broadcast
        assert model.seen.item() == 4, model.seen  # rank 0's before each forward, then + 1
        model.bagua_ddp.close()

    def ignore_lists_use_named_parameters_names(self):
        torch, A = self.torch, self.A
        model = self.mlp(3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model._bagua_params_and_buffers_to_ignore = [".0.weight"]  # the original Bagua's root-module quirk
        self.expect_error(
            ValueError,
            lambda: model.with_bagua([opt], A.GradientAllReduceAlgorithm()),
            "'.0.weight'",
            "named_parameters",
        )
        model._bagua_params_and_buffers_to_ignore = [f"{model.bagua_module_name}.0.weight"]
        self.expect_error(ValueError, lambda: model.with_bagua([opt], A.GradientAllReduceAlgorithm()), "0.weight")
        model._bagua_params_and_buffers_to_ignore = "0.weight"  # one name, not its letters
        ddp = self.bt.DistributedDataParallel(model, [opt])
        assert ddp.parameters_to_ignore == ["0.weight"]
        names = {n for b in ddp.bagua_buckets for n in b.tensor_names}
        assert names == {"0.bias", "2.weight", "2.bias"}, names
        ddp.close()


def worker_main():
    run_worker(Worker, lambda session: CASES)


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, env=ENV) for name, world in SESSIONS.items()},
    lambda _: CASES,
    timeout=150,
    test_timeout=200,
)

if __name__ == "__main__":
    worker_main()
