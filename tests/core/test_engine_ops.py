"""The engine across real processes (Gloo over loopback TCP) against numpy
references: centralized allreduce (flat and hierarchical), ByteGrad (the whole
compress / alltoall / reduce / recompress / allgather sequence simulated in
numpy), decentralized averaging (all, shift_one with intervals 1 and 2,
hierarchical), launch order and overlap, lanes (1, 2 and 3: consecutive
buckets pipeline across lanes), and failures (a tensor never marked ready, a
stuck peer, a dead peer).

One multi-process session per configuration runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import os
import sys
import time
import zlib

from tests.harness.mp import Session, session_tests
from tests.harness.worker import threads, wait_for_threads

# session -> (world size, local world size, env); engines have 2 lanes by default on CPU
SESSIONS = {
    "flat2": (2, None, {}),
    "flat3": (3, None, {"BAGUA_ENGINE_LANES": "3"}),
    "flat4": (4, None, {"BAGUA_ENGINE_LANES": "1"}),
    "hier4": (4, 2, {}),
    "fail3": (3, None, {"BAGUA_TIMEOUT": "4"}),
}

COMMON = [
    "centralized_avg_float32",
    "centralized_sum_float32",
    "centralized_avg_float64",
    "centralized_sum_int64",
    "centralized_avg_float16",
    "bytegrad_avg",
    "bytegrad_sum",
    "bytegrad_multi_mib_bucket",
    "decentralized_all",
    "launch_order_and_rank_dependent_marking",
    "lanes_pipeline_consecutive_buckets",
    "first_bucket_overlaps_backward",
    "never_ready_tensor_names_it",
    "bucket_layouts_that_differ_are_a_mismatch",
]
CONCURRENT = ["engines_on_one_group_communicate_concurrently"]  # flat2 and flat3
EVEN_ONLY = ["decentralized_shift_one_interval_1", "decentralized_shift_one_interval_2"]
HIER = [
    "hierarchical_centralized_avg",
    "hierarchical_centralized_sum",
    "hierarchical_bytegrad_avg",
    "hierarchical_bytegrad_sum",
    "hierarchical_decentralized_all",
    "hierarchical_decentralized_shift_one",
    "flat_and_hierarchical_in_one_engine",
]


def case_names(session: str):
    world, local, _ = SESSIONS[session]
    if session == "fail3":
        return ["stuck_peer_times_out_everywhere", "dead_peer_raises_on_survivors"]
    names = list(COMMON)
    names += EVEN_ONLY if world % 2 == 0 else ["shift_one_odd_peers_refused"]
    if session in ("flat2", "flat3"):
        names += CONCURRENT
    if local:
        names += HIER
    return names


# ---------------------------------------------------------------- worker side


STEPS = 5
LR = 0.1


class Worker:
    def __init__(self):
        import numpy as np

        import bagua_core
        from bagua_core import engine

        self.np = np
        self.E = engine
        self.pg = bagua_core.init_process_group()
        self.rank = self.pg.rank
        self.world = self.pg.size
        s = bagua_core.config.load()
        self.local = s.local_world_size
        self.node = s.node_rank
        self.nodes = self.world // self.local

    # -- data and checks --
    def data(self, case, rank, shape, dtype="float32", step=0):
        np = self.np
        rng = np.random.default_rng([zlib.crc32(case.encode()), rank, step])
        if np.dtype(dtype).kind in "iu":
            return rng.integers(-1000, 1000, size=shape).astype(dtype)
        return rng.normal(size=shape).astype(dtype)

    def same_everywhere(self, arr):
        """Asserts arr is bitwise equal on every rank."""
        np = self.np
        raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
        allb = np.empty(self.world * raw.size, np.uint8)
        self.pg.comm.allgather(raw.ctypes.data, allb.ctypes.data, raw.size, 6)
        for r in range(self.world):
            assert np.array_equal(allb[r * raw.size : (r + 1) * raw.size], raw), (
                f"rank {r} differs from rank {self.rank}"
            )

    def engine(self, hierarchical=False, timeout_s=None):
        return self.E.Engine.for_group(self.pg, hierarchical=hierarchical, timeout_s=timeout_s)

    # -- centralized --
    DECLS = [("w3", (3, 5)), ("b3", (5,)), ("w2", (7, 3)), ("b2", (7,)), ("w1", (2, 7)), ("b1", (2,))]

    def run_centralized(self, case, dtype, average, hierarchical=False):
        np = self.np
        eng = self.engine(hierarchical)
        buckets = eng.create_buckets([(n, s, dtype) for n, s in self.DECLS], bucket_bytes=25 * np.dtype(dtype).itemsize)
        assert len(buckets) > 2
        for b in buckets:
            b.append_op("centralized_allreduce", hierarchical=hierarchical, average=average)
        for step in range(2):
            for n, s in self.DECLS:
                np.asarray(self.view(eng, n))[...] = self.data(case, self.rank, s, dtype, step)
            for n, _ in self.DECLS:
                eng.mark_ready(n)
            eng.wait()
            for n, s in self.DECLS:
                got = np.asarray(self.view(eng, n))
                allv = np.stack([self.data(case, r, s, dtype, step) for r in range(self.world)]).astype(np.float64)
                ref = allv.mean(0) if average else allv.sum(0)
                if np.dtype(dtype).kind in "iu":
                    np.testing.assert_array_equal(got, ref.astype(dtype))
                else:
                    tol = {"float16": 2e-3, "float32": 1e-5, "float64": 1e-12}[dtype]
                    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)
                self.same_everywhere(got)
        assert eng.steps == 2
        eng.close()

    def layouts_differ(self):
        """The engine promises a step's allreduces to its communicator at the first bucket, which
        then skips their agreements when every rank promised the same ones. Rank 1's last bucket
        is longer: the promises differ, so every bucket is agreed on its own, the first two run
        (correct sums) and the last one raises MismatchError on every rank, naming both calls."""
        import bagua_core

        np = self.np
        for step in range(2):  # the second step: after a step whose promises were kept
            eng = self.engine(timeout_s=20)
            last = 4 if self.rank == 1 and step == 1 else 3
            decls = [("a", (5,)), ("b", (6,)), ("c", (last,))]
            buckets = eng.create_buckets([(n, s, "float32") for n, s in decls], bucket_bytes=16)
            assert [b.tensor_names for b in buckets] == [["a"], ["b"], ["c"]]
            for b in buckets:
                b.append_op("centralized_allreduce", average=False)
            for n, _ in decls:
                np.asarray(self.view(eng, n))[...] = self.rank + 1
                eng.mark_ready(n)
            if step == 0:
                eng.wait()
            else:
                try:
                    eng.wait()
                except bagua_core.MismatchError as e:
                    assert "allreduce(float32, count=4" in str(e) and "allreduce(float32, count=3" in str(e), e
                else:
                    raise AssertionError("no MismatchError")
            total = self.world * (self.world + 1) / 2
            assert (np.asarray(self.view(eng, "a")) == total).all() and (np.asarray(self.view(eng, "b")) == total).all()
            eng.close()

    @staticmethod
    def view(eng, name):
        for b in eng.buckets:
            if name in b.tensor_names:
                return b.view(name)
        raise KeyError(name)

    # -- ByteGrad --
    BG_DECLS = [("g1", (7,)), ("g2", (4, 4))]  # 23 elements: not a multiple of 2, 3 or 4

    def bytegrad_reference(self, xs, average):
        """The op's sequence in numpy, over the participants' padded buckets xs."""
        from tests.harness.reference.compressed_exchange import scatter_reduce_gather

        return scatter_reduce_gather(xs, average)[0]

    def check_bytegrad(self, got, ref):
        # Same formula, same float32 operations in the same order: bitwise equal.
        self.np.testing.assert_array_equal(got, ref)

    # Records of about a MiB each, with an odd chunk length: the exchange moves them over the wire
    # in many transport writes, and the result must still equal the numpy sequence bitwise.
    BG_LARGE_DECLS = [("big", (1 << 20, 3)), ("odd", (4097,))]

    def run_bytegrad(self, case, average, hierarchical=False, decls=None):
        np = self.np
        decls = decls or self.BG_DECLS
        eng = self.engine(hierarchical)
        [b] = eng.create_buckets([(n, s, "float32") for n, s in decls], alignment=self.world, bucket_bytes=1 << 30)
        assert b.numel % self.world == 0 and b.numel > b.payload_numel
        b.append_op("bytegrad", hierarchical=hierarchical, average=average)
        padded = lambda r, step: np.concatenate(  # noqa: E731
            [self.data(case, r, s, "float32", step).reshape(-1) for _, s in decls]
            + [np.zeros(b.numel - b.payload_numel, np.float32)]
        )
        for step in range(2):
            for n, s in decls:
                np.asarray(b.view(n))[...] = self.data(case, self.rank, s, "float32", step)
            b.mark_all_ready()
            eng.wait()
            xs = [padded(r, step) for r in range(self.world)]
            if hierarchical:
                nodes = [np.stack(xs[k * self.local : (k + 1) * self.local]) for k in range(self.nodes)]
                f32 = np.float32
                xs = [(x.sum(0, dtype=f32) / f32(self.local)) if average else x.sum(0, dtype=f32) for x in nodes]
                ref = self.bytegrad_reference(xs, average)
            else:
                ref = self.bytegrad_reference(xs, average)
            got = np.asarray(b.flat_view()).copy()
            self.check_bytegrad(got, ref)
            self.same_everywhere(got)
        eng.close()

    # -- decentralized --
    def decentralized_reference(self, case, mode, interval, hierarchical, shapes):
        np = self.np
        f32 = np.float32
        ws = [np.concatenate([self.data(case, r, s).reshape(-1) for s in shapes]) for r in range(self.world)]
        for step in range(STEPS):
            if step % interval == 0:
                c = step // interval
                if hierarchical:
                    groups = [np.stack(ws[k * self.local : (k + 1) * self.local]) for k in range(self.nodes)]
                    parts, n = [g.sum(0, dtype=f32) / f32(self.local) for g in groups], self.nodes
                else:
                    parts, n = ws, self.world
                if mode == "all":
                    avg = np.stack(parts).astype(np.float64).mean(0).astype(f32)
                    peers = [avg] * n
                else:
                    peers = [(parts[i] + parts[self.E.shift_one_peer(i, n, c)]) / f32(2) for i in range(n)]
                ws = [peers[r // self.local] if hierarchical else peers[r] for r in range(self.world)]
            ws = [w - f32(LR) * self.grad(case, r, step, w.size) for r, w in enumerate(ws)]
        return ws[self.rank]

    def grad(self, case, rank, step, size):
        return self.data(case + "/grad", rank, (size,), "float32", step)

    def run_decentralized(self, case, mode, interval, hierarchical=False):
        np = self.np
        shapes = [(4, 3), (5,)]
        eng = self.engine(hierarchical)
        [b] = eng.create_buckets([(f"p{i}", s, "float32") for i, s in enumerate(shapes)], bucket_bytes=1 << 30)
        op = b.append_op(
            "decentralized", peer_selection_mode=mode, communication_interval=interval, hierarchical=hierarchical
        )
        flat = np.asarray(b.flat_view())
        flat[...] = np.concatenate([self.data(case, self.rank, s).reshape(-1) for s in shapes])
        for step in range(STEPS):
            assert op.step == step and op.communicates_next == (step % interval == 0)
            eng.mark_all_ready()  # forward start: weights x_t
            eng.wait()  # before optimizer.step()
            assert op.copy_back() == (step % interval == 0)
            flat -= np.float32(LR) * self.grad(case, self.rank, step, flat.size)  # the local update
        ref = self.decentralized_reference(case, mode, interval, hierarchical, shapes)
        if mode == "all":
            np.testing.assert_allclose(flat, ref, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(flat, ref)
        eng.close()

    # -- cases --
    def cases(self, session):
        c = {}
        c["centralized_avg_float32"] = lambda: self.run_centralized("ca32", "float32", True)
        c["centralized_sum_float32"] = lambda: self.run_centralized("cs32", "float32", False)
        c["centralized_avg_float64"] = lambda: self.run_centralized("ca64", "float64", True)
        c["centralized_sum_int64"] = lambda: self.run_centralized("csi64", "int64", False)
        c["centralized_avg_float16"] = lambda: self.run_centralized("ca16", "float16", True)
        c["bytegrad_avg"] = lambda: self.run_bytegrad("bga", True)
        c["bytegrad_sum"] = lambda: self.run_bytegrad("bgs", False)
        c["bytegrad_multi_mib_bucket"] = lambda: self.run_bytegrad("bgl", True, decls=self.BG_LARGE_DECLS)
        c["decentralized_all"] = lambda: self.run_decentralized("dall", "all", 1)
        c["decentralized_shift_one_interval_1"] = lambda: self.run_decentralized("ds1", "shift_one", 1)
        c["decentralized_shift_one_interval_2"] = lambda: self.run_decentralized("ds2", "shift_one", 2)
        c["shift_one_odd_peers_refused"] = self.shift_one_odd
        c["launch_order_and_rank_dependent_marking"] = self.launch_order
        c["lanes_pipeline_consecutive_buckets"] = self.lanes_pipeline
        c["first_bucket_overlaps_backward"] = self.overlap
        c["never_ready_tensor_names_it"] = self.never_ready
        c["bucket_layouts_that_differ_are_a_mismatch"] = self.layouts_differ
        c["hierarchical_centralized_avg"] = lambda: self.run_centralized("hca", "float32", True, True)
        c["hierarchical_centralized_sum"] = lambda: self.run_centralized("hcs", "float32", False, True)
        c["hierarchical_bytegrad_avg"] = lambda: self.run_bytegrad("hbga", True, True)
        c["hierarchical_bytegrad_sum"] = lambda: self.run_bytegrad("hbgs", False, True)
        c["hierarchical_decentralized_all"] = lambda: self.run_decentralized("hdall", "all", 1, True)
        c["hierarchical_decentralized_shift_one"] = lambda: self.run_decentralized("hds", "shift_one", 1, True)
        c["flat_and_hierarchical_in_one_engine"] = self.mixed
        c["engines_on_one_group_communicate_concurrently"] = self.concurrent_engines
        c["stuck_peer_times_out_everywhere"] = self.stuck_peer
        c["dead_peer_raises_on_survivors"] = self.dead_peer
        return [(name, c[name]) for name in case_names(session)]

    def concurrent_engines(self):
        """Two engines on one group, their buckets ready in opposite orders on
        neighbouring ranks, while the caller's thread communicates on the group
        too: every collective meets its own counterpart (each engine runs on a
        private clone of the group), and closing the engines ends their
        threads."""
        import bagua_core

        np = self.np
        bagua_core.allreduce(np.zeros(1), group=self.pg)  # settle: nobody is still connecting
        before = threads()
        engines = [self.engine(timeout_s=10) for _ in range(2)]
        assert threads() > before
        shapes = [(5,), (7,)]  # a collective paired with the other engine's could not go unnoticed
        views = []
        for i, (eng, shape) in enumerate(zip(engines, shapes)):
            assert eng.group is not None and eng.group is not self.pg and eng.group.ranks == self.pg.ranks
            [b] = eng.create_buckets([(f"t{i}", shape, "float32")])
            b.append_op("centralized_allreduce", average=False)
            views.append(np.asarray(b.view(f"t{i}")))
        order = [0, 1] if self.rank % 2 == 0 else [1, 0]
        for step in range(3):
            for i, v in enumerate(views):
                v[...] = self.data("concurrent", self.rank, shapes[i], step=2 * step + i)
            for i in order:
                engines[i].mark_ready(f"t{i}")
                time.sleep(0.1)  # this rank's first bucket is in flight before its second is ready
            got = bagua_core.allreduce(np.full(3, self.rank + 1.0), group=self.pg).numpy()
            for i in order:
                engines[i].wait()
            assert (got == self.world * (self.world + 1) / 2).all(), got
            for i, v in enumerate(views):
                ref = sum(self.data("concurrent", r, shapes[i], step=2 * step + i) for r in range(self.world))
                np.testing.assert_allclose(v, ref, rtol=1e-5, atol=1e-5)
        clones = [e.group for e in engines]
        for e in engines:
            e.close()
            e.close()  # idempotent
        assert all(c.closed for c in clones) and not self.pg.closed
        wait_for_threads(before)

    def shift_one_odd(self):
        eng = self.engine()
        [b] = eng.create_buckets([("w", (3,), "float32")])
        try:
            b.append_op("decentralized", peer_selection_mode="shift_one")
        except ValueError as e:
            assert "even" in str(e) and str(self.world) in str(e), e
        else:
            raise AssertionError("shift_one accepted an odd number of peers")
        b.append_op("decentralized", peer_selection_mode="all")  # the engine stays usable
        b.mark_all_ready()
        eng.wait()
        eng.close()

    def launch_order(self):
        np = self.np
        eng = self.engine()
        names = [f"t{i}" for i in range(12)]
        eng.create_buckets([(n, (16,), "float32") for n in names], bucket_bytes=3 * 64)
        assert len(eng.buckets) == 4
        for b in eng.buckets:
            b.append_op("centralized_allreduce", average=False)
        for n in names:
            np.asarray(self.view(eng, n))[...] = self.rank + 1
        # Bucket 3 complete first: it must not launch before 0, 1 and 2.
        for n in eng.buckets[3].tensor_names:
            eng.mark_ready(n)
        time.sleep(0.1)
        assert eng.timings()[3].launch_ns == -1, "a later bucket launched before an earlier one"
        # The other tensors in a rank-dependent order.
        rest = [n for n in names if n not in eng.buckets[3].tensor_names]
        rng = np.random.default_rng(self.rank)
        for n in rng.permutation(rest):
            eng.mark_ready(str(n))
            time.sleep(0.005)
        eng.wait()
        t = eng.timings()
        launches = [x.launch_ns for x in t]
        assert launches == sorted(launches) and min(launches) > 0
        lanes = eng.num_lanes  # each lane runs its buckets one after the other
        assert all(t[i].end_ns <= t[i + lanes].start_ns for i in range(4 - lanes))
        total = self.world * (self.world + 1) / 2
        for n in names:
            np.testing.assert_array_equal(np.asarray(self.view(eng, n)), total)
        eng.close()

    def lanes_pipeline(self):
        """With two or more lanes the bucket after a large one starts while the
        large one is still communicating; with one lane it waits for it. The
        last rank comes 0.3 s late, so on the others the large bucket is in
        flight for that long whatever the machine's load."""
        np = self.np
        eng = self.engine()
        big, small = (
            eng.add_bucket("big", [("big", (1 << 20,))], "float32"),
            eng.add_bucket("small", [("s", (64,))], "float32"),
        )
        for b in (big, small):
            b.append_op("centralized_allreduce", average=False)
        np.asarray(self.view(eng, "big"))[...] = self.rank + 1
        np.asarray(self.view(eng, "s"))[...] = self.rank + 1
        if self.rank == self.world - 1:
            time.sleep(0.3)
        eng.mark_all_ready()
        eng.wait()
        t = eng.timings()
        if eng.num_lanes == 1:
            assert t[1].start_ns >= t[0].end_ns
        elif self.rank != self.world - 1:
            assert t[1].start_ns < t[0].end_ns, "the small bucket waited for the large one on another lane"
        total = self.world * (self.world + 1) / 2
        for name in ("big", "s"):
            np.testing.assert_array_equal(np.asarray(self.view(eng, name)), total)
        eng.close()

    def overlap(self):
        eng = self.engine()
        eng.create_buckets([("late", (64,), "float32"), ("early", (64,), "float32")], bucket_bytes=256)
        assert [b.tensor_names for b in eng.buckets] == [["late"], ["early"]]
        for b in eng.buckets:
            b.append_op("centralized_allreduce")
        # "backward": the first registered gradient is ready, compute continues
        eng.mark_ready("late")
        time.sleep(0.3)
        backward_end = time.monotonic_ns()
        eng.mark_ready("early")
        eng.wait()
        t = eng.timings()
        assert t[0].launch_ns < backward_end and t[0].start_ns < backward_end, (t, backward_end)
        assert t[0].end_ns < backward_end, "bucket 0 did not finish during the remaining backward"
        assert t[1].launch_ns >= backward_end
        eng.close()

    def never_ready(self):
        from bagua_core.errors import CommTimeoutError

        eng = self.engine(timeout_s=1.0)
        eng.create_buckets(
            [("a", (8,), "float32"), ("b", (8,), "float32"), ("forgotten", (8,), "float32")], bucket_bytes=32
        )
        for b in eng.buckets:
            b.append_op("centralized_allreduce")
        eng.mark_ready("a")
        eng.mark_ready("b")
        t = time.monotonic()
        try:
            eng.wait()
        except CommTimeoutError as e:
            msg = str(e)
            assert "'forgotten'" in msg and "never marked ready" in msg, msg
        else:
            raise AssertionError("wait() returned with a tensor never marked ready")
        assert time.monotonic() - t < 5
        assert eng.broken
        eng.close()

    def mixed(self):
        np = self.np
        eng = self.engine(hierarchical=True)
        b0 = eng.add_bucket("h", [("x", (6,))], "float32")
        b1 = eng.add_bucket("f", [("y", (6,))], "float32")
        b0.append_op("centralized_allreduce", hierarchical=True, average=False)
        b1.append_op("centralized_allreduce", hierarchical=False, average=False)
        np.asarray(b0.view("x"))[...] = self.rank
        np.asarray(b1.view("y"))[...] = 2 * self.rank
        eng.mark_all_ready()
        eng.wait()
        s = self.world * (self.world - 1) / 2
        np.testing.assert_array_equal(np.asarray(b0.view("x")), s)
        np.testing.assert_array_equal(np.asarray(b1.view("y")), 2 * s)
        eng.close()

    # -- failures (session fail3, BAGUA_TIMEOUT=4) --
    def stuck_peer(self):
        from bagua_core.errors import CommTimeoutError

        eng = self.engine()
        eng.create_buckets([("a", (8,), "float32"), ("b", (8,), "float32")], bucket_bytes=32)
        for b in eng.buckets:
            b.append_op("centralized_allreduce")
        eng.mark_ready("a")
        if self.rank != 2:
            eng.mark_ready("b")  # rank 2 never marks b: its peers wait in the collective
        t = time.monotonic()
        try:
            eng.wait()
        except CommTimeoutError as e:
            msg = str(e)
            if self.rank == 2:
                assert "'b'" in msg and "never marked ready" in msg, msg
            else:
                assert "bucket '1'" in msg and "'b'" in msg and "centralized_allreduce" in msg, msg
        else:
            raise AssertionError("wait() returned although a peer never launched bucket 1")
        assert time.monotonic() - t < 4 + 5
        if self.rank == 2:
            # its peers time out at about the same moment: closing first would
            # show them a closed connection instead of their own timeout
            time.sleep(2.0)
        eng.close()

    def dead_peer(self):
        import bagua_core
        from bagua_core.errors import BaguaError

        group = bagua_core.new_group()
        eng = self.E.Engine.for_group(group)
        [b] = eng.create_buckets([("w", (1 << 16,), "float32")])
        b.append_op("centralized_allreduce")
        b.mark_all_ready()
        eng.wait()  # one good step
        if self.rank == 2:
            os._exit(3)  # dies without a word
        time.sleep(0.2)
        b.mark_all_ready()
        t = time.monotonic()
        try:
            eng.wait()
        except BaguaError as e:
            msg = str(e)
            assert "bucket '0'" in msg and "'w'" in msg, msg
            assert type(e).__name__ in ("PeerError", "CommTimeoutError"), type(e)
        else:
            raise AssertionError("wait() returned although a peer died")
        assert time.monotonic() - t < 4 + 5
        eng.close()


def worker_main():
    from tests.harness.worker import run_cases

    session = sys.argv[1]
    w = Worker()
    failures = run_cases(w.cases(session))
    sys.exit(1 if failures else 0)


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world, local, env) for name, (world, local, env) in SESSIONS.items()},
    case_names,
    reporting_ranks=lambda name, case: SESSIONS[name][0] - (case == "dead_peer_raises_on_survivors"),
    returncode=lambda name, rank: 3 if (name, rank) == ("fail3", 2) else 0,
)  # fail3: rank 2 dies on purpose

if __name__ == "__main__":
    worker_main()
