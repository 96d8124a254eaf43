"""``with_bagua`` and the collectives on CUDA (``gpu``-marked: they skip
without a CUDA device and run in tests/gpu/run.sh).

* ``ws1``: one process on cuda:0 with the default backend (NCCL when a
  library is found). Each algorithm trains a CUDA model and, from the same
  start and data, a CPU model: the weights agree to float32 rounding (the
  forward and backward kernels differ by device, the engine's arithmetic
  does not). Gradient allreduce equals plain torch training on the GPU
  bitwise (one rank: the average of one gradient is itself).
* ``shared2_gloo``: two ranks sharing cuda:0 over Gloo (``BAGUA_BACKEND=gloo``:
  NCCL refuses two ranks on one device), staged through pinned host memory:
  every algorithm against the same training on CPU; torch and CuPy arrays
  through the collectives against numpy.
* Asynchronous model average averages on the GPU until abort() leaves
  every rank with the same weights.
"""

from __future__ import annotations

import pytest

from tests.gpu.available import gpu_skip_reason
from tests.harness.mp import Session, session_tests
from tests.harness.torch_worker import TorchWorker, worker_main

SESSIONS = {"ws1": Session(1), "shared2_gloo": Session(2, env={"BAGUA_BACKEND": "gloo"})}
ALGORITHMS = ["gradient_allreduce", "bytegrad", "decentralized", "low_precision_decentralized", "qadam"]
STEPS = 5


def case_names(session: str):
    names = [f"{a}_cuda_matches_cpu" for a in ALGORITHMS]
    if session == "ws1":
        names.append("gradient_allreduce_equals_plain_torch_bitwise")
    else:
        names += [
            "async_model_average_ends_equal_everywhere",
            "torch_cuda_collectives_match_numpy",
            "cupy_collectives_match_numpy",
        ]
    return names


class Worker(TorchWorker):
    def train(self, name, device, wrap=True):
        torch = self.torch
        model = self.mlp(11, hidden=32).to(device)
        opt, algo = self.optimizer_and_algorithm(name, model)
        if wrap:
            model = model.with_bagua([opt], algo)
        for step in range(STEPS):
            x, y = self.batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
        weights = self.flat(model).cpu()
        if wrap:
            model.bagua_ddp.close()
        return weights

    def matches_cpu(self, name):
        on_cuda = self.train(name, "cuda:0")
        on_cpu = self.train(name, "cpu")
        self.close_to(on_cuda, on_cpu, rtol=1e-4, atol=1e-5)

    def gradient_allreduce_equals_plain_torch_bitwise(self):
        wrapped = self.train("gradient_allreduce", "cuda:0")
        plain = self.train("gradient_allreduce", "cuda:0", wrap=False)
        assert self.torch.equal(wrapped, plain), f"max difference {(wrapped - plain).abs().max().item():.3g}"

    def async_model_average_ends_equal_everywhere(self):
        import time

        torch = self.torch
        model = self.mlp(3 + self.rank).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        algo = self.A.async_model_average.AsyncModelAverageAlgorithm(sync_interval_ms=5, warmup_steps=2)
        model = model.with_bagua([opt], algo)
        for step in range(12):
            x, y = self.batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
            opt.step()
            time.sleep(0.01)
        assert model.bagua_ddp.averager.rounds > 0, "the loop never averaged"
        algo.abort(model)
        self.same_everywhere(self.flat(model).cpu())
        model.bagua_ddp.close()

    def torch_cuda_collectives_match_numpy(self):
        import numpy as np

        torch = self.torch
        x = torch.arange(10, dtype=torch.float32, device="cuda:0") * (self.rank + 1)
        self.bt.allreduce_inplace(x)
        want = np.arange(10, dtype=np.float32) * sum(r + 1 for r in range(self.world))
        np.testing.assert_array_equal(x.cpu().numpy(), want)
        y = torch.full((6,), float(self.rank), device="cuda:0")
        self.bt.broadcast(y, 1)
        np.testing.assert_array_equal(y.cpu().numpy(), np.ones(6, np.float32))

    def cupy_collectives_match_numpy(self):
        import cupy
        import numpy as np

        import bagua_core

        x = cupy.arange(12, dtype=cupy.float32) + self.rank
        bagua_core.allreduce_inplace(x, op="max")
        np.testing.assert_array_equal(cupy.asnumpy(x), np.arange(12, dtype=np.float32) + self.world - 1)
        gathered = bagua_core.allgather(cupy.full((3,), self.rank, dtype=cupy.int32))
        np.testing.assert_array_equal(
            cupy.asnumpy(cupy.from_dlpack(gathered)).reshape(-1), np.repeat(np.arange(self.world, dtype=np.int32), 3)
        )


for _name in ALGORITHMS:
    setattr(Worker, f"{_name}_cuda_matches_cpu", lambda self, n=_name: self.matches_cpu(n))


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__, SESSIONS, case_names, timeout=240, test_timeout=300, skip_reason=gpu_skip_reason, marks=(pytest.mark.gpu,)
)


if __name__ == "__main__":
    worker_main(Worker, case_names)
