"""Top-byte packing of float32 allreduces (BAGUA_WIRE_PACKING):

* the kernel (kernels/top_byte_pack.h) gives back the exact bits of random,
  gradient-like and adversarial data (all 256 top bytes, NaN payloads,
  infinities, -0.0, denormals), at tiny and odd sizes; a corrupt size raises;
* the packed allreduce (comm/gloo/packed_allreduce.h), forced on with tiny
  segments and windows, over 2 and 3 real processes, SUM and AVG, in and out of place,
  equals numpy summing in rank order bitwise, and for 2 ranks equals the
  unpacked path (Gloo's ring) bitwise; `auto` keeps Gloo's ring on loopback
  and switches when every rank finds the link slow; `off` never packs;
* GradientAllReduce trained with packing on equals packing off bitwise (2 ranks);
* a peer killed during packed allreduces makes the survivors raise within the timeout.

This file is also the worker script.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

from tests.harness.built_with import needs_test_bindings
from tests.harness.mp import launch
from tests.harness.worker import StoreSession, open_store, wait_for_survivors

SUM, AVG = 0, 10
F32 = 0
TIMEOUT_S = 10.0


def ptr(a):
    return a.ctypes.data


# ---------------------------------------------------------------- kernel


def adversarial(n, seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 24, n, dtype=np.uint64).astype(np.uint32)
    bits |= (np.arange(n, dtype=np.uint32) % 256) << 24  # every top byte
    special = np.array(
        [
            0x7FC00000,
            0x7FC00001,
            0xFFBFFFFF,
            0x7F800001,
            0x7F800000,
            0xFF800000,
            0x80000000,
            0x00000000,
            0x00000001,
            0x807FFFFF,
            0x007FFFFF,
            0x7F7FFFFF,
        ],
        dtype=np.uint32,
    )
    k = min(n, special.size)
    bits[:k] = special[:k]
    return bits


def gradient_like(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 1e-3).astype(np.float32).view(np.uint32)


def pack(bits, limit):
    from bagua_core import _C

    out = np.zeros(max(1, limit), np.uint8)
    size = _C._top_byte_pack(ptr(bits), bits.size, ptr(out), limit)
    return out[:size] if size else None


def unpack(packed, n):
    from bagua_core import _C

    out = np.zeros(n, np.uint32)
    _C._top_byte_unpack(ptr(packed), packed.size, n, ptr(out), False)
    return out


SIZES = [1, 2, 3, 4, 5, 15, 16, 17, 18, 19, 25, 26, 31, 1001, 4095, 4096, 65537]


def isas():
    from bagua_core import compression

    return compression.supported_cpu_isas()


@pytest.fixture(params=["baseline", "avx2", "avx512"])
def isa(request):
    """Runs the test with the kernels of one instruction set (skipped where unsupported)."""
    from bagua_core import compression

    if request.param not in isas():
        pytest.skip(f"{request.param} is not supported here")
    before = compression.cpu_isa()
    compression.set_cpu_isa(request.param)
    yield request.param
    compression.set_cpu_isa(before)


def sparse_escapes(n, seed):
    """Gradient-like values with a rare odd top byte: escapes in some 8-value groups only."""
    bits = gradient_like(n, seed)
    rng = np.random.default_rng(seed)
    k = rng.choice(n, size=max(1, n // 50), replace=False)
    bits[k] = (bits[k] & 0x00FFFFFF) | (rng.integers(0, 256, k.size).astype(np.uint32) << 24)
    return bits


@needs_test_bindings
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["random", "gradient", "adversarial", "sparse_escapes"])
def test_kernel_round_trip_bitwise(isa, kind, n):
    rng = np.random.default_rng(n)
    bits = {
        "random": lambda: rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32),
        "gradient": lambda: gradient_like(n, n),
        "adversarial": lambda: adversarial(n, n),
        "sparse_escapes": lambda: sparse_escapes(n, n),
    }[kind]()
    packed = pack(bits, 5 * n + 64)  # a limit it always fits in
    assert packed is not None
    escapes = packed.size - (16 + (n + 1) // 2 + 3 * n)
    assert 0 <= escapes <= n
    np.testing.assert_array_equal(unpack(packed, n), bits)


@needs_test_bindings
@pytest.mark.parametrize("kind", ["gradient", "sparse_escapes", "adversarial"])
def test_kernel_every_isa_writes_the_same_bytes(kind):
    from bagua_core import compression

    before = compression.cpu_isa()
    try:
        for n in (17, 1001, 65537):
            bits = {"gradient": gradient_like, "sparse_escapes": sparse_escapes, "adversarial": adversarial}[kind](n, 3)
            outs = {}
            for name in isas():
                compression.set_cpu_isa(name)
                p = pack(bits, 5 * n + 64)
                outs[name] = (p.tobytes(), pack(bits, 4 * n) is None)
            assert len(set(outs.values())) == 1, {k: (len(v[0]), v[1]) for k, v in outs.items()}
    finally:
        compression.set_cpu_isa(before)


@needs_test_bindings
def test_kernel_packs_gradients_smaller_and_refuses_what_would_not_shrink():
    n = 100003
    g = gradient_like(n, 1)
    packed = pack(g, 4 * n)
    assert packed is not None and packed.size < 0.9 * 4 * n, packed
    r = np.random.default_rng(2).integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    assert pack(r, 4 * n) is None  # random top bytes: packing would not shrink it


@needs_test_bindings
def test_kernel_unpack_add_is_float32_sum(isa):
    from bagua_core import _C

    n = 4099
    x = sparse_escapes(n, 3)
    x[np.isnan(x.view(np.float32))] = 0
    acc = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    want = acc + x.view(np.float32)
    packed = pack(x, 4 * n)
    _C._top_byte_unpack(ptr(packed), packed.size, n, ptr(acc), True)
    np.testing.assert_array_equal(acc.view(np.uint32), want.view(np.uint32))


@needs_test_bindings
def test_kernel_corrupt_size_raises():
    from bagua_core import _C

    n = 1000
    packed = pack(adversarial(n, 5), 5 * n)
    out = np.zeros(n, np.uint32)
    for bytes_ in (packed.size - 1, packed.size + 1, 10):
        buf = np.zeros(packed.size + 8, np.uint8)
        buf[: packed.size] = packed
        with pytest.raises(_C.BaguaError, match="packed segment"):
            _C._top_byte_unpack(ptr(buf), bytes_, n, ptr(out), False)


# ---------------------------------------------------------------- worker side


def rank_order(inputs, op, world):
    acc = inputs[0].copy()
    for x in inputs[1:]:
        acc = acc + x
    if op == AVG:
        acc = acc / np.float32(world)
    return acc.astype(np.float32)


class Session(StoreSession):
    def __init__(self):
        super().__init__()
        _C = self._C
        # shm=False: these processes share a host, where allreduces would take shared memory.
        tuned = dict(lanes=2, lane_threshold_bytes=0, segment_bytes=64, shm=False)
        self.on = _C._create_gloo_communicator_tuned(
            self.store,
            "on",
            self.rank,
            self.world,
            TIMEOUT_S,
            "127.0.0.1",
            **tuned,
            wire_packing="on",
            wire_packing_min_bytes=0,
            wire_packing_segment_bytes=4096,
            wire_packing_window_bytes=12000,  # the largest calls below run as several windows
        )
        self.off = _C._create_gloo_communicator_tuned(
            self.store, "off", self.rank, self.world, TIMEOUT_S, "127.0.0.1", **tuned, wire_packing="off"
        )
        self.auto = _C.create_gloo_communicator(
            self.store, "auto", self.rank, self.world, TIMEOUT_S, "127.0.0.1", shm=False, wire_packing="auto"
        )

    def inputs(self, n, seed, kind):
        make = gradient_like if kind == "gradient" else adversarial
        out = []
        for k in range(self.world):
            x = make(n, 1000 * seed + k).view(np.float32).copy()
            if kind == "finite":
                x[~np.isfinite(x)] = 1.5  # NaN payloads do not survive numpy's additions bitwise
            out.append(x)
        return out

    def packed_equals_rank_order(self):
        totals0 = self._C.wire_packing_totals()
        for n in (1, 2, 7, 33, 1001, 2049, 50001):
            for op in (SUM, AVG):
                for kind in ("gradient", "finite"):
                    xs = self.inputs(n, n + op, kind)
                    out = np.empty(n, np.float32)
                    self.on.allreduce(ptr(xs[self.rank]), ptr(out), n, F32, op)
                    want = rank_order(xs, op, self.world)
                    np.testing.assert_array_equal(
                        out.view(np.uint32), want.view(np.uint32), err_msg=f"n={n} op={op} {kind}"
                    )
                    if self.world == 2:  # the unpacked path (Gloo's ring) gives the same bits
                        ref = np.empty(n, np.float32)
                        self.off.allreduce(ptr(xs[self.rank]), ptr(ref), n, F32, op)
                        np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))
        totals = self._C.wire_packing_totals()
        assert totals["packed_messages"] > totals0["packed_messages"], totals
        assert totals["wire_bytes"] - totals0["wire_bytes"] < totals["raw_bytes"] - totals0["raw_bytes"], totals

    def packed_in_place(self):
        n = 20011
        xs = self.inputs(n, 7, "gradient")
        buf = xs[self.rank].copy()
        self.on.allreduce(ptr(buf), ptr(buf), n, F32, AVG)
        want = rank_order(xs, AVG, self.world)
        np.testing.assert_array_equal(buf.view(np.uint32), want.view(np.uint32))

    def nan_payloads_pass_through(self):
        # One rank's NaN/Inf against the others' zeros: IEEE addition keeps the payload.
        n = 4096
        xs = [np.zeros(n, np.float32) for _ in range(self.world)]
        xs[0] = adversarial(n, 9).view(np.float32)
        out = np.empty(n, np.float32)
        self.on.allreduce(ptr(xs[self.rank]), ptr(out), n, F32, SUM)
        want = rank_order(xs, SUM, self.world)
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))

    def auto_keeps_the_ring_on_loopback(self):
        before = self._C.wire_packing_totals()
        n = 1 << 20  # 4 MiB: packable, but loopback is fast
        xs = self.inputs(n, 11, "gradient")
        out = np.empty(n, np.float32)
        for _ in range(6):  # the ranks vote at the 4th call
            self.auto.allreduce(ptr(xs[self.rank]), ptr(out), n, F32, SUM)
        np.testing.assert_allclose(out, rank_order(xs, SUM, self.world), rtol=1e-6, atol=1e-9)  # ring order
        assert self._C.wire_packing_totals() == before

    def auto_switches_when_every_rank_finds_the_link_slow(self):
        # A threshold above any loopback rate: every rank votes "slow" at the 2nd call.
        c = self._C._create_gloo_communicator_tuned(
            self.store,
            "auto_slow",
            self.rank,
            self.world,
            TIMEOUT_S,
            "127.0.0.1",
            2,
            8 << 20,
            4 << 20,
            shm=False,
            wire_packing="auto",
            wire_packing_min_bytes=4096,
            wire_packing_slow_bits_per_s=1e18,
        )
        n = 30011
        xs = self.inputs(n, 17, "gradient")
        counts = []
        want = rank_order(xs, AVG, self.world)
        for call in range(6):  # the ranks vote at the 4th call
            out = np.empty(n, np.float32)
            before = self._C.wire_packing_totals()
            c.allreduce(ptr(xs[self.rank]), ptr(out), n, F32, AVG)
            counts.append(self._C.wire_packing_totals()["packed_messages"] - before["packed_messages"])
            if call < 3:  # Gloo's ring: its own order of additions
                np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-9)
            else:
                np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
        assert counts[:3] == [0, 0, 0] and min(counts[3:]) > 0, counts

    def off_never_packs(self):
        before = self._C.wire_packing_totals()
        n = 50001
        xs = self.inputs(n, 13, "gradient")
        out = np.empty(n, np.float32)
        self.off.allreduce(ptr(xs[self.rank]), ptr(out), n, F32, SUM)
        assert self._C.wire_packing_totals() == before

    def bad_setting_raises(self):
        with pytest.raises(ValueError, match="wire_packing"):
            self._C.create_gloo_communicator(
                self.store, "bad", self.rank, self.world, TIMEOUT_S, "127.0.0.1", wire_packing="sometimes"
            )

    def different_settings_raise_on_every_rank(self):
        mode = ("on", "off", "auto")[self.rank % 3]
        with pytest.raises(self._C.MismatchError, match="BAGUA_WIRE_PACKING differs .*rank 0 'on', rank 1 'off'"):
            self._C.create_gloo_communicator(
                self.store, "differ", self.rank, self.world, TIMEOUT_S, "127.0.0.1", shm=False, wire_packing=mode
            )

    def cases(self):
        return [(name, getattr(self, name)) for name in CASES]


CASES = [
    "packed_equals_rank_order",
    "packed_in_place",
    "nan_payloads_pass_through",
    "auto_keeps_the_ring_on_loopback",
    "auto_switches_when_every_rank_finds_the_link_slow",
    "off_never_packs",
    "bad_setting_raises",
    "different_settings_raise_on_every_rank",
]


def kill_session(victim: int):
    """Rank `victim` is SIGKILLed while packed allreduces are in flight."""
    from bagua_core import _C
    from tests.harness.worker import report

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    server, store = open_store(_C, rank)
    timeout_s = 5.0
    c = _C.create_gloo_communicator(store, "world", rank, world, timeout_s, "127.0.0.1", shm=False, wire_packing="on")
    a = gradient_like(4 << 20, rank).view(np.float32).copy()  # 16 MiB
    c.allreduce(ptr(a), ptr(a), a.size, F32, SUM)  # warm up, packed
    assert _C.wire_packing_totals()["packed_messages"] > 0
    c.barrier()
    if rank == victim:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        while True:
            c.allreduce(ptr(a), ptr(a), a.size, F32, AVG)
    t0 = time.monotonic()
    try:
        for _ in range(200):
            c.allreduce(ptr(a), ptr(a), a.size, F32, AVG)
    except (_C.PeerError, _C.CommTimeoutError, _C.BaguaError) as e:
        elapsed = time.monotonic() - t0
        ok = elapsed < timeout_s + 2.0
        report("survivor_raises", ok, "" if ok else f"took {elapsed:.1f}s", elapsed=elapsed, message=str(e))
    else:
        report("survivor_raises", False, "allreduce kept succeeding with a dead peer")
    wait_for_survivors(store, rank, world, victim)


def train_session(out_path: str):
    """GradientAllReduce on a 2 MiB MLP (one bucket, above the packed path's
    1 MiB threshold); writes rank 0's final weights and the packing totals."""
    import json

    import torch

    import bagua_torch
    from bagua_core import _C

    torch.set_num_threads(1)
    group = bagua_torch.init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model = model.with_bagua([opt], bagua_torch.algorithms.GradientAllReduceAlgorithm())
    for step in range(6):
        g = torch.Generator().manual_seed(100 * step + group.rank)
        x = torch.randn(16, 512, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    if group.rank == 0:
        np.save(out_path, flat)
        with open(out_path + ".json", "w") as f:
            json.dump(_C.wire_packing_totals(), f)
    model.bagua_ddp.close()


def worker_main():
    if sys.argv[1] == "kill":
        return kill_session(int(sys.argv[2]))
    if sys.argv[1] == "train":
        return train_session(sys.argv[2])
    s = Session()
    s.run_and_exit(s.auto)


# ---------------------------------------------------------------- pytest side

import functools  # noqa: E402


@functools.lru_cache(maxsize=None)
def session(kind: str, world: int, *args: str):
    return launch(os.path.abspath(__file__), world, timeout=90, args=[kind, *args])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("case", CASES)
def test_allreduce(world, case):
    session("cases", world).check_case(case, world)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_session_exits_cleanly(world):
    run = session("cases", world)
    assert run.ok(), run.summary()


@pytest.mark.timeout(60)
def test_peer_killed_during_packed_allreduce():
    victim = 2
    run = session("kill", 3, str(victim))
    assert not run.timed_out, run.summary()
    assert run.workers[victim].returncode == -signal.SIGKILL, run.summary()
    cases = run.cases()
    for r in (0, 1):
        assert run.workers[r].returncode == 0, run.summary()
        rec = cases["survivor_raises"][r]
        assert rec["ok"], f"rank {r}: {rec}"
        assert "allreduce(float32" in rec["message"], rec["message"]


@pytest.mark.timeout(180)
def test_gradient_allreduce_packing_on_equals_off_bitwise(tmp_path):
    import json

    pytest.importorskip("torch")
    weights = {}
    for mode in ("on", "off"):
        out = str(tmp_path / f"{mode}.npy")
        run = launch(
            os.path.abspath(__file__),
            2,
            timeout=120,
            args=["train", out],
            env={"BAGUA_WIRE_PACKING": mode, "BAGUA_SHM": "0"},
        )  # one host: no shared memory
        assert run.ok(), run.summary()
        weights[mode] = np.load(out)
        totals = json.load(open(out + ".json"))
        assert (totals["packed_messages"] > 0) == (mode == "on"), (mode, totals)
    np.testing.assert_array_equal(weights["on"].view(np.uint32), weights["off"].view(np.uint32))


if __name__ == "__main__":
    worker_main()
