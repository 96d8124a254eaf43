"""The engine in one process: bucket plan properties, bucket layout and zero-copy
views, the scheduler's launch rule, readiness errors and timeouts, op argument
validation. Communication runs on a world-size-1 Gloo communicator (no peers);
the multi-process behaviour is in test_engine_ops.py.
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

from bagua_core import _C, engine as E
from bagua_core.dtypes import DType
from bagua_core.errors import BaguaError, CommTimeoutError, MismatchError, PeerError
from tests.harness.built_with import needs_test_bindings


@pytest.fixture(scope="module")
def comm():
    return _C.create_gloo_communicator(None, "local", 0, 1, 10.0, "127.0.0.1")


@pytest.fixture
def eng(comm):
    e = E.Engine(comm, timeout_s=1.0)
    yield e
    e.close()


# ------------------------------------------------------------------ bucket plan

ITEM = {"float32": 4, "float16": 2, "int64": 8, "float64": 8, "uint8": 1}


def _random_decls(rng, n, dtypes=("float32",)):
    return [(f"t{i}", int(rng.integers(0, 3000)), str(rng.choice(dtypes))) for i in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_plan_properties(seed):
    rng = np.random.default_rng(seed)
    decls = _random_decls(rng, 60, ("float32", "float16", "int64", "uint8"))
    cap = int(rng.integers(500, 20000))
    plan = E.plan_buckets(decls, cap)
    info = {n: (k, d) for n, k, d in decls}
    index = {n: i for i, (n, _, _) in enumerate(decls)}
    # every tensor exactly once (int64 included)
    flat = [n for b in plan for n in b]
    assert sorted(flat) == sorted(info)
    for b in plan:
        # one dtype per bucket
        assert len({info[n][1] for n in b}) == 1
        # registration order inside a bucket
        assert [index[n] for n in b] == sorted(index[n] for n in b)
        # size cap: exceeded only by a single tensor larger than the cap
        nbytes = sum(info[n][0] * ITEM[info[n][1]] for n in b)
        assert nbytes <= cap or len(b) == 1, (b, nbytes, cap)
    # buckets ordered by the position of their last tensor
    lasts = [index[b[-1]] for b in plan]
    assert lasts == sorted(lasts)
    # per dtype, buckets partition the dtype's tensors in registration order
    for dt in ITEM:
        seq = [n for b in plan for n in b if info[n][1] == dt]
        assert seq == [n for n, _, d in decls if d == dt]


def test_plan_greedy_single_dtype():
    mib = 1 << 20
    decls = [(c, s * mib // 4, "float32") for c, s in zip("ABCDE", (4, 8, 12, 16, 20))]
    # fills up to 16 MiB; a tensor that would overflow starts a new bucket
    assert E.plan_buckets(decls, 16 * mib) == [["A", "B"], ["C"], ["D"], ["E"]]
    assert E.plan_buckets(decls, 1 << 40) == [list("ABCDE")]
    assert E.plan_buckets(decls, 1) == [[c] for c in "ABCDE"]


def test_plan_interleaved_dtypes_never_mix():
    decls = [
        ("h0", 10, "float16"),
        ("f0", 10, "float32"),
        ("f1", 10, "float32"),
        ("h1", 10, "float16"),
        ("i0", 3, "int64"),
    ]
    plan = E.plan_buckets(decls, 1 << 20)
    assert plan == [["f0", "f1"], ["h0", "h1"], ["i0"]]


def test_plan_default_size_from_env(monkeypatch):
    decls = [(f"t{i}", 256, "float32") for i in range(8)]  # 1 KiB each
    monkeypatch.setenv("BAGUA_BUCKET_SIZE", "2048")
    assert E.plan_buckets(decls) == [[f"t{i}", f"t{i + 1}"] for i in range(0, 8, 2)]
    monkeypatch.delenv("BAGUA_BUCKET_SIZE")
    assert E.plan_buckets(decls) == [[f"t{i}" for i in range(8)]]  # 10 MiB default
    monkeypatch.setenv("BAGUA_BUCKET_SIZE", "lots")
    with pytest.raises(ValueError, match="BAGUA_BUCKET_SIZE"):
        E.plan_buckets(decls)


def test_plan_bad_input():
    with pytest.raises(ValueError, match="twice"):
        E.plan_buckets([("a", 1, "float32"), ("a", 2, "float32")], 10)
    with pytest.raises(ValueError):
        E.plan_buckets([("a", 1, "float32")], 0)
    with pytest.raises(TypeError):
        E.plan_buckets([("a", 1, "complex64")], 10)
    assert E.plan_buckets([], 10) == []


# ------------------------------------------------------------------ buckets


def test_bucket_layout_padding_and_views(eng):
    b = eng.add_bucket("b", [("x", (2, 3)), ("y", (5,)), ("s", ())], "float32", alignment=4)
    assert b.numel == 12 and b.payload_numel == 12  # 6 + 5 + 1: already a multiple of 4
    c = eng.add_bucket("c", [("u", (7,))], "float64", alignment=3)
    assert (c.numel, c.payload_numel, c.dtype) == (9, 7, DType.float64)
    pad = c.slot(1)
    assert pad["is_padding"] and pad["offset"] == 7 and pad["numel"] == 2
    assert c.tensor_names == ["u"]
    assert [b.slot(n)["offset"] for n in ("x", "y", "s")] == [0, 6, 11]
    for bucket in (b, c):
        assert bucket.flat_view().address % 64 == 0
        assert not np.asarray(bucket.flat_view()).any()  # zero-initialised, padding included
    x = np.asarray(b.view("x"))
    assert x.shape == (2, 3) and x.dtype == np.float32
    x[...] = np.arange(6).reshape(2, 3)
    np.asarray(b.view("y"))[...] = -1
    flat = np.asarray(b.flat_view())
    np.testing.assert_array_equal(flat[:11], [0, 1, 2, 3, 4, 5, -1, -1, -1, -1, -1])
    assert np.asarray(b.view("s")).shape == ()
    # views share memory with the bucket, and outlive the engine and bucket objects
    assert b.view(0).address == b.flat_view().address
    view = b.view("y")
    eng.close()
    del b, flat, x
    gc.collect()
    np.testing.assert_array_equal(np.asarray(view), [-1] * 5)


def test_views_export_dlpack(eng):
    b = eng.add_bucket("b", [("x", (2, 3)), ("y", (4,))], "float32")
    x = np.from_dlpack(b.view("x"))
    assert x.shape == (2, 3) and x.dtype == np.float32
    x[...] = 7
    np.testing.assert_array_equal(np.asarray(b.flat_view())[:6], 7)
    assert x.ctypes.data == b.view("x").address
    assert b.view("y").__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        b.view("y").__dlpack__(copy=True)
    y = np.from_dlpack(b.view("y"))
    eng.close()
    del b
    gc.collect()
    y[...] = 1  # the export keeps the memory alive
    assert y.sum() == 4


def test_bucket_bad_input(eng):
    with pytest.raises(ValueError, match="twice"):
        eng.add_bucket("b", [("x", (1,)), ("x", (2,))], "float32")
    with pytest.raises(ValueError, match="no tensors"):
        eng.add_bucket("b", [], "float32")
    with pytest.raises(ValueError, match="negative"):
        eng.add_bucket("b", [("x", (-1,))], "float32")
    eng.add_bucket("b", [("x", (1,))], "float32")
    with pytest.raises(ValueError, match="already"):
        eng.add_bucket("b2", [("x", (1,))], "float32")  # tensor names unique per engine
    with pytest.raises(ValueError, match="already"):
        eng.add_bucket("b", [("z", (1,))], "float32")


def test_create_buckets_from_plan(eng):
    decls = [(f"p{i}", (i + 1, 4), "float32") for i in range(6)] + [("steps", (), "int64")]
    buckets = eng.create_buckets(decls, bucket_bytes=128, alignment=5)
    names = [bk.tensor_names for bk in buckets]
    assert names == E.plan_buckets([(n, int(np.prod(s)), d) for n, s, d in decls], 128)
    for bk in buckets:
        assert bk.numel % 5 == 0
        assert bk.name == str(bk.index)
    assert buckets[-1].dtype == DType.int64


# ------------------------------------------------------------------ scheduling


def _two_buckets(eng):
    b0 = eng.add_bucket("first", [("a", (4,)), ("b", (4,))], "float32")
    b1 = eng.add_bucket("second", [("c", (4,))], "float32")
    for b in (b0, b1):
        b.append_op("centralized_allreduce", average=True)
    return b0, b1


def test_launch_order_is_registration_order(eng):
    _two_buckets(eng)
    eng.mark_ready("c")  # bucket 1 complete first
    time.sleep(0.05)
    t = eng.timings()
    assert t[1].launch_ns == -1, "bucket 1 launched before bucket 0"
    eng.mark_ready("a")
    assert eng.timings()[0].launch_ns == -1
    eng.mark_ready("b")
    eng.wait()
    t = eng.timings()
    assert 0 < t[0].launch_ns <= t[1].launch_ns
    assert t[0].end_ns <= t[1].start_ns  # one comm thread, in order
    assert eng.steps == 1 and eng.launches == 2 and not eng.in_step


def test_timings_use_python_monotonic_clock(eng):
    _two_buckets(eng)
    before = time.monotonic_ns()
    eng.mark_all_ready()
    eng.wait()
    after = time.monotonic_ns()
    for t in eng.timings():
        assert before <= t.launch_ns <= t.start_ns <= t.end_ns <= after
    assert abs(E.monotonic_ns() - time.monotonic_ns()) < 50_000_000


def test_ready_times_only_while_recorded(eng):
    _two_buckets(eng)
    eng.mark_all_ready()
    eng.wait()
    assert all(t.ready_ns == -1 for t in eng.timings())  # off by default: no clock read
    eng.record_ready = True
    eng.mark_ready("c")
    time.sleep(0.01)
    eng.mark_ready("b")
    eng.mark_ready("a")
    with pytest.raises(ValueError, match="set_record_ready during a step"):
        eng.record_ready = False
    eng.wait()
    t = eng.timings()
    assert 0 < t[1].ready_ns < t[0].ready_ns  # "c" completed bucket 1 first...
    assert t[0].ready_ns <= t[0].launch_ns <= t[1].launch_ns  # ...which still launched second
    for x in t:
        assert x.ready_ns <= x.launch_ns <= x.start_ns <= x.end_ns
    assert eng.ready_order() == ["c", "b", "a"]


def test_first_bucket_launches_while_later_tensors_pending(eng):
    _two_buckets(eng)
    eng.mark_ready("a")
    eng.mark_ready("b")
    deadline = time.monotonic() + 5
    while eng.timings()[0].end_ns < 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    t0 = eng.timings()[0]
    assert t0.end_ns > 0, "bucket 0 did not run while bucket 1 was pending"
    marked_last = time.monotonic_ns()
    eng.mark_ready("c")
    eng.wait()
    assert t0.launch_ns < marked_last


def test_steps_repeat_and_reset(eng):
    b0, b1 = _two_buckets(eng)
    for step in range(5):
        np.asarray(b0.view("a"))[...] = step
        for name in ("c", "b", "a"):
            eng.mark_ready(name)
        eng.wait()
        assert np.asarray(b0.view("a"))[0] == step
    assert eng.steps == 5 and eng.launches == 10


def test_mark_ready_from_threads(eng):
    names = [f"t{i}" for i in range(32)]
    eng.create_buckets([(n, (3,), "float32") for n in names], bucket_bytes=40)
    for b in eng.buckets:
        b.append_op("centralized_allreduce")
    for _ in range(3):
        threads = [threading.Thread(target=eng.mark_ready, args=(n,)) for n in reversed(names)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        eng.wait()
    assert eng.launches == 3 * len(eng.buckets)


def test_wait_without_step_returns_at_once(eng):
    _two_buckets(eng)
    t = time.monotonic()
    eng.wait()
    assert time.monotonic() - t < 0.5 and eng.steps == 0


def test_bucket_and_index_marking(eng):
    b0, b1 = _two_buckets(eng)
    b1.mark_all_ready()
    b0.mark_ready(0)
    b0.mark_ready("b")
    eng.wait()
    assert eng.launches == 2


def test_never_ready_tensor_raises_naming_it(comm):
    eng = E.Engine(comm, timeout_s=0.5)
    _two_buckets(eng)
    eng.mark_ready("a")
    eng.mark_ready("c")
    t = time.monotonic()
    with pytest.raises(CommTimeoutError) as info:
        eng.wait()
    elapsed = time.monotonic() - t
    assert 0.4 < elapsed < 3.0
    msg = str(info.value)
    assert "'b'" in msg and "first" in msg and "never marked ready" in msg
    assert eng.broken
    with pytest.raises(BaguaError, match="unusable"):
        eng.wait()
    eng.mark_ready("a")  # ignored once broken; wait() keeps reporting
    eng.close()


@needs_test_bindings
@pytest.mark.parametrize(
    "kind,cls,text",
    [
        ("timeout", CommTimeoutError, "late"),
        ("peer", PeerError, "gone"),
        ("mismatch", MismatchError, "differs"),
        ("error", BaguaError, "failed"),
        ("invalid", ValueError, "bad"),
        ("std", BaguaError, "foreign"),
        ("other", BaguaError, "unknown error"),
    ],
)
def test_background_errors_keep_their_type_with_a_prefix(kind, cls, text):
    # the engine's and the async averager's comm threads re-raise their errors
    # in the caller through one helper (csrc/common/error.h: with_prefix)
    with pytest.raises(cls) as info:
        _C._raise_with_prefix(kind, "bucket 2: ")
    assert str(info.value) == f"bucket 2: {text}"
    if cls is BaguaError:
        assert type(info.value) is BaguaError


def test_wait_any_returns_a_finished_bucket_while_later_ones_are_pending(eng):
    b0, b1 = _two_buckets(eng)
    np.asarray(b0.view("a"))[...] = 3
    eng.mark_ready("a")
    eng.mark_ready("b")
    assert eng.wait_any([1, 0]) == 0  # bucket 1 cannot launch: "c" is not ready
    assert eng.timings()[0].end_ns > 0 and eng.timings()[1].launch_ns == -1
    assert eng.in_step and eng.steps == 0  # the step goes on
    np.testing.assert_array_equal(np.asarray(b0.view("a")), 3)
    eng.mark_ready("c")
    eng.wait_bucket(1)
    assert eng.wait_any([0, 1]) == 0  # both finished: the lowest
    eng.wait()
    assert eng.steps == 1 and not eng.in_step
    assert eng.wait_any([1]) == 1  # no step: at once


def test_wait_any_bad_arguments(eng):
    _two_buckets(eng)
    with pytest.raises(ValueError, match="no bucket given"):
        eng.wait_any([])
    with pytest.raises(ValueError, match="no bucket 2"):
        eng.wait_any([0, 2])


def test_wait_any_on_a_never_ready_bucket_times_out_naming_it(comm):
    eng = E.Engine(comm, timeout_s=0.5)
    _two_buckets(eng)
    eng.mark_ready("a")
    eng.mark_ready("b")
    assert eng.wait_bucket(0) is None
    t = time.monotonic()
    with pytest.raises(CommTimeoutError) as info:
        eng.wait_bucket(1)
    assert 0.4 < time.monotonic() - t < 3.0
    assert "'c'" in str(info.value) and "never marked ready" in str(info.value)
    assert eng.broken
    with pytest.raises(BaguaError, match="unusable"):
        eng.wait_any([0])
    with pytest.raises(BaguaError, match="unusable"):
        eng.wait()
    eng.close()


def test_wait_raises_a_failure_after_wait_any_once_no_bucket_runs(comm):
    # the failure is raised once (by whichever wait comes first), then "unusable"
    eng = E.Engine(comm, timeout_s=0.3)
    _two_buckets(eng)
    eng.mark_ready("c")
    with pytest.raises(CommTimeoutError, match="never marked ready"):
        eng.wait_any([0, 1])
    with pytest.raises(BaguaError, match="unusable"):
        eng.wait()
    eng.close()


def test_readiness_errors(eng):
    _two_buckets(eng)
    with pytest.raises(ValueError, match="no tensor named"):
        eng.mark_ready("nope")
    eng.mark_ready("a")
    with pytest.raises(ValueError, match="twice"):
        eng.mark_ready("a")
    with pytest.raises(ValueError, match="wait"):
        eng.add_bucket("late", [("z", (1,))], "float32")
    with pytest.raises(ValueError, match="wait"):
        eng.buckets[0].clear_ops()
    eng.mark_ready("b")
    eng.mark_ready("c")
    eng.wait()
    with pytest.raises(ValueError):
        eng._core.mark_ready(7, 0)


def test_close_joins_and_is_idempotent(comm):
    eng = E.Engine(comm, timeout_s=1.0)
    _two_buckets(eng)
    eng.mark_all_ready()
    eng.close()
    eng.close()
    with pytest.raises(BaguaError, match="closed"):
        eng.wait()
    with pytest.raises(BaguaError, match="closed"):
        eng.mark_ready("a")
    with E.Engine(comm, timeout_s=1.0) as e2:
        assert not e2.broken


def test_engine_destroyed_mid_step_does_not_hang(comm):
    eng = E.Engine(comm, timeout_s=1.0)
    _two_buckets(eng)
    eng.mark_ready("a")
    del eng
    gc.collect()


def test_clear_buckets_then_rebuild(eng):
    _two_buckets(eng)
    eng.mark_all_ready()
    eng.wait()
    eng.clear_buckets()
    assert eng.buckets == [] and eng._core.num_buckets == 0
    b = eng.add_bucket("again", [("a", (2,))], "float32")  # names free again
    b.append_op("centralized_allreduce")
    eng.mark_ready("a")
    eng.wait()


# ------------------------------------------------------------------ op validation


def test_op_validation(eng, comm):
    f = eng.add_bucket("f", [("w", (5,))], "float32")
    i = eng.add_bucket("i", [("n", (5,))], "int64")
    with pytest.raises(ValueError, match="int64"):
        i.append_op("bytegrad")
    with pytest.raises(ValueError, match="floating"):
        i.append_op("decentralized")
    with pytest.raises(ValueError, match="even"):
        f.append_op("decentralized", peer_selection_mode="shift_one")  # one peer
    with pytest.raises(ValueError, match="peer_selection_mode"):
        f.append_op("decentralized", peer_selection_mode="ring")
    with pytest.raises(ValueError, match="communication_interval"):
        f.append_op("decentralized", peer_selection_mode="all", communication_interval=0)
    with pytest.raises(ValueError, match="intra-node"):
        f.append_op("centralized_allreduce", hierarchical=True)
    with pytest.raises(ValueError):
        E.Engine(comm, timeout_s=0)
    with pytest.raises(ValueError, match="comm"):
        E.Engine(None)
    assert f.ops() == [] and i.ops() == []


def test_ops_on_single_process(eng):
    b = eng.add_bucket("w", [("w", (4,))], "float32")
    op = b.append_op("decentralized", peer_selection_mode="all", communication_interval=2)
    i = eng.add_bucket("i", [("n", (3,))], "int64")
    i.append_op("centralized_allreduce", average=False)
    w = np.asarray(b.view("w"))
    w[...] = [1, 2, 3, 4]
    np.asarray(i.view("n"))[...] = [7, 8, 9]
    assert op.communicates_next and op.step == 0
    eng.mark_all_ready()
    eng.wait()
    assert op.last_communicated and op.step == 1 and not op.communicates_next
    w[...] = 0
    assert op.copy_back()
    np.testing.assert_array_equal(w, [1, 2, 3, 4])
    np.testing.assert_array_equal(np.asarray(op.result_view()), [1, 2, 3, 4])
    np.testing.assert_array_equal(np.asarray(i.view("n")), [7, 8, 9])
    eng.mark_all_ready()
    eng.wait()
    assert not op.last_communicated and not op.copy_back()
    op.step = 10
    assert op.step == 10 and op.communicates_next
    assert "decentralized" in op.description and [o.description for o in b.ops()] == [op.description]


def test_shift_one_peer_formula():
    for n in (2, 4, 6, 8):
        h = n // 2
        for step in range(7):
            peers = [E.shift_one_peer(r, n, step) for r in range(n)]
            for r, p in enumerate(peers):
                expect = h + (step + r) % h if r < h else (r - h - step) % h
                assert p == expect and peers[p] == r and p != r


def test_lanes_each_need_their_own_communicator(comm):
    others = [_C.create_gloo_communicator(None, f"lane{i}", 0, 1, 10.0, "127.0.0.1") for i in range(2)]
    with E.Engine(comm, timeout_s=1.0, more_lanes=[(c, None, None) for c in others]) as e:
        assert e.num_lanes == 3
        buckets = [e.add_bucket(f"b{i}", [(f"t{i}", (5,))], "float32") for i in range(5)]
        for b in buckets:
            b.append_op("centralized_allreduce", average=True)
        for step in range(2):
            for i, b in enumerate(buckets):
                np.asarray(b.view(f"t{i}"))[...] = i + step
            e.mark_all_ready()
            e.wait()
            for i, b in enumerate(buckets):
                np.testing.assert_array_equal(np.asarray(b.view(f"t{i}")), i + step)
    with pytest.raises(ValueError, match="own communicator"):
        E.Engine(comm, timeout_s=1.0, more_lanes=[(others[0], None, None), (others[0], None, None)])
    with pytest.raises(ValueError, match="own communicator"):
        E.Engine(comm, timeout_s=1.0, more_lanes=[(comm, None, None)])
