"""``model.bagua_buckets`` across 3 real processes, against references built
with torch.distributed (gloo, in the same processes):

* GradientAllReduce: the buckets in communication order (reverse parameter
  order), named, the same on every rank; ``tensors`` are the parameters and
  ``flattened_tensor()`` holds their gradients, the mean of every rank's
  local gradient (computed here on a copy of the model);
* Decentralized: ``_peer_weight`` is the mean of every rank's weights at the
  start of the last communicating step (all_gather), the same on every rank,
  and stays so over a step that does not communicate;
* LowPrecisionDecentralized: ``_weight`` is this rank's weights, and equals
  its left neighbour's ``_right_peer_weight`` and its right neighbour's
  ``_left_peer_weight`` bitwise (Bagua 0.9.2's test compared their norms);
  the attributes are live views of the engine's state;
* the other algorithms raise AttributeError saying what they keep.

One multi-process session runs every case (this file is also the worker
script); pytest reports each case on its own.
"""

from __future__ import annotations

from tests.harness.mp import Session, session_tests
from tests.harness.torch_worker import TorchWorker, worker_main

SESSIONS = {"w3": 3}
CASES = [
    "gradient_allreduce_buckets_list_parameters_and_mean_gradients",
    "decentralized_peer_weight_is_the_weights_mean",
    "decentralized_peer_weight_kept_between_communications",
    "low_precision_replicas_equal_neighbours_weights",
    "other_algorithms_say_what_they_keep",
]


class Worker(TorchWorker):
    def train_step(self, model, opt, step):
        x, y = self.batch(step)
        opt.zero_grad()
        self.torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def all_gather(self, t):
        out = [self.torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(out, t.contiguous())
        return out

    def layout_flat(self, model, bucket):
        """The parameters of ``bucket`` back to back, read from the model."""
        params = dict(model.named_parameters())
        return self.torch.cat([params[n].detach().reshape(-1) for n in bucket.tensor_names])

    def gradient_allreduce_buckets_list_parameters_and_mean_gradients(self):
        from bagua_core.engine import Bucket

        torch = self.torch
        model = self.mlp(1, hidden=64)  # same seed on every rank: the reference starts from the same weights
        ref = self.mlp(1, hidden=64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ddp = self.bt.DistributedDataParallel(
            model, [opt], algorithm=self.A.GradientAllReduceAlgorithm(), bucket_cap_mb=600 / 2**20
        )  # 600 bytes: several buckets
        buckets = ddp.bagua_buckets
        assert len(buckets) > 2 and all(isinstance(b, Bucket) for b in buckets), buckets
        names = [b.name for b in buckets]
        assert len(set(names)) == len(names), names
        every = [None] * self.world
        self.dist.all_gather_object(every, (names, [b.tensor_names for b in buckets]))
        assert all(e == every[0] for e in every), every
        order = [n for b in buckets for n in b.tensor_names]
        assert order == [n for n, _ in reversed(list(model.named_parameters()))], order
        params = dict(model.named_parameters())
        for b in buckets:
            assert len(b.tensors) == len(b.tensor_names)
            assert all(t is params[n] for t, n in zip(b.tensors, b.tensor_names)), b

        x, y = self.batch(0)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        torch.nn.functional.cross_entropy(ref(x), y).backward()  # the local gradient
        rparams = dict(ref.named_parameters())
        for b in ddp.bagua_buckets:
            flat = b.flattened_tensor()
            assert flat.dim() == 1 and flat.numel() == b.numel
            grads = torch.cat([t.grad.reshape(-1) for t in b.tensors])
            assert torch.equal(flat[: b.payload_numel], grads)  # the gradients live in the bucket
            local = torch.cat([rparams[n].grad.reshape(-1) for n in b.tensor_names])
            mean = torch.stack(self.all_gather(local)).sum(0) / self.world
            self.close_to(flat[: b.payload_numel], mean, rtol=1e-6, atol=1e-7)
        opt.step()
        ddp.close()

    def _decentralized(self, interval, steps):
        torch = self.torch
        model = self.mlp(2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model.with_bagua([opt], self.A.DecentralizedAlgorithm(hierarchical=False, communication_interval=interval))
        [b] = model.bagua_buckets
        start = None
        for step in range(steps):
            if step % interval == 0:  # the weights this step averages
                start = self.layout_flat(model, b).clone()
            self.train_step(model, opt, step)
        every = self.all_gather(start)
        assert not torch.equal(every[0], every[1]), "the ranks' weights should differ (their own data)"
        peer = model.bagua_buckets[0]._peer_weight
        assert peer.shape == (b.numel,) and peer.dtype == torch.float32
        self.close_to(peer[: b.payload_numel], torch.stack(every).sum(0) / self.world, rtol=1e-6, atol=1e-7)
        self.same_everywhere(peer)
        model.bagua_ddp.close()

    def decentralized_peer_weight_is_the_weights_mean(self):
        self._decentralized(interval=1, steps=5)

    def decentralized_peer_weight_kept_between_communications(self):
        self._decentralized(interval=2, steps=4)  # step 3 does not communicate: the average of step 2 stays

    def low_precision_replicas_equal_neighbours_weights(self):
        torch = self.torch
        model = self.mlp(3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.with_bagua([opt], self.A.LowPrecisionDecentralizedAlgorithm(hierarchical=False))
        held = model.bagua_buckets[0]._weight
        before = held.clone()
        for step in range(10):
            self.train_step(model, opt, step)
        assert not torch.equal(held, before), "_weight is not a view of the engine's replica"
        [b] = model.bagua_buckets
        w, left, right = b._weight, b._left_peer_weight, b._right_peer_weight
        assert held.data_ptr() == w.data_ptr()
        assert torch.equal(w[: b.payload_numel], self.layout_flat(model, b))  # after a communication W is the weights
        W, L, R = self.all_gather(w), self.all_gather(left), self.all_gather(right)
        n = self.world
        assert not torch.equal(W[0], W[1]), "the ranks' weights should differ (their own data)"
        for r in range(n):
            assert torch.equal(W[r], R[(r - 1) % n]) and torch.equal(W[r], L[(r + 1) % n]), r
            assert torch.norm(W[r]) == torch.norm(R[(r - 1) % n])  # the original's check
        model.bagua_ddp.close()

    def other_algorithms_say_what_they_keep(self):
        torch, A = self.torch, self.A
        model = self.mlp(4)
        opt = A.QAdamOptimizer(model.parameters(), lr=0.01, warmup_steps=2)
        cases = [
            (torch.optim.SGD(model.parameters(), lr=0.1), A.GradientAllReduceAlgorithm(), "no state per bucket"),
            (torch.optim.SGD(model.parameters(), lr=0.1), A.ByteGradAlgorithm(), "no state per bucket"),
            (opt, A.QAdamAlgorithm(opt), "the momentum"),
            (torch.optim.SGD(model.parameters(), lr=0.1), A.DecentralizedAlgorithm(), "_peer_weight"),
            (torch.optim.SGD(model.parameters(), lr=0.1), A.LowPrecisionDecentralizedAlgorithm(), "_left_peer_weight"),
        ]
        for opt, algo, keeps in cases:
            model.with_bagua([opt], algo)
            self.train_step(model, opt, 0)
            b = model.bagua_buckets[0]
            for attr in ("_peer_weight", "_weight", "_left_peer_weight", "_right_peer_weight"):
                if isinstance(algo, A.DecentralizedAlgorithm) and attr == "_peer_weight":
                    continue
                if isinstance(algo, A.LowPrecisionDecentralizedAlgorithm) and attr != "_peer_weight":
                    continue
                assert not hasattr(b, attr), (algo, attr)
                self.expect_error(
                    AttributeError, lambda: getattr(b, attr), attr, type(algo).__name__, keeps, repr(b.name)
                )
        model.bagua_ddp.close()


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__, {name: Session(world) for name, world in SESSIONS.items()}, lambda _: CASES, timeout=150, test_timeout=200
)


if __name__ == "__main__":
    worker_main(Worker, lambda _: CASES)
