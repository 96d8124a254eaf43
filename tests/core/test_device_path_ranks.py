"""The engine's device path across real processes, on the host implementation
of a Device (``_C.Device.host``: host memory, every stream an ordered queue
with its own thread and delay), over Gloo through host staging
(``_C.stage_through_host``): the code a GPU runs, with CUDA streams and NCCL
or staged Gloo, minus the CUDA calls.

Every algorithm step, flat and hierarchical, is run on the device path and on
the plain host path over the same data for three steps, and the buckets (and
results of weight steps) must be bitwise equal. Each comparison runs twice:
with a slow producer stream (the comm stream must wait for the producer's
event) and with slow comm streams (the consumer stream must wait for the
comm streams before it reads, and copy_back must follow that order). Removing
either wait makes these cases fail. The staged communicator alone is checked
against numpy.

This file is also the worker script (one multi-process session per
configuration).
"""

from __future__ import annotations

import sys
import zlib

from tests.harness.mp import Session, session_tests

SESSIONS = {
    "flat3": (3, None),
    "hier4": (4, 2),
}
SLOW_US = 3000  # per queued task on the slow side of each ordering

STEPS = {  # case -> (step, params, weights?)
    "centralized": ("centralized_allreduce", {"hierarchical": False, "average": True}, False),
    "bytegrad": ("bytegrad", {"hierarchical": False, "average": True}, False),
    "halfgrad": ("halfgrad", {"hierarchical": False, "average": True, "wire": "bfloat16"}, False),
    "qadam": ("qadam", {"hierarchical": False, "warmup_steps": 1, "beta1": "0.9"}, False),
    "decentralized_all": (
        "decentralized",
        {"hierarchical": False, "peer_selection_mode": "all", "communication_interval": 1},
        True,
    ),
    "low_precision_decentralized": (
        "low_precision_decentralized",
        {"hierarchical": False, "communication_interval": 1},
        True,
    ),
}
HIER_STEPS = {
    "hierarchical_centralized": ("centralized_allreduce", {"hierarchical": True, "average": True}, False),
    "hierarchical_bytegrad": ("bytegrad", {"hierarchical": True, "average": False}, False),
    "hierarchical_halfgrad": ("halfgrad", {"hierarchical": True, "average": False, "wire": "float16"}, False),
    "decentralized_shift_one": (
        "decentralized",
        {"hierarchical": False, "peer_selection_mode": "shift_one", "communication_interval": 1},
        True,
    ),
}


def case_names(session: str):
    steps = dict(STEPS, **HIER_STEPS) if SESSIONS[session][1] else STEPS
    return ["staged_allreduce_matches_numpy"] + [
        f"{c}_{slow}" for c in steps for slow in ("slow_producer", "slow_comm")
    ]


# ---------------------------------------------------------------- worker side

DECLS = [("a", (37,)), ("b", (5, 7)), ("c", (129,))]  # 3 buckets of ~3 tensors each, 2 lanes
N_STEPS = 3


class Worker:
    def __init__(self):
        import numpy as np

        import bagua_core
        from bagua_core import _C, engine

        self.np, self._C, self.E = np, _C, engine
        self.pg = bagua_core.init_process_group()
        self.rank, self.world = self.pg.rank, self.pg.size

    def data(self, case, step, shape):
        rng = self.np.random.default_rng([zlib.crc32(case.encode()), self.rank, step])
        return rng.normal(size=shape).astype(self.np.float32)

    def run(self, case, step_name, params, weights, device=None, stream=None):
        """Three steps of `step_name`; returns every bucket's bytes (and the
        results, copied back) after each step."""
        np = self.np
        hierarchical = params.get("hierarchical", False)
        eng = self.E.Engine.for_group(self.pg, hierarchical=hierarchical, lanes=2, device=device, timeout_s=30)
        alignment = eng._core.step_alignment(step_name, params)
        buckets = eng.create_buckets([(n, s, "float32") for n, s in DECLS], bucket_bytes=200, alignment=alignment)
        assert len(buckets) >= 2
        ops = [b.append_op(step_name, **params) for b in buckets]
        out = []
        for step in range(N_STEPS):
            for n, s in DECLS:
                view = _view(eng, n)
                if device is None:
                    np.asarray(view)[...] = self.data(case, step, s)
                else:  # written late on the producer stream: a wrong value first, then the real one
                    device.write_async(view.address, (-self.data(case, step, s)).tobytes(), stream)
                    device.write_async(view.address, self.data(case, step, s).tobytes(), stream)
            if weights:
                eng.mark_all_ready(stream=stream)
            else:
                for n, _ in DECLS:
                    eng.mark_ready(n, stream=stream)
            eng.wait(stream=stream)
            for op in ops:
                if op.has_result:
                    op.copy_back(stream=stream)
            for b in buckets:
                flat = b.flat_view()
                if device is None:
                    out.append(np.asarray(flat).tobytes())
                else:
                    got = np.empty(flat.nbytes, np.uint8)
                    device.copy_async(got.ctypes.data, flat.address, flat.nbytes, stream)
                    device.synchronize(stream)
                    out.append(got.tobytes())
        eng.close()
        return out

    def compare(self, case, slow):
        step_name, params, weights = dict(STEPS, **HIER_STEPS)[case]
        want = self.run(case, step_name, params, weights)
        comm_us, producer_us = (0, SLOW_US) if slow == "slow_producer" else (SLOW_US, 0)
        device = self._C.Device.host(delay_us=comm_us)
        stream = device.new_stream(delay_us=producer_us)
        got = self.run(case, step_name, params, weights, device, stream)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert g == w, (
                f"step {i // (len(want) // N_STEPS)}, bucket {i % (len(want) // N_STEPS)} differs from the host path"
            )

    def staged_allreduce(self):
        np, _C = self.np, self._C
        device = _C.Device.host(delay_us=0)
        stream = device.new_stream(delay_us=SLOW_US)
        staged = _C.stage_through_host(self.pg.clone().comm, device)
        assert staged.device_type == 0 and "staging" in staged.describe()
        x = np.zeros(1001, np.float32)
        mine = np.arange(1001, dtype=np.float32) * (self.rank + 1)
        device.write_async(x.ctypes.data, mine.tobytes(), stream)  # lands SLOW_US later
        staged.allreduce(x.ctypes.data, x.ctypes.data, x.size, 0, 0, stream)  # SUM, after the write
        ref = np.arange(1001, dtype=np.float64) * sum(r + 1 for r in range(self.world))
        np.testing.assert_array_equal(x, ref.astype(np.float32))

    def cases(self, session):
        for name in case_names(session):
            if name == "staged_allreduce_matches_numpy":
                yield name, self.staged_allreduce
            else:
                case, slow = name.rsplit("_slow_", 1)
                yield name, (lambda c=case, s="slow_" + slow: self.compare(c, s))


def _view(eng, name):
    for b in eng.buckets:
        if name in b.tensor_names:
            return b.view(name)
    raise KeyError(name)


def worker_main():
    from tests.harness.worker import run_cases

    sys.exit(1 if run_cases(Worker().cases(sys.argv[1])) else 0)


# ---------------------------------------------------------------- pytest side

test_case, test_session_exits_cleanly = session_tests(
    __file__, {name: Session(world, local) for name, (world, local) in SESSIONS.items()}, case_names
)

if __name__ == "__main__":
    worker_main()
