"""LowPrecisionDecentralizedAlgorithm across real processes against an
independent reference written with numpy (tests/harness/reference's MinMaxUInt8
compressor) and torch.distributed all_gather (tests/harness/reference/compressed_exchange.py):

* flat on 2 and 3 ranks (communication_interval 1 and 2), hierarchical on 4
  ranks as 2 nodes; the replicas are exact: my W equals my left neighbour's R
  and my right neighbour's L, bitwise;
* the replicas survive bagua_ddp.state_dict() / load_state_dict(): a resumed
  run continues bitwise as the original; under another bucket size they move
  to their new place;
* bad input raises at wrap time; the loss goes down.

One multi-process session per configuration runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import functools
import math
import os

from tests.harness.mp import Session, session_tests
from tests.harness.torch_worker import TorchWorker, worker_main

# session -> (world size, local world size)
SESSIONS = {"w2": (2, None), "w3": (3, None), "w4n2": (4, 2)}


def case_names(session: str):
    world, local = SESSIONS[session]
    names = [
        "flat_interval_1_equals_reference",
        "flat_interval_2_equals_reference",
        "replicas_track_neighbours",
        "wide_bucket_equals_reference_bitwise",
        "wide_bucket_replicas_track_neighbours",
        "state_dict_resumes_bitwise",
        "state_moves_to_another_bucket_size",
        "bad_input_refused",
        "loss_goes_down",
    ]
    if local:
        names += ["hierarchical_equals_reference", "loss_goes_down_hierarchical"]
    return names


STEPS = 12


class Worker(TorchWorker):
    def model(self, seed, wide=False):
        if wide:  # 131 k parameters: above ops/alongside.h's threshold, so the update overlaps the exchange
            return self.mlp(seed, hidden=16384)
        return self.mlp(seed, out_bias=False)  # 128 parameters

    def train_step(self, model, opt, step):
        x, y = self.batch(step)
        opt.zero_grad()
        loss = self.torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    def algo(self, **kw):
        return self.A.LowPrecisionDecentralizedAlgorithm(**kw)

    # -- the reference: numpy arithmetic, torch.distributed transport --
    def reference_round(self, x, state, peers, my_peer, rank_of_peer):
        """One communication of peer `my_peer` among `peers` (ranks or node
        leaders; rank_of_peer(j) is the rank whose Q stands for peer j).
        state = [W, L, R] (float32 numpy), updated in place; returns the new x."""
        import numpy as np

        from tests.harness.reference import compressed_exchange, minmax_uint8 as mm

        W, L, R = state
        d = x + L / np.float32(3) + R / np.float32(3) - W * (np.float32(5) / np.float32(3))
        every = compressed_exchange.allgather_compressed(self.dist, d, 1)
        left, right = (my_peer - 1) % peers, (my_peer + 1) % peers
        dec = lambda j: mm.decompress(every[rank_of_peer(j)], x.size, 1, np.float32)  # noqa: E731
        L += dec(left)
        R += dec(right)
        new = W + dec(my_peer)
        W[:] = new
        return new

    def _vs_reference(self, interval, hierarchical, wide=False, atol=1e-5):
        import numpy as np

        torch = self.torch
        model = self.model(100 + self.rank, wide)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model.with_bagua([opt], self.algo(hierarchical=hierarchical, communication_interval=interval))
        layout = [list(b.tensor_names) for b in model.bagua_buckets]
        assert len(layout) == 1, layout
        names = layout[0]
        ref = self.model(100, wide)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        params = dict(ref.named_parameters())

        def ref_flat():
            return np.concatenate([params[n].detach().reshape(-1).numpy() for n in names]).astype(np.float32)

        state = [ref_flat().copy() for _ in range(3)]
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world)) if hierarchical else 1
        nodes = self.world // local
        for step in range(STEPS):
            self.train_step(model, opt, step)
            self.train_step(ref, ropt, step)
            if step % interval:
                continue
            x = ref_flat()
            if hierarchical:
                t = torch.from_numpy(x)
                every = [torch.empty_like(t) for _ in range(self.world)]
                self.dist.all_gather(every, t)
                node = self.rank // local
                members = [every[node * local + k].numpy() for k in range(local)]
                x = functools.reduce(lambda a, b: a + b, members) / np.float32(local)
                x = self.reference_round(x, state, nodes, node, lambda j: j * local)
            else:
                x = self.reference_round(x, state, self.world, self.rank, lambda j: j)
            off = 0
            with torch.no_grad():
                for n in names:
                    p = params[n]
                    p.copy_(torch.from_numpy(x[off : off + p.numel()]).reshape(p.shape))
                    off += p.numel()
        got = torch.cat([dict(model.named_parameters())[n].detach().reshape(-1) for n in names])
        self.close_to(got, torch.from_numpy(ref_flat()), rtol=0, atol=atol)
        if hierarchical:
            # a node's processes hold the node's weights
            allv = self.gathered(got)
            assert torch.equal(allv[self.rank], allv[(self.rank // local) * local])
        else:
            W = model.bagua_ddp.state_dict()["state"]["step_state"][0][0]
            self.close_to(W, torch.from_numpy(state[0]), rtol=0, atol=atol)
        model.bagua_ddp.close()

    def flat_interval_1_equals_reference(self):
        self._vs_reference(1, hierarchical=False)

    def flat_interval_2_equals_reference(self):
        self._vs_reference(2, hierarchical=False)

    def hierarchical_equals_reference(self):
        self._vs_reference(1, hierarchical=True)

    def wide_bucket_equals_reference_bitwise(self):
        self._vs_reference(1, hierarchical=False, wide=True, atol=0)

    def wide_bucket_replicas_track_neighbours(self):
        self.replicas_track_neighbours(wide=True)

    def replicas_track_neighbours(self, wide=False):
        torch = self.torch
        model = self.model(5, wide)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.with_bagua([opt], self.algo(hierarchical=False))
        for step in range(5):
            self.train_step(model, opt, step)
        state = model.bagua_ddp.state_dict()["state"]
        assert state["step"] == 5
        W, L, R = state["step_state"][0]
        every = self.gathered(torch.stack([W, L, R]))
        n = self.world
        assert torch.equal(every[(self.rank - 1) % n][2], W), "left neighbour's R differs from my W"
        assert torch.equal(every[(self.rank + 1) % n][1], W), "right neighbour's L differs from my W"
        assert not torch.equal(L, W) or n == 1
        model.bagua_ddp.close()

    def state_dict_resumes_bitwise(self):
        import copy

        torch = self.torch

        def run(model, opt, steps):
            for step in steps:
                self.train_step(model, opt, step)
            return self.flat(model)

        model = self.model(9)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        algo = self.algo(hierarchical=False, communication_interval=2)
        model.with_bagua([opt], algo)
        run(model, opt, range(5))
        saved = (
            copy.deepcopy(model.state_dict()),
            copy.deepcopy(opt.state_dict()),
            copy.deepcopy(model.bagua_ddp.state_dict()),
        )
        expected = run(model, opt, range(5, 10))
        model.bagua_ddp.close()

        model2 = self.model(9)
        opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
        model2.with_bagua([opt2], algo)
        model2.load_state_dict(saved[0])
        opt2.load_state_dict(saved[1])
        model2.bagua_ddp.load_state_dict(saved[2])
        got = run(model2, opt2, range(5, 10))
        assert torch.equal(got, expected), f"max abs difference {(got - expected).abs().max().item():.3g}"
        bad = copy.deepcopy(saved[2])
        bad["state"]["step_state"] = [bad["state"]["step_state"][0][:2]]
        self.expect_error(ValueError, lambda: model2.bagua_ddp.load_state_dict(bad), "step_state")
        model2.bagua_ddp.close()

    def state_moves_to_another_bucket_size(self):
        """Saved under 64-byte buckets, loaded into a model wrapped with one
        bucket: the replicas move to their new place (the moves themselves:
        tests/core/test_state_relayout.py), so my W, L and R hold what they
        held, my W is still my left neighbour's R and my right neighbour's L,
        and training goes on."""
        import copy

        torch = self.torch

        def wrapped(bucket_bytes):
            os.environ["BAGUA_BUCKET_SIZE"] = str(bucket_bytes)
            try:
                model = self.model(9)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                model.with_bagua([opt], self.algo(hierarchical=False))
            finally:
                os.environ.pop("BAGUA_BUCKET_SIZE")
            return model, opt

        model, opt = wrapped(64)
        for step in range(5):
            self.train_step(model, opt, step)
        saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(model.bagua_ddp.state_dict()))
        model.bagua_ddp.close()
        old = saved[1]["state"]["step_state"]

        model2, opt2 = wrapped(1 << 20)
        assert len(model2.bagua_buckets) == 1 < len(old)
        model2.load_state_dict(saved[0])
        model2.bagua_ddp.load_state_dict(saved[1])
        W, L, R = model2.bagua_ddp.state_dict()["state"]["step_state"][0]
        for row, moved in enumerate((W, L, R)):  # the same numbers (padding adds zeros)
            held = torch.cat([b[row] for b in old])
            assert torch.equal(torch.sort(moved[moved != 0]).values, torch.sort(held[held != 0]).values), row
        assert not torch.equal(W, L) and W.abs().sum() > 0
        every = self.gathered(torch.stack([W, L, R]))
        n = self.world
        assert torch.equal(every[(self.rank - 1) % n][2], W), "left neighbour's R differs from my W"
        assert torch.equal(every[(self.rank + 1) % n][1], W), "right neighbour's L differs from my W"
        for step in range(5, 10):
            assert math.isfinite(self.train_step(model2, opt2, step))
        model2.bagua_ddp.close()

    def bad_input_refused(self):
        torch = self.torch
        self.expect_error(ValueError, lambda: self.algo(communication_interval=0), "communication_interval")
        self.expect_error(TypeError, lambda: self.algo(hierarchical=1), "hierarchical")
        model = self.model(1)
        opt1 = torch.optim.SGD(list(model.parameters())[:1], lr=0.1)
        opt2 = torch.optim.SGD(list(model.parameters())[1:], lr=0.1)
        self.expect_error(ValueError, lambda: model.with_bagua([opt1, opt2], self.algo()), "exactly one optimizer")
        self.expect_error(ValueError, lambda: model.with_bagua([opt1], self.algo()), "not updated by the optimizer")

    def _loss_goes_down(self, algorithm):
        model = self.model(7)
        opt = self.torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
        model.with_bagua([opt], algorithm)
        self.assert_training_reduces_loss(model, opt)
        model.bagua_ddp.close()

    def loss_goes_down(self):
        self._loss_goes_down(self.algo(hierarchical=False))

    def loss_goes_down_hierarchical(self):
        self._loss_goes_down(self.algo())


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, local) for name, (world, local) in SESSIONS.items()},
    case_names,
    timeout=120,
    test_timeout=200,
)


if __name__ == "__main__":
    worker_main(Worker, case_names)
