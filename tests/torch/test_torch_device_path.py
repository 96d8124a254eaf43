"""``with_bagua`` on the engine's device path, across real processes, without
a GPU: under ``bagua_core.devices.host_stand_in`` the model's CPU tensors are
bucketed on the host implementation of a Device (every stream an ordered
queue on its own thread, each task delayed), the lanes communicate through
host staging, and the torch glue hands the engine its streams (none on the
host: wait() then blocks until the device finished) — the code path a CUDA
model takes, minus the CUDA calls.

Each algorithm trains the same model from the same data twice, on the plain
host path and on the device path; the weights must be bitwise equal after
every step. Asynchronous model average (timing-dependent) averages on the
device path until abort() leaves every rank with the same weights. A model
on two devices is refused with a clear error.

One multi-process session per configuration (this file is also the worker
script); pytest reports each case on its own.
"""

from __future__ import annotations

from tests.harness.mp import Session, session_tests
from tests.harness.torch_worker import TorchWorker, worker_main

SESSIONS = {"w3": (3, None), "w4n2": (4, 2)}
DELAY_US = 1500  # per queued task: a missing wait reads stale memory
STEPS = 4

ALGORITHMS = [
    "gradient_allreduce",
    "bytegrad",
    "bytegrad_error_feedback",
    "decentralized",
    "low_precision_decentralized",
    "qadam",
    "low_rank",
    "local_steps",
    "local_steps_compressed",
]
# on 4 ranks as 2 nodes only (shift_one pairs peers: an even count)
HIERARCHICAL = [
    "decentralized_shift_one",
    "gradient_allreduce_hierarchical",
    "bytegrad_hierarchical",
    "low_precision_decentralized_hierarchical",
    "local_steps_compressed_hierarchical",
]


def case_names(session: str):
    names = [f"{a}_matches_host_path" for a in ALGORITHMS]
    if SESSIONS[session][1]:
        names += [f"{a}_matches_host_path" for a in HIERARCHICAL]
    return names + ["async_model_average_ends_equal_everywhere", "two_devices_refused"]


class Worker(TorchWorker):
    def make(self, name, model):
        base = name.removesuffix("_hierarchical")
        return self.optimizer_and_algorithm(base, model, hierarchical=name != base)

    def train(self, name, device_path):
        import bagua_core.devices as devices

        model = self.mlp(7, hidden=24)
        opt, algo = self.make(name, model)
        trajectory = []
        if device_path:
            with devices.host_stand_in(DELAY_US):
                model = model.with_bagua([opt], algo)
            assert model.bagua_ddp.engine.device is not None, "the device path was not taken"
        else:
            model = model.with_bagua([opt], algo)
            assert model.bagua_ddp.engine.device is None
        for step in range(STEPS):
            x, y = self.batch(step)
            opt.zero_grad()
            self.torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            trajectory.append(self.flat(model).clone())
        model.bagua_ddp.close()
        return trajectory

    def matches(self, name):
        host = self.train(name, device_path=False)
        device = self.train(name, device_path=True)
        for step, (h, d) in enumerate(zip(host, device)):
            if not self.torch.equal(h, d):
                err = (h - d).abs().max().item()
                raise AssertionError(f"step {step}: the device path differs from the host path (max {err:.3g})")
        assert not self.torch.equal(host[0], host[-1]), "training did not change the weights"

    def two_devices_refused(self):
        model = self.mlp(3)
        model[2].to("meta")
        opt = self.torch.optim.SGD(model.parameters(), lr=0.1)
        self.expect_error(
            ValueError,
            lambda: model.with_bagua([opt], self.A.gradient_allreduce.GradientAllReduceAlgorithm()),
            "2 devices",
            "meta",
            "one device per process",
        )

    def async_model_average_ends_equal_everywhere(self):
        import time

        import bagua_core.devices as devices

        torch = self.torch
        model = self.mlp(3 + self.rank)  # different starts: only the averaging makes them equal
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        algo = self.A.async_model_average.AsyncModelAverageAlgorithm(sync_interval_ms=5, warmup_steps=2)
        with devices.host_stand_in(30 * DELAY_US):  # the loop's copies and applies outlast abort()'s return
            model = model.with_bagua([opt], algo)
        ddp = model.bagua_ddp
        assert ddp.engine.device is not None and ddp.weight_buckets[0].device is not None
        for step in range(12):
            x, y = self.batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        algo.abort(model)  # right after a step: its last round changes the weights
        assert ddp.averager.rounds > 0
        after = self.flat(model)
        time.sleep(0.3)
        assert self.torch.equal(after, self.flat(model)), "the weights changed after abort() returned"
        self.same_everywhere(after)
        ddp.close()


for _name in ALGORITHMS + HIERARCHICAL:
    setattr(Worker, f"{_name}_matches_host_path", lambda self, n=_name: self.matches(n))


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, local) for name, (world, local) in SESSIONS.items()},
    case_names,
    timeout=240,
    test_timeout=300,
)


if __name__ == "__main__":
    worker_main(Worker, case_names)
