"""Backends of process groups: the setting (``BAGUA_BACKEND`` / ``backend=``),
each rank's NCCL availability and the choice every rank makes alike (auto is
Gloo on this machine; a forced ``nccl`` is a clear error on every rank, never
a hang), engine lanes by backend, and the control-communicator plumbing NCCL
groups use, exercised on Gloo groups with a separate control communicator
(agreement, promises, clones, sub-groups, close).

This file is also the worker script (numpy only). The NCCL groups themselves
are tested at world size 1 on a GPU (``gpu`` marker; tests/gpu/nccl_group_worker.py).
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.gpu.available import gpu_skip_reason
from tests.harness import mp
from tests.harness.paths import GPU_WORKERS

WS = 2


# --- worker side ------------------------------------------------------------------

np = bc = None
RANK = 0


def expect_raises(exc, fragments, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        for f in fragments:
            assert f in str(e), f"{str(e)!r} lacks {f!r}"
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}")


THREE_WAYS = ("import torch", "nvidia-nccl", "BAGUA_NCCL_LIBRARY")


def case_auto_is_gloo():
    from bagua_core import engine

    g = bc.init_process_group()
    assert (g.backend, g.device_type, g.device_index) == ("gloo", "cpu", None)
    assert g.control_group is g
    assert engine.default_lanes(g) == 2
    x = np.full(3, RANK + 1.0)
    bc.allreduce_inplace(x)
    assert list(x) == [3.0] * 3


def case_forced_nccl_raises_everywhere():
    from bagua_core.backend import NcclUnavailableError

    bc.destroy_process_group()
    e = expect_raises(NcclUnavailableError, ("rank 0:", "rank 1:") + THREE_WAYS, bc.init_process_group, backend="nccl")
    assert "init_process_group" in str(e)
    assert not bc.is_initialized()
    bc.init_process_group()  # the job goes on


def case_backend_requests_differ():
    from bagua_core.config import ConfigError

    bc.destroy_process_group()
    expect_raises(
        ConfigError,
        ("rank 1 asked for backend 'gloo' while rank 0 asked for 'auto'",),
        bc.init_process_group,
        backend="gloo" if RANK == 1 else "auto",
    )
    bc.init_process_group()


def case_new_group_forced_nccl():
    from bagua_core.backend import NcclUnavailableError

    expect_raises(
        NcclUnavailableError, ("new_group", "rank 0:", "rank 1:") + THREE_WAYS, bc.new_group, [0, 1], backend="nccl"
    )
    g = bc.new_group([0, 1])  # the world's backend
    assert g.backend == "gloo"
    g.close()
    expect_raises(ValueError, ("new_group backend must be one of auto, nccl, gloo",), bc.new_group, [0], backend="mpi")


def case_new_group_backends_differ():
    expect_raises(
        bc.MismatchError,
        ("rank 1 asked for backend 'gloo' while rank 0 asked for 'auto'",),
        bc.new_group,
        [0, 1],
        backend="gloo" if RANK == 1 else "auto",
    )


def main_cases():
    return [
        ("auto_is_gloo_without_gpu", case_auto_is_gloo),
        ("forced_nccl_raises_on_every_rank", case_forced_nccl_raises_everywhere),
        ("backend_requests_differ", case_backend_requests_differ),
        ("new_group_forced_nccl_raises_on_every_rank", case_new_group_forced_nccl),
        ("new_group_backends_differ", case_new_group_backends_differ),
    ]


def case_env_nccl():
    from bagua_core.backend import NcclUnavailableError

    assert os.environ["BAGUA_BACKEND"] == "nccl"
    expect_raises(NcclUnavailableError, ("rank 0:", "rank 1:", "BAGUA_BACKEND") + THREE_WAYS, bc.init_process_group)
    g = bc.init_process_group(backend="gloo")  # the argument overrides the setting
    assert g.backend == "gloo"


# Separate control communicator (what NCCL groups have), on Gloo.

ALLREDUCE, BROADCAST = 1, 3  # OpKind codes (csrc/comm/op_desc.h)


def code(name):
    from bagua_core.dtypes import as_dtype

    return int(as_dtype(name))


def case_control_plumbing():
    from bagua_core import _C

    g = bc.init_process_group()
    ctl = g.control_group
    assert ctl is not g and ctl.comm is not g.comm and ctl.device_type == "cpu" and ctl.ranks == g.ranks
    # node identities went over the control communicator at initialisation
    assert g.intra_node_group().size == 1 and g.inter_node_group().size == WS  # LOCAL_WORLD_SIZE=1
    assert g.inter_node_group().control_group is not g.inter_node_group()
    # the agreement words on their own, as the agreed communicator sends them
    mine = np.array([RANK * 10 + i for i in range(3)], np.int64)
    everyone = np.zeros(3 * WS, np.int64)
    _C._agreement_allgather(ctl.comm, mine.ctypes.data, 3, everyone.ctypes.data)
    assert list(everyone) == [r * 10 + i for r in range(WS) for i in range(3)]


def case_control_agreement_helpers():
    from bagua_core import agreement

    g = bc.get_default_group()
    assert bc.broadcast_object({"rank": RANK}, 1, g) == {"rank": 1}
    agreement.check_same_everywhere([("param", "w", (2, 3), "float32")], g, "the model")
    sig = [("param", "w", (2, 3 + RANK), "float32")]
    expect_raises(
        ValueError,
        ("the model differs across ranks", "rank 1 has param 'w' (2, 4)"),
        agreement.check_same_everywhere,
        sig,
        g,
        "the model",
    )


def case_control_mismatch():
    g = bc.get_default_group()
    e = expect_raises(
        bc.MismatchError, ("ranks disagree", "allreduce(float32, count=4"), bc.allreduce, np.ones(3 + RANK, np.float32)
    )
    assert "world" in str(e)
    x = np.ones(4, np.float32)
    bc.allreduce_inplace(x, group=g)  # still in step
    assert list(x) == [2.0] * 4


def case_control_promises():
    """expect_calls batches the agreement: promised calls run without one;
    a rank breaking its promise raises, and that group then refuses calls."""
    g = bc.get_default_group()
    c = g.clone()
    calls = [(ALLREDUCE, code("float32"), 4, -1, 0), (BROADCAST, code("float32"), 2, 0, 0)]
    for _ in range(3):
        c.comm._expect_calls(calls)
        x, y = np.ones(4, np.float32), np.full(2, float(RANK), np.float32)
        bc.allreduce_inplace(x, group=c)
        bc.broadcast(y, 0, group=c)
        assert list(x) == [2.0] * 4 and list(y) == [0.0, 0.0]
    c.comm._expect_calls(calls)
    bc.allreduce_inplace(np.ones(4, np.float32), group=c)
    if RANK == 1:  # rank 0 keeps its promise (and is left waiting in the call, then times out)
        expect_raises(
            bc.BaguaError,
            ("where it had promised broadcast(float32, count=2, root=0)",),
            bc.allreduce_inplace,
            np.ones(4, np.float32),
            group=c,
        )
        expect_raises(
            bc.BaguaError, ("broken by an earlier failure",), bc.allreduce_inplace, np.ones(4, np.float32), group=c
        )
    else:
        expect_raises(bc.BaguaError, (), bc.broadcast, np.ones(2, np.float32), 0, group=c)
    c.close()


def case_control_engine():
    """Engine steps (which promise their calls) on groups built like NCCL
    groups, flat and hierarchical, with the lanes the backend gives."""
    from bagua_core.engine import Engine

    for hierarchical in (False, True):
        eng = Engine.for_group(bc.get_default_group(), hierarchical=hierarchical)
        assert eng.num_lanes == 2 and eng.group.control_group is not eng.group
        buckets = eng.create_buckets(
            [("a", (5,), "float32"), ("b", (7,), "float32"), ("c", (3,), "float32")], bucket_bytes=6 * 4
        )
        assert len(buckets) >= 2
        for b in buckets:
            b.append_op("centralized_allreduce", hierarchical=hierarchical, average=False)
        for step in range(3):
            for b in buckets:
                for n in b.tensor_names:
                    np.asarray(b.view(n))[...] = RANK + step
            eng.mark_all_ready()
            eng.wait()
            for b in buckets:
                for n in b.tensor_names:
                    assert np.all(np.asarray(b.view(n)) == 1 + 2 * step), (n, np.asarray(b.view(n)))
        eng.close()


def case_control_close():
    g = bc.get_default_group()
    c = g.clone()
    comm, ctl = c.comm, c.control_group.comm
    bc.allreduce_inplace(np.ones(2), group=c)
    c.close()
    for closed in (comm, ctl):
        expect_raises(bc.BaguaError, ("closed",), closed.barrier)
    expect_raises(RuntimeError, ("was closed",), lambda: c.control_group)
    sub = bc.new_group([1])
    if RANK == 1:
        assert sub.control_group is not sub
        bc.allreduce_inplace(np.ones(2), group=sub)
    else:
        assert sub.control_group is sub and sub.comm is None  # a non-member
    sub.close()


def control_cases():
    return [
        ("control_plumbing", case_control_plumbing),
        ("control_agreement_helpers", case_control_agreement_helpers),
        ("control_mismatch_raises_everywhere", case_control_mismatch),
        ("control_engine_steps", case_control_engine),
        ("control_close_closes_both", case_control_close),
        ("control_promises", case_control_promises),  # last: it breaks a clone on purpose
    ]


def worker_main(mode: str) -> int:
    global np, bc, RANK
    import numpy

    import bagua_core
    from tests.harness.worker import run_cases

    np, bc = numpy, bagua_core
    RANK = bc.get_rank()
    if mode == "main":
        cases = main_cases()
    elif mode == "env_nccl":
        cases = [("env_nccl_raises_on_every_rank", case_env_nccl)]
    elif mode == "control":
        from bagua_core import process_group

        process_group._separate_control = True
        cases = control_cases()
    else:
        raise SystemExit(f"unknown mode {mode}")
    failures = run_cases(cases)
    bc.destroy_process_group()
    sys.stdout.flush()
    os._exit(0 if failures == 0 else 1)


# --- pytest side: settings and choices in this process ------------------------------

from bagua_core import _C, _nccl, backend, config, engine  # noqa: E402


def test_backend_setting():
    assert config.load({}).backend == "auto"
    for value, want in (("NCCL", "nccl"), (" gloo ", "gloo"), ("auto", "auto"), ("", "auto")):
        assert config.load({"BAGUA_BACKEND": value}).backend == want
    with pytest.raises(config.ConfigError, match="BAGUA_BACKEND must be one of auto, nccl, gloo, got 'mpi'"):
        config.load({"BAGUA_BACKEND": "mpi"})
    assert config.parse_backend("backend", None, default="nccl") == "nccl"


def test_engine_lanes_default_by_backend():
    s = config.load({})
    assert config.engine_lanes_for(s, "nccl") == 1 and config.engine_lanes_for(s, "gloo") == 2
    assert config.engine_lanes_for(config.load({"BAGUA_ENGINE_LANES": "3"}), "nccl") == 3

    class Group:
        backend = "nccl"

    assert engine.default_lanes(Group()) == (config.load().engine_lanes or 1)


def _avail(local_rank=0, **kw):
    s = config.load({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": str(local_rank)})
    kw.setdefault("built_with_cuda", True)
    kw.setdefault("device_count", lambda: 2)
    kw.setdefault("find_library", lambda: "/lib/libnccl.so.2")
    kw.setdefault("check_library", lambda path: 22907)
    return backend.local_availability(s, **kw)


def test_local_availability():
    ok = _avail(1)
    assert ok.ok and ok.device == 1 and ok.library == "/lib/libnccl.so.2"
    assert "built without CUDA" in _avail(built_with_cuda=False).reason
    assert "no CUDA device is visible" in _avail(device_count=lambda: 0).reason
    beyond = _avail(3).reason  # LOCAL_RANK beyond the visible devices: both numbers named
    assert "LOCAL_RANK=3" in beyond and "only 2 CUDA device(s) are visible" in beyond, beyond

    def missing():
        raise _nccl.NcclNotFoundError("cannot find the NCCL library")

    assert "no usable NCCL library: cannot find" in _avail(find_library=missing).reason

    def refused(path):
        raise _C.BaguaError("the NCCL library is NCCL 3.0.0")

    assert "NCCL 3.0.0" in _avail(check_library=refused).reason


@pytest.mark.skipif(not _C.built_with_cuda, reason="built without CUDA")
def test_local_availability_refuses_a_library_of_another_layout(tmp_path):
    from tests.core.test_cuda_nccl import _stub_library

    nccl3 = _stub_library(str(tmp_path), 30000, True)
    reason = _avail(find_library=lambda: nccl3, check_library=None).reason
    assert "ncclConfig_t layout" in reason and "3.0.0" in reason, reason
    good = _stub_library(str(tmp_path), 22907, True)
    assert _avail(find_library=lambda: good, check_library=None).ok


def test_choose_is_the_same_everywhere():
    ok, no = backend.Availability(""), backend.Availability("no CUDA device is visible (x)")
    assert backend.choose("auto", [ok, ok], [0, 1], "g") == "nccl"
    assert backend.choose("auto", [ok, no], [0, 1], "g") == "gloo"
    assert backend.choose("auto", [ok, no], [0], "g") == "nccl"  # only members count
    assert backend.choose("gloo", [ok, ok], [0, 1], "g") == "gloo"
    with pytest.raises(backend.NcclUnavailableError) as info:
        backend.choose("nccl", [ok, no, no], [0, 1, 2], "init_process_group")
    msg = str(info.value)
    assert "2 ranks cannot run NCCL: rank 1: no CUDA device" in msg and "rank 2:" in msg
    assert all(w in msg for w in THREE_WAYS), msg
    assert backend.fallback_reason([ok, no], [0, 1]).startswith("rank 1: no CUDA")
    assert backend.Availability.decode(no.encode()) == no and backend.Availability.decode(b"ok").ok


@pytest.mark.skipif(_C.cuda_device_count() > 0, reason="this machine has a CUDA device")
def test_this_machine_cannot_run_nccl():
    a = backend.local_availability(config.load({}))
    assert not a.ok and a.reason


# --- pytest side: multi-process sessions ----------------------------------------------

_runs = {}


def session(mode, **env):
    if mode not in _runs:
        e = {"BAGUA_TIMEOUT": "20", **env}
        _runs[mode] = mp.launch(__file__, WS, timeout=120, args=[mode], env=e, local_world_size=1)
    return _runs[mode]


@pytest.mark.skipif(_C.cuda_device_count() > 0, reason="this machine has a CUDA device: auto chooses NCCL")
@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", [name for name, _ in main_cases()])
def test_backend_choice(case):
    session("main").check_case(case, WS)


@pytest.mark.skipif(_C.cuda_device_count() > 0, reason="this machine has a CUDA device")
@pytest.mark.timeout(150)
def test_backend_from_the_environment():
    run = session("env_nccl", BAGUA_BACKEND="nccl")
    run.check_case("env_nccl_raises_on_every_rank", WS)
    run.check()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", [name for name, _ in control_cases()])
def test_separate_control_communicator(case):
    session("control", BAGUA_TIMEOUT="5").check_case(case, WS)


@pytest.mark.skipif(_C.cuda_device_count() > 0, reason="this machine has a CUDA device")
@pytest.mark.timeout(150)
def test_sessions_exit_cleanly():
    for mode, env in (("main", {}), ("control", {"BAGUA_TIMEOUT": "5"})):
        session(mode, **env).check()


# --- GPU: NCCL groups at world size 1 (tests/gpu/nccl_group_worker.py) --------------------


def _nccl_world_skip_reason():
    why = gpu_skip_reason()
    if why:
        return why
    a = backend.local_availability(config.load({}))
    return "" if a.ok else a.reason


def _gpu_cases():
    from tests.gpu.nccl_group_worker import case_names

    return case_names()


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", _gpu_cases())
def test_nccl_group_world_size_1(case):
    why = _nccl_world_skip_reason()
    if why:
        pytest.skip(why)
    if "gpu1" not in _runs:
        _runs["gpu1"] = mp.launch(
            os.path.join(GPU_WORKERS, "nccl_group_worker.py"),
            1,
            timeout=240,
            env={"BAGUA_BACKEND": "nccl", "BAGUA_TIMEOUT": "60"},
        )
    _runs["gpu1"].check_case(case, 1)


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_nccl_group_mismatch_two_gpus():
    why = _nccl_world_skip_reason()
    if why:
        pytest.skip(why)
    if _C.cuda_device_count() < 2:
        pytest.skip("a cross-rank mismatch needs 2 ranks, and NCCL refuses two ranks on one GPU: needs 2 GPUs")
    run = mp.launch(
        os.path.join(GPU_WORKERS, "nccl_group_worker.py"),
        2,
        timeout=240,
        args=["mismatch"],
        env={"BAGUA_BACKEND": "nccl", "BAGUA_TIMEOUT": "30"},
    )
    run.check_case("nccl_mismatch_raises_everywhere", 2)
    run.check()


if __name__ == "__main__":
    worker_main(sys.argv[1])
