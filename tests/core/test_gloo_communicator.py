"""GlooCommunicator against numpy: every primitive x reduce op x dtype, on real
processes over loopback TCP, for world sizes 1 to 4; plus failure handling
(a peer killed with SIGKILL mid-collective, a peer that skips a collective),
debug checks and argument validation.

One multi-process session per world size runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
import zlib

import pytest

from tests.harness.mp import launch
from tests.harness.worker import StoreSession, open_store, wait_for_survivors

# bagua DType / ReduceOp codes (csrc/common/dtype.h)
DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int32": 4, "int64": 5, "uint8": 6}
OPS = {"SUM": 0, "PROD": 1, "MIN": 2, "MAX": 3, "AVG": 10}
REDUCING = ("allreduce", "reduce", "reduce_scatter")
PLAIN = ("broadcast", "allgather", "gather", "scatter", "alltoall")
WORLD_SIZES = (1, 2, 3, 4)
COUNT = 13  # elements per chunk: odd, so rings split unevenly
TIMEOUT_S = 10.0


def case_names(world: int):
    names = []
    for prim in REDUCING:
        for dt in DTYPES:
            for op in OPS:
                names.append(f"{prim}[{dt}-{op}]")
    for prim in PLAIN:
        for dt in DTYPES:
            names.append(f"{prim}[{dt}]")
    names += [
        "allreduce_in_place",
        "allreduce_segmented_two_lanes",
        "reduce_scatter_segmented",
        "reduce_scatter_in_place",
        "reduce_scatter_count_1",
        "allgather_in_place",
        "allgather_overlapping_source",
        "alltoall_in_place",
        "alltoall_allgather_multi_mib_bitwise",
        "alltoall_v_uneven",
        "count_zero_is_noop",
        "invalid_arguments",
        "barrier",
        "describe_and_properties",
    ]
    if world > 1:
        names += [
            "send_recv_ring",
            "send_recv_ordering",
            "debug_checks_collective_mismatch",
            "debug_checks_p2p_mismatch",
            "debug_checks_alltoall_v_counts",
            "debug_checks_pass_through",
            "promised_calls_run_without_their_agreements",
            "promises_that_differ_fall_back_to_agreements",
            "broken_promise_raises_and_peers_fail_fast",
        ]
    if world == 2:
        names += ["skipped_collective_times_out_then_broken"]
    return names


# ---------------------------------------------------------------- worker side


def _np():
    import numpy as np

    return np


def bf16_bits(x):
    np = _np()
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_float(bits):
    np = _np()
    return (bits.astype(np.uint32) << 16).view(np.float32)


def storage(dt):
    """numpy storage dtype for a bagua dtype (bfloat16 travels as uint16 bits)."""
    np = _np()
    return {
        "float32": np.float32,
        "float64": np.float64,
        "float16": np.float16,
        "bfloat16": np.uint16,
        "int32": np.int32,
        "int64": np.int64,
        "uint8": np.uint8,
    }[dt]


def make_input(case, rank, dt, n, op="SUM"):
    """Deterministic per (case, rank); every rank can rebuild every rank's input."""
    np = _np()
    rng = np.random.default_rng(zlib.crc32(case.encode()) * 131 + rank)
    if dt in ("float32", "float64", "float16", "bfloat16"):
        if op == "PROD":
            vals = rng.choice([-2.0, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0], size=n)
        else:
            vals = rng.integers(-8, 9, size=n) / 4.0  # exact in every float type
        if dt == "bfloat16":
            return bf16_bits(vals.astype(np.float32))
        return vals.astype(storage(dt))
    lo = 0 if dt == "uint8" else -5
    return rng.integers(lo, 6, size=n).astype(storage(dt))


def as_float(a, dt):
    np = _np()
    return bf16_float(a) if dt == "bfloat16" else a.astype(np.float64)


def reference(inputs, dt, op, world):
    """Reduction over ranks, in float64 for float types, wrapping for ints."""
    np = _np()
    if dt in ("float32", "float64", "float16", "bfloat16"):
        x = np.stack([as_float(a, dt) for a in inputs]).astype(np.float64)
        return {"SUM": x.sum(0), "AVG": x.sum(0) / world, "PROD": x.prod(0), "MIN": x.min(0), "MAX": x.max(0)}[op]
    x = np.stack(inputs)
    t = x.dtype
    if op in ("SUM", "AVG"):
        s = x.sum(0, dtype=t)
        if op == "SUM":
            return s
        if dt == "uint8":
            return (s // world).astype(t)
        return (np.sign(s) * (np.abs(s) // world)).astype(t)  # truncates toward zero
    return {"PROD": lambda: x.prod(0, dtype=t), "MIN": lambda: x.min(0), "MAX": lambda: x.max(0)}[op]()


def assert_close(got, want, dt, world):
    np = _np()
    if dt in ("int32", "int64", "uint8"):
        np.testing.assert_array_equal(got, want)
        return
    g = as_float(got, dt)
    tol = {
        "float32": (1e-6, 1e-6),
        "float64": (1e-12, 1e-12),
        "float16": (1e-2, 4e-3 * world),
        "bfloat16": (2e-2, 3e-2 * world),
    }[dt]
    np.testing.assert_allclose(g, want, rtol=tol[0], atol=tol[1])


def assert_equal_bits(got, want):
    _np().testing.assert_array_equal(got, want)


def ptr(a):
    return a.ctypes.data


class Session(StoreSession):
    def __init__(self):
        super().__init__()
        self.comm = self._C.create_gloo_communicator(self.store, "world", self.rank, self.world, TIMEOUT_S, "127.0.0.1")

    def new_comm(self, prefix, timeout_s=TIMEOUT_S, **kw):
        return self._C.create_gloo_communicator(self.store, prefix, self.rank, self.world, timeout_s, "127.0.0.1", **kw)

    # -- reducing primitives --------------------------------------------------

    def reducing(self, prim, dt, op):
        np = _np()
        c, r, w = self.comm, self.rank, self.world
        case = f"{prim}[{dt}-{op}]"
        n = COUNT * w if prim == "reduce_scatter" else COUNT
        inputs = [make_input(case, k, dt, n, op) for k in range(w)]
        want = reference(inputs, dt, op, w)
        send = inputs[r].copy()
        if prim == "allreduce":
            out = np.empty_like(send)
            c.allreduce(ptr(send), ptr(out), n, DTYPES[dt], OPS[op])
            assert_close(out, want, dt, w)
        elif prim == "reduce":
            root = w - 1
            out = np.full_like(send, 77)
            c.reduce(ptr(send), ptr(out), n, DTYPES[dt], OPS[op], root)
            if r == root:
                assert_close(out, want, dt, w)
            else:
                assert (out == 77).all(), "reduce wrote a non-root's output"
        else:
            out = np.empty(COUNT, send.dtype)
            c.reduce_scatter(ptr(send), ptr(out), COUNT, DTYPES[dt], OPS[op])
            assert_close(out, want[r * COUNT : (r + 1) * COUNT], dt, w)
        np.testing.assert_array_equal(send, inputs[r])  # input untouched

    # -- data movement ---------------------------------------------------------

    def plain(self, prim, dt):
        np = _np()
        c, r, w = self.comm, self.rank, self.world
        case = f"{prim}[{dt}]"
        code = DTYPES[dt]
        if prim == "broadcast":
            root = w // 2
            buf = make_input(case, r, dt, COUNT)
            c.broadcast(ptr(buf), COUNT, code, root)
            assert_equal_bits(buf, make_input(case, root, dt, COUNT))
        elif prim == "allgather":
            send = make_input(case, r, dt, COUNT)
            out = np.empty(COUNT * w, send.dtype)
            c.allgather(ptr(send), ptr(out), COUNT, code)
            assert_equal_bits(out, np.concatenate([make_input(case, k, dt, COUNT) for k in range(w)]))
        elif prim == "gather":
            root = w - 1
            send = make_input(case, r, dt, COUNT)
            out = np.zeros(COUNT * w, send.dtype)
            c.gather(ptr(send), ptr(out) if r == root else 0, COUNT, code, root)
            if r == root:
                assert_equal_bits(out, np.concatenate([make_input(case, k, dt, COUNT) for k in range(w)]))
        elif prim == "scatter":
            root = 0
            full = make_input(case, root, dt, COUNT * w)
            send = full if r == root else np.zeros(0, full.dtype)
            out = np.empty(COUNT, full.dtype)
            c.scatter(ptr(send) if r == root else 0, ptr(out), COUNT, code, root)
            assert_equal_bits(out, full[r * COUNT : (r + 1) * COUNT])
        elif prim == "alltoall":
            send = make_input(case, r, dt, COUNT * w)
            out = np.empty_like(send)
            c.alltoall(ptr(send), ptr(out), COUNT, code)
            want = np.concatenate([make_input(case, k, dt, COUNT * w)[r * COUNT : (r + 1) * COUNT] for k in range(w)])
            assert_equal_bits(out, want)

    # -- special cases ---------------------------------------------------------

    def allreduce_in_place(self):
        np = _np()
        a = np.arange(1000, dtype=np.float32) * (self.rank + 1)
        self.comm.allreduce(ptr(a), ptr(a), a.size, 0, OPS["SUM"])
        w = self.world
        np.testing.assert_array_equal(a, np.arange(1000, dtype=np.float32) * (w * (w + 1) // 2))

    def allreduce_segmented_two_lanes(self):
        # Tiny segments and a zero lane threshold run the pipelined ring with
        # many segments on both lanes, with buffers small enough for a test.
        np = _np()
        c = self._C._create_gloo_communicator_tuned(
            self.store, "tuned", self.rank, self.world, TIMEOUT_S, "127.0.0.1", 2, 0, 64
        )
        for n in (1, 2, 7, 1001):
            for dt, op in (("float32", "SUM"), ("bfloat16", "MAX"), ("int64", "AVG")):
                inputs = [make_input(f"lanes{n}{dt}", k, dt, n, op) for k in range(self.world)]
                out = np.empty_like(inputs[0])
                c.allreduce(ptr(inputs[self.rank]), ptr(out), n, DTYPES[dt], OPS[op])
                assert_close(out, reference(inputs, dt, op, self.world), dt, self.world)
                chunk = np.empty(n, inputs[0].dtype)
                big = [make_input(f"rs{n}{dt}", k, dt, n * self.world, op) for k in range(self.world)]
                c.reduce_scatter(ptr(big[self.rank]), ptr(chunk), n, DTYPES[dt], OPS[op])
                want = reference(big, dt, op, self.world)[self.rank * n : (self.rank + 1) * n]
                assert_close(chunk, want, dt, self.world)
                root = n % self.world
                red = np.zeros_like(inputs[0])
                c.reduce(ptr(inputs[self.rank]), ptr(red), n, DTYPES[dt], OPS[op], root)
                if self.rank == root:
                    assert_close(red, reference(inputs, dt, op, self.world), dt, self.world)

    def reduce_scatter_segmented(self):
        # 1.25M float32 (5 MB) per chunk: more than one default 4 MiB segment.
        np = _np()
        n = 1_250_000
        send = np.full(n * self.world, self.rank + 1, np.float32)
        send[::7] = -1.0
        out = np.empty(n, np.float32)
        self.comm.reduce_scatter(ptr(send), ptr(out), n, 0, OPS["SUM"])
        w = self.world
        want = np.full(n * w, w * (w + 1) / 2, np.float32)
        want[::7] = -w
        np.testing.assert_array_equal(out, want[self.rank * n : (self.rank + 1) * n])

    def reduce_scatter_in_place(self):
        np = _np()
        w, r = self.world, self.rank
        buf = np.arange(COUNT * w, dtype=np.int64) + r
        self.comm.reduce_scatter(ptr(buf), ptr(buf) + r * COUNT * 8, COUNT, DTYPES["int64"], OPS["SUM"])
        want = (np.arange(COUNT * w, dtype=np.int64) * w + w * (w - 1) // 2)[r * COUNT : (r + 1) * COUNT]
        np.testing.assert_array_equal(buf[r * COUNT : (r + 1) * COUNT], want)

    def reduce_scatter_count_1(self):
        np = _np()
        send = np.arange(self.world, dtype=np.float64) * (self.rank + 1)
        out = np.empty(1, np.float64)
        self.comm.reduce_scatter(ptr(send), ptr(out), 1, DTYPES["float64"], OPS["MAX"])
        assert out[0] == self.rank * self.world

    def allgather_in_place(self):
        np = _np()
        w, r = self.world, self.rank
        buf = np.full(COUNT * w, -1, np.int32)
        buf[r * COUNT : (r + 1) * COUNT] = np.arange(COUNT) + 100 * r
        self.comm.allgather(ptr(buf) + r * COUNT * 4, ptr(buf), COUNT, DTYPES["int32"])
        np.testing.assert_array_equal(buf, np.concatenate([np.arange(COUNT) + 100 * k for k in range(w)]))

    def allgather_overlapping_source(self):
        """The source overlaps recv but is not my block: it is read before any block arrives."""
        np = _np()
        w, r = self.world, self.rank
        buf = np.full(COUNT * w + 1, -1, np.int32)
        src = 1  # starts inside block 0, ends inside block 1 (for w > 1)
        buf[src : src + COUNT] = np.arange(COUNT) + 100 * r
        self.comm.allgather(ptr(buf) + src * 4, ptr(buf), COUNT, DTYPES["int32"])
        np.testing.assert_array_equal(buf[: COUNT * w], np.concatenate([np.arange(COUNT) + 100 * k for k in range(w)]))

    def alltoall_in_place(self):
        np = _np()
        w, r = self.world, self.rank
        buf = np.concatenate([np.arange(COUNT) + 1000 * r + 10 * j for j in range(w)]).astype(np.int64)
        self.comm.alltoall(ptr(buf), ptr(buf), COUNT, DTYPES["int64"])
        np.testing.assert_array_equal(buf, np.concatenate([np.arange(COUNT) + 1000 * k + 10 * r for k in range(w)]))

    def alltoall_allgather_multi_mib_bitwise(self):
        """Blocks of a few MiB (an odd number of bytes) arrive bitwise, as ByteGrad's records do."""
        np = _np()
        w, r = self.world, self.rank
        block = (3 << 20) + 7
        mine = [np.random.default_rng([r, j]).integers(0, 256, block, dtype=np.uint8) for j in range(w)]
        out = np.empty(block * w, np.uint8)
        send = np.concatenate(mine)  # named: a temporary's memory would be freed before the call reads it
        self.comm.alltoall(ptr(send), ptr(out), block, DTYPES["uint8"])
        want = [np.random.default_rng([k, r]).integers(0, 256, block, dtype=np.uint8) for k in range(w)]
        np.testing.assert_array_equal(out, np.concatenate(want))
        self.comm.allgather(ptr(mine[0]), ptr(out), block, DTYPES["uint8"])
        want = [np.random.default_rng([k, 0]).integers(0, 256, block, dtype=np.uint8) for k in range(w)]
        np.testing.assert_array_equal(out, np.concatenate(want))

    def alltoall_v_uneven(self):
        # rank i sends (i + j) % 3 elements (maybe none) to rank j, from and to
        # displacements with gaps, in reverse order of rank.
        np = _np()
        w, r = self.world, self.rank
        cnt = lambda i, j: (i + j) % 3  # noqa: E731
        send_counts = [cnt(r, j) for j in range(w)]
        recv_counts = [cnt(i, r) for i in range(w)]
        send_displs, off = [0] * w, 1
        for j in reversed(range(w)):
            send_displs[j] = off
            off += send_counts[j] + 2
        send = np.full(off, -1.0)
        for j in range(w):
            send[send_displs[j] : send_displs[j] + send_counts[j]] = 1000 * r + 10 * j + np.arange(send_counts[j])
        recv_displs, off = [0] * w, 3
        for i in range(w):
            recv_displs[i] = off
            off += recv_counts[i] + 1
        recv = np.full(off, -7.0)
        self.comm.alltoall_v(
            ptr(send), send_counts, send_displs, ptr(recv), recv_counts, recv_displs, DTYPES["float64"]
        )
        want = np.full(off, -7.0)
        for i in range(w):
            want[recv_displs[i] : recv_displs[i] + recv_counts[i]] = 1000 * i + 10 * r + np.arange(recv_counts[i])
        np.testing.assert_array_equal(recv, want)

    def count_zero_is_noop(self):
        c = self.comm
        c.allreduce(0, 0, 0, 0, 0)
        c.reduce(0, 0, 0, 0, 0, 0)
        c.broadcast(0, 0, 0, 0)
        c.allgather(0, 0, 0, 0)
        c.gather(0, 0, 0, 0, 0)
        c.scatter(0, 0, 0, 0, 0)
        c.reduce_scatter(0, 0, 0, 0, 0)
        c.alltoall(0, 0, 0, 0)
        c.alltoall_v(0, [0] * self.world, [0] * self.world, 0, [0] * self.world, [0] * self.world, 0)
        if self.world > 1:
            c.send(0, 0, 0, (self.rank + 1) % self.world)
            c.recv(0, 0, 0, (self.rank + 1) % self.world)
        self.allreduce_in_place()  # still in step afterwards

    def invalid_arguments(self):
        np = _np()
        c, w, r = self.comm, self.world, self.rank
        a = np.zeros(4 * w, np.float32)
        p = ptr(a)
        bad = [
            lambda: c.broadcast(p, 4, 0, w),
            lambda: c.broadcast(p, 4, 0, -1),
            lambda: c.reduce(p, p, 4, 0, 0, w + 3),
            lambda: c.gather(p, p, 4, 0, w),
            lambda: c.scatter(p, p, 4, 0, -2),
            lambda: c.send(p, 4, 0, r),
            lambda: c.send(p, 4, 0, w),
            lambda: c.recv(p, 4, 0, -1),
            lambda: c.allreduce(0, p, 4, 0, 0),
            lambda: c.allreduce(p, 0, 4, 0, 0),
            lambda: c.allgather(p, 0, 4, 0),
            lambda: c.allreduce(p, p, 4, 99, 0),
            lambda: c.allreduce(p, p, 4, 0, 7),
            lambda: c.allreduce(p, p, -1, 0, 0),
            lambda: c.alltoall_v(p, [1] * (w + 1), [0] * (w + 1), p, [1] * w, [0] * w, 0),
            lambda: c.alltoall_v(p, [1] * w, [0] * (w - 1), p, [1] * w, [0] * w, 0),
            lambda: c.alltoall_v(p, [-1] * w, [0] * w, p, [1] * w, [0] * w, 0),
            lambda: c.alltoall_v(p, [1] * w, [2**62] * w, p, [1] * w, list(range(w)), 0),
        ]
        if w > 1:
            bad.append(lambda: c.alltoall_v(p, [1] * w, list(range(w)), p, [1] * w, [0] * w, 0))  # overlap
            bad.append(
                lambda: c.alltoall_v(p, [1] * w, list(range(w)), p, [2] * w, list(range(0, 2 * w, 2)), 0)
            )  # self count differs
        for i, fn in enumerate(bad):
            try:
                fn()
            except ValueError as e:
                assert "gloo group" in str(e) or "must be" in str(e) or "unknown" in str(e), str(e)
            else:
                raise AssertionError(f"invalid call #{i} did not raise ValueError")
        self.allreduce_in_place()  # nothing was consumed: still in step

    def barrier(self):
        for _ in range(3):
            self.comm.barrier()

    def describe_and_properties(self):
        c = self.comm
        assert c.rank == self.rank and c.size == self.world
        assert c.describe() == f"gloo group 'world' rank {self.rank}/{self.world}", c.describe()
        assert abs(c.timeout_s - TIMEOUT_S) < 1e-3
        h = self._C.register_communicator(c)
        self._C.unregister_communicator(h)

    def send_recv_ring(self):
        np = _np()
        w, r = self.world, self.rank
        nxt, prv = (r + 1) % w, (r - 1) % w
        for dt in DTYPES:
            mine = make_input(f"ring{dt}", r, dt, 257)
            got = np.empty_like(mine)
            # even ranks send first, odd ranks receive first: no cycle of waits
            if r % 2 == 0:
                self.comm.send(ptr(mine), mine.size, DTYPES[dt], nxt)
                self.comm.recv(ptr(got), got.size, DTYPES[dt], prv)
            else:
                self.comm.recv(ptr(got), got.size, DTYPES[dt], prv)
                self.comm.send(ptr(mine), mine.size, DTYPES[dt], nxt)
            assert_equal_bits(got, make_input(f"ring{dt}", prv, dt, 257))

    def send_recv_ordering(self):
        # several messages between ranks 0 and 1, interleaved with collectives
        np = _np()
        r = self.rank
        if r in (0, 1):
            peer = 1 - r
            for k in range(3):
                if r == 0:
                    a, b = np.full(5, k, np.int64), np.full(2, 10 + k, np.int64)  # alive until sent
                    self.comm.send(ptr(a), 5, DTYPES["int64"], peer)
                    self.comm.send(ptr(b), 2, DTYPES["int64"], peer)
                else:
                    a, b = np.empty(5, np.int64), np.empty(2, np.int64)
                    self.comm.recv(ptr(a), 5, DTYPES["int64"], peer)
                    self.comm.recv(ptr(b), 2, DTYPES["int64"], peer)
                    assert (a == k).all() and (b == 10 + k).all()
        self.comm.barrier()
        self.allreduce_in_place()

    def checked(self):
        if not hasattr(self, "_checked"):
            self._checked = self.new_comm("checked", debug_checks=True)
        return self._checked

    def debug_checks_collective_mismatch(self):
        np = _np()
        c = self.checked()
        a = np.ones(10, np.float32)
        try:
            if self.rank == 0:
                c.allreduce(ptr(a), ptr(a), 10, 0, OPS["SUM"])
            else:
                c.broadcast(ptr(a), 10, 0, 0)
        except self._C.MismatchError as e:
            msg = str(e)
            assert (
                "rank 1 called broadcast(float32, count=10, root=0) while rank 0 called "
                "allreduce(float32, count=10, SUM)"
            ) in msg, msg
        else:
            raise AssertionError("no MismatchError")
        # still usable: a matching call goes through
        c.allreduce(ptr(a), ptr(a), 10, 0, OPS["SUM"])
        assert (a == self.world).all()

    def debug_checks_p2p_mismatch(self):
        np = _np()
        c = self.checked()
        if self.rank in (0, 1):
            a = np.zeros(4, np.int32)
            try:  # both ranks send to each other
                c.send(ptr(a), 4, DTYPES["int32"], 1 - self.rank)
            except self._C.MismatchError as e:
                assert "called send(int32, count=4, peer=" in str(e), str(e)
            else:
                raise AssertionError("no MismatchError")
        c.barrier()

    def debug_checks_alltoall_v_counts(self):
        np = _np()
        c, w, r = self.checked(), self.world, self.rank
        recv_counts = [1] * w
        if r == w - 1:
            recv_counts[0] = 2  # expects 2 from rank 0, which sends 1
        send, recv = np.zeros(w, np.float32), np.zeros(2 * w, np.float32)
        try:
            c.alltoall_v(ptr(send), [1] * w, list(range(w)), ptr(recv), recv_counts, [2 * i for i in range(w)], 0)
        except self._C.MismatchError as e:
            assert f"rank 0 sends 1 elements to rank {w - 1}, which expects 2" in str(e), str(e)
        else:
            raise AssertionError("no MismatchError")

    def debug_checks_pass_through(self):
        np = _np()
        c, w, r = self.checked(), self.world, self.rank
        a = np.full(3, r, np.int64)
        out = np.empty(3 * w, np.int64)
        c.allgather(ptr(a), ptr(out), 3, DTYPES["int64"])
        np.testing.assert_array_equal(out, np.repeat(np.arange(w), 3))
        if r < 2:
            b = np.full(2, 5.0) if r == 0 else np.zeros(2)
            (c.send if r == 0 else c.recv)(ptr(b), 2, DTYPES["float64"], 1 - r)
            assert (b == 5.0).all()
        c.barrier()

    # -- promises (Communicator::expect_calls) ----------------------------------

    def promised_sums(self, c, counts):
        """Allreduces (SUM) of `counts` elements, each checked against the reference."""
        np = _np()
        w = self.world
        for n in counts:
            a = np.arange(n, dtype=np.float32) + self.rank
            c.allreduce(ptr(a), ptr(a), n, 0, OPS["SUM"])
            np.testing.assert_array_equal(a, np.arange(n, dtype=np.float32) * w + w * (w - 1) / 2)

    def promised_calls_run_without_their_agreements(self):
        # Every rank promises the same three calls, twice in a row; a promise
        # whose first call is not the one made is dropped (agreed call by call).
        c = self.new_comm("promise_ok")
        for _ in range(2):
            c._expect_calls([(1, 0, 8, -1, 0), (1, 0, 9, -1, 0), (1, 0, 10, -1, 0)])
            self.promised_sums(c, [8, 9, 10])
        c._expect_calls([(1, 0, 5, -1, 0), (1, 0, 6, -1, 0)])
        self.promised_sums(c, [7, 6])
        c.close()

    def promises_that_differ_fall_back_to_agreements(self):
        # Rank 1 promises a different second call, and makes it: the ranks
        # agree call by call, so that call is a MismatchError on every rank,
        # and the communicator keeps working.
        c = self.new_comm("promise_differ")
        second = 9 if self.rank == 1 else 8
        c._expect_calls([(1, 0, 8, -1, 0), (1, 0, second, -1, 0)])
        self.promised_sums(c, [8])
        try:
            self.promised_sums(c, [second])
        except self._C.MismatchError as e:
            assert "allreduce(float32, count=9, SUM)" in str(e) and "count=8" in str(e), str(e)
        else:
            raise AssertionError("no MismatchError")
        self.promised_sums(c, [4])
        c.close()

    def broken_promise_raises_and_peers_fail_fast(self):
        # Every rank promised two allreduces of 8; rank 1 then calls one of 9:
        # it raises without sending anything and closes its connections, so
        # its peers, waiting for the promised call's data, fail at once
        # rather than at their timeout.
        _C = self._C
        c = self.new_comm("promise_broken", timeout_s=30.0)
        c._expect_calls([(1, 0, 8, -1, 0), (1, 0, 8, -1, 0)])
        self.promised_sums(c, [8])
        t0 = time.monotonic()
        try:
            self.promised_sums(c, [9 if self.rank == 1 else 8])
        except _C.BaguaError as e:
            if self.rank == 1:
                assert "had promised allreduce(float32, count=8, SUM)" in str(e), str(e)
        else:
            raise AssertionError("no error")
        assert time.monotonic() - t0 < 10.0
        c.close()

    def skipped_collective_times_out_then_broken(self):
        # Rank 1 skips an allreduce (it is late, then calls a barrier). Rank 0
        # times out (CommTimeoutError) and closes its connections, so rank 1's
        # barrier fails at once with PeerError. Both are broken afterwards.
        # (Had rank 1 called the barrier in time, both would raise
        # MismatchError: see tests/core/test_misuse.py.)
        np = _np()
        _C = self._C
        c = self.new_comm("skip", timeout_s=1.5 if self.rank == 0 else 20.0)
        a = np.ones(8, np.float32)
        t0 = time.monotonic()
        try:
            if self.rank == 0:
                c.allreduce(ptr(a), ptr(a), 8, 0, 0)
            else:
                time.sleep(2.5)
                c.barrier()
        except _C.CommTimeoutError as e:
            assert self.rank == 0, f"rank {self.rank}: {e}"
            assert "allreduce(float32, count=8, SUM) (op #0) timed out after 1500 ms" in str(e), str(e)
        except _C.PeerError as e:
            assert self.rank == 1, f"rank {self.rank}: {e}"
            assert "barrier() (op #0)" in str(e), str(e)
        else:
            raise AssertionError("no error")
        elapsed = time.monotonic() - t0
        assert elapsed < 6.0, elapsed
        t0 = time.monotonic()
        try:
            c.barrier()
        except _C.BaguaError as e:
            assert "communicator broken by an earlier failure" in str(e), str(e)
        else:
            raise AssertionError("broken communicator did not raise")
        assert time.monotonic() - t0 < 0.5
        # the world communicator is unaffected
        self.allreduce_in_place()

    def cases(self):
        out = []
        for name in case_names(self.world):
            if "[" in name:
                prim, rest = name[:-1].split("[")
                if prim in REDUCING:
                    dt, op = rest.split("-")
                    out.append((name, functools.partial(self.reducing, prim, dt, op)))
                else:
                    out.append((name, functools.partial(self.plain, prim, rest)))
            else:
                out.append((name, getattr(self, name)))
        return out


def kill_session(victim: int):
    """Rank `victim` is SIGKILLed while a large allreduce is in flight."""
    import numpy as np

    from bagua_core import _C
    from tests.harness.worker import report

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    server, store = open_store(_C, rank)
    timeout_s = 5.0
    c = _C.create_gloo_communicator(store, "world", rank, world, timeout_s, "127.0.0.1")
    a = np.ones(8 << 20, np.float32)  # 32 MiB
    c.allreduce(ptr(a), ptr(a), 16, 0, 0)  # warm up
    c.barrier()
    if rank == victim:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        while True:
            c.allreduce(ptr(a), ptr(a), a.size, 0, 0)
    t0 = time.monotonic()
    try:
        for _ in range(100):  # the victim dies during one of these
            c.allreduce(ptr(a), ptr(a), a.size, 0, 0)
    except (_C.PeerError, _C.CommTimeoutError, _C.BaguaError) as e:
        elapsed = time.monotonic() - t0
        ok = elapsed < timeout_s + 2.0
        ok = ok and (f"rank {victim} has died" in str(e) or "dead ranks unknown" in str(e))
        report(
            "survivor_raises",
            ok,
            "" if ok else f"took {elapsed:.1f}s or did not name the dead rank",
            kind=type(e).__name__,
            elapsed=elapsed,
            message=str(e),
        )
    else:
        report("survivor_raises", False, "allreduce kept succeeding with a dead peer")
    t0 = time.monotonic()
    try:
        c.barrier()
        report("broken_afterwards", False, "barrier succeeded on a broken communicator")
    except _C.BaguaError as e:
        report(
            "broken_afterwards",
            "communicator broken by an earlier failure" in str(e) and time.monotonic() - t0 < 0.5,
            str(e),
        )
    wait_for_survivors(store, rank, world, victim)


def worker_main():
    if sys.argv[1] == "kill":
        kill_session(int(sys.argv[2]))
        return
    s = Session()
    s.run_and_exit(s.comm)


# ---------------------------------------------------------------- pytest side


@functools.lru_cache(maxsize=None)
def session(kind: str, world: int, *args: str):
    return launch(os.path.abspath(__file__), world, timeout=60, args=[kind, *args])


def _case_params():
    return [pytest.param(w, name, id=f"w{w}-{name}") for w in WORLD_SIZES for name in case_names(w)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,case", _case_params())
def test_case(world, case):
    run = session("cases", world)
    run.check_case(case, world)


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_session_exits_cleanly(world):
    run = session("cases", world)
    assert not run.timed_out, run.summary()
    assert all(w.returncode == 0 for w in run.workers), run.summary()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("victim", [2, 0], ids=["rank2", "rank0-hosting-the-store"])
def test_peer_killed_mid_collective(victim):
    run = session("kill", 3, str(victim))
    assert not run.timed_out, run.summary()
    assert run.workers[victim].returncode == -signal.SIGKILL, run.summary()
    cases = run.cases()
    for r in {0, 1, 2} - {victim}:
        assert run.workers[r].returncode == 0, run.summary()
        rec = cases["survivor_raises"][r]
        assert rec["ok"], f"rank {r}: {rec}"
        assert "allreduce(float32" in rec["message"], rec["message"]
        if victim != 0:
            assert f"rank {victim} has died" in rec["message"], rec["message"]
        assert cases["broken_afterwards"][r]["ok"], cases["broken_afterwards"][r]


if __name__ == "__main__":
    worker_main()
