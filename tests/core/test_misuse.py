"""Careless callers get a Python exception on every rank, never an aborted
process, a hang or a silently wrong result.

Sessions of 3 processes with debug checks off (BAGUA_DEBUG_CHECKS=0) unless
named otherwise: a size mismatch in every collective, an empty array on one
rank only, alltoall with send aliasing recv, torch neg-bit views, two threads
on one group, new_group with different rank lists. After each mismatch the
group keeps working (checked with a numpy reference). Then diagnostics: a
timeout names the rank that did not arrive (new_group, a Gloo rendezvous, a
collective), a rendezvous fails fast on a dead member, running out of file
descriptors is said plainly, WORLD_SIZE disagreement is named. This file is
also the worker script.
"""

from __future__ import annotations

import os
import sys
import threading

import pytest

from tests.harness import mp

WS = 3
COLLECTIVES = (
    "allreduce",
    "reduce",
    "broadcast",
    "allgather",
    "gather",
    "scatter",
    "reduce_scatter",
    "alltoall",
    "alltoall_v",
    "allgather_inplace",
)


# --- worker side --------------------------------------------------------------

np = bc = None
RANK = 0


def still_in_step():
    """A correct allreduce right after: the ranks are still paired correctly."""
    x = np.full(5, RANK + 1, np.float64)
    bc.allreduce_inplace(x)
    assert np.array_equal(x, np.full(5, WS * (WS + 1) / 2)), x


def call(prim, n):
    """``prim`` with chunks of ``n`` elements on this rank."""
    x = np.ones(WS * n, np.float32)
    if prim == "allreduce":
        bc.allreduce(x[:n])
    elif prim == "reduce":
        bc.reduce(x[:n], dst=0)
    elif prim == "broadcast":
        bc.broadcast(x[:n], 0)
    elif prim == "allgather":
        bc.allgather(x[:n])
    elif prim == "allgather_inplace":
        bc.allgather_inplace(x)
    elif prim == "gather":
        bc.gather(x[:n], dst=0)
    elif prim == "scatter":
        bc.scatter(x if RANK == 0 else None, np.zeros(n, np.float32), src=0)
    elif prim == "reduce_scatter":
        bc.reduce_scatter(x)
    elif prim == "alltoall":
        bc.alltoall(x)
    elif prim == "alltoall_v":
        # n elements to each peer, 2 to itself; every rank expects 2 from each
        m = max(n, 2)
        sc = [2 if j == RANK else n for j in range(WS)]
        bc.alltoall_v(
            np.ones(WS * m, np.float32), sc, [j * m for j in range(WS)], None, [2] * WS, [2 * i for i in range(WS)]
        )
    else:
        raise AssertionError(prim)


def expect_mismatch(fn):
    try:
        fn()
    except bc.MismatchError as e:
        assert "disagree" in str(e) or "called" in str(e), e
    else:
        raise AssertionError("no MismatchError")
    still_in_step()


def size_mismatch_cases():
    out = []
    for prim in COLLECTIVES:
        # rank 1 sends chunks of 3 elements, the others of 2; alltoall_v: rank 1
        # sends 3 to everyone, who all expect 2
        out.append((f"size_mismatch[{prim}]", lambda p=prim: expect_mismatch(lambda: call(p, 3 if RANK == 1 else 2))))
        # an empty array on one rank only
        out.append(
            (f"empty_on_one_rank[{prim}]", lambda p=prim: expect_mismatch(lambda: call(p, 0 if RANK == 1 else 2)))
        )
    out.append(("empty_everywhere_is_a_no_op", lambda: [call(p, 0) for p in COLLECTIVES if p != "alltoall_v"]))
    out.append(
        (
            "dtype_mismatch",
            lambda: expect_mismatch(lambda: bc.allreduce(np.ones(4, np.float32 if RANK != 2 else np.float64))),
        )
    )
    out.append(
        ("root_mismatch", lambda: expect_mismatch(lambda: bc.broadcast(np.ones(4, np.float32), 1 if RANK == 2 else 0)))
    )
    out.append(("bool_root_is_refused", case_bool_root))
    out.append(("unpicklable_object_raises_everywhere", case_unpicklable))
    # ranks 0, 1 pass [0, 1] and rank 2 [0, 1, 2]; then rank 2 believes it is left out
    out.append(("new_group_rank_lists_differ", lambda: case_new_group_lists([0, 1], [0, 1, 2])))
    out.append(("new_group_non_member_disagrees", lambda: case_new_group_lists([0, 1, 2], [0, 1])))
    return out


def case_new_group_lists(most, rank2):
    try:
        bc.new_group(rank2 if RANK == 2 else most)
    except bc.MismatchError as e:
        want = f"rank 2 passed ranks [{','.join(map(str, rank2))}] while rank 0 passed [{','.join(map(str, most))}]"
        assert want in str(e), e
    else:
        raise AssertionError("new_group proceeded with different rank lists")
    still_in_step()
    sub = bc.new_group([0, 2])  # the ranks still number their groups alike
    if RANK in (0, 2):
        y = np.full(2, RANK, np.float32)
        bc.allreduce_inplace(y, group=sub)
        assert np.all(y == 2), y


def case_control_is_separate():
    world = bc.get_default_group()
    assert world.control_group is not world and world.control_group.comm is not world.comm
    sub = bc.new_group([0, 1])
    if sub.is_member:
        assert sub.control_group is not sub
        sub.close()


def case_bool_root():
    try:
        bc.broadcast(np.ones(2, np.float32), True)
    except TypeError as e:
        assert "integer rank" in str(e), e
    else:
        raise AssertionError("broadcast(x, True) was accepted")


def case_unpicklable():
    import time

    t0 = time.monotonic()
    try:
        bc.broadcast_object(threading.Lock() if RANK == 0 else None, 0)
    except (TypeError, ValueError) as e:
        assert RANK == 0 or "could not pickle" in str(e), e
    else:
        raise AssertionError("no error")
    assert time.monotonic() - t0 < 5, "the peers waited for the timeout"
    still_in_step()


def case_alias():
    n = 2
    x = np.concatenate([np.full(n, 10 * RANK + j, np.float32) for j in range(WS)])
    want = np.concatenate([np.full(n, 10 * i + RANK, np.float32) for i in range(WS)])
    assert bc.alltoall(x, x) is x
    assert np.array_equal(x, want), (x, want)
    c, d = [n] * WS, [n * i for i in range(WS)]
    y = np.concatenate([np.full(n, 10 * RANK + j, np.float32) for j in range(WS)])
    bc.alltoall_v(y, c, d, y, c, d)
    assert np.array_equal(y, want), (y, want)


def case_neg_bit():
    import torch

    re = torch.arange(4, dtype=torch.float32) + RANK
    im = torch.arange(4, dtype=torch.float32) * (RANK + 1)
    strided = torch.complex(re, im).conj().imag  # a view with the negative bit set
    v = torch._neg_view(im)  # shows -im too: contiguous, negative bit set
    assert v.is_neg() and strided.is_neg() and v.is_contiguous()
    assert np.array_equal(np.from_dlpack(bc.allreduce(strided.contiguous())), np.from_dlpack(bc.allreduce(v)))
    want = -sum(np.arange(4, dtype=np.float32) * (r + 1) for r in range(WS))
    got = np.from_dlpack(bc.allreduce(v))
    assert np.array_equal(got, want), (got, want)
    got = np.from_dlpack(bc.allgather(v))
    assert np.array_equal(got[RANK], v.resolve_neg().numpy()), got
    try:
        bc.allreduce_inplace(v)
    except ValueError as e:
        assert "negative or conjugate bit" in str(e), e
    else:
        raise AssertionError("writing into a neg-bit view was accepted")
    still_in_step()


def case_threads():
    """Two threads run 200 allreduces each on the world group. Every result
    that comes back is correct; misuse raises ConcurrentUseError on at least
    one rank and every thread ends with a BaguaError (no hang, no abort)."""
    wrong, errors = [], []

    def loop(scale):
        x = np.full(64, scale * (RANK + 1), np.float64)
        want = np.full(64, scale * WS * (WS + 1) / 2)
        try:
            for _ in range(200):
                got = bc.allreduce(x)
                if not np.array_equal(np.asarray(got), want):
                    wrong.append(scale)
        except bc.BaguaError as e:
            errors.append(e)

    ts = [threading.Thread(target=loop, args=(s,), name=f"worker-{s}") for s in (1, 1000)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts), "a thread hangs"
    # the verdict travels with the case record: checked across ranks by the test
    kinds = sorted({type(e).__name__ for e in errors})
    from tests.harness.worker import report

    report(
        "threads_detail",
        True,
        wrong=len(wrong),
        errors=kinds,
        messages=[str(e)[:300] for e in errors if isinstance(e, bc.ConcurrentUseError)][:1],
    )


def case_assign_load():
    """load_state_dict(assign=True) after with_bagua: training stays in step
    (every rank ends with the same weights, equal to torch DDP's)."""
    import torch
    import torch.distributed as dist

    import bagua_torch  # noqa: F401 - adds with_bagua
    from bagua_torch.algorithms import GradientAllReduceAlgorithm

    torch.set_num_threads(1)
    dist.init_process_group("gloo")

    def make(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    model, ref = make(0), make(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.with_bagua([opt], GradientAllReduceAlgorithm())
    ddp = torch.nn.parallel.DistributedDataParallel(ref)
    ref_opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    checkpoint = {k: v.clone() + 0.5 for k, v in make(1).state_dict().items()}
    kept = list(model.parameters())
    model.load_state_dict(checkpoint, assign=True)
    ref.load_state_dict(checkpoint)
    assert all(a is b for a, b in zip(model.parameters(), kept)), "wrapped parameters were replaced"
    for name, value in model.state_dict().items():
        assert torch.equal(value, checkpoint[name]), name
    for step in range(4):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x = torch.randn(8, 4, generator=g)
        for m, o in ((model, opt), (ddp, ref_opt)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    assert torch.allclose(mine, want, rtol=1e-5, atol=1e-6), (mine - want).abs().max()
    everyone = bc.allgather(mine)
    assert all(torch.equal(torch.from_dlpack(everyone)[r], mine) for r in range(WS)), "ranks drifted apart"
    dist.destroy_process_group()


_STOPPER = r"""
import os, signal, sys, time
from bagua_core import _C
store = _C.TcpStore("127.0.0.1", int(sys.argv[1]), -1, 30.0, os.environ.get("BAGUA_STORE_SECRET", ""))
store.wait([sys.argv[2]])  # the victim published its address: it is inside the connect phase
os.kill(int(sys.argv[3]), signal.SIGSTOP)
time.sleep(float(sys.argv[4]))
os.kill(int(sys.argv[3]), signal.SIGCONT)
store.close()
"""


def case_connect_timeout():
    """Rank 1 stops (SIGSTOP) right after publishing its address for a new
    group: its peers give up within about BAGUA_TIMEOUT, not 5 x."""
    import subprocess
    import time

    timeout = float(os.environ["BAGUA_TIMEOUT"])
    if RANK == 1:
        port = int(os.environ["MASTER_PORT"]) + 1
        helper = subprocess.Popen(
            [sys.executable, "-c", _STOPPER, str(port), "group1/gloo/lane0/1", str(os.getpid()), str(3 * timeout)],
            env=mp.repo_env(),
        )
    else:
        time.sleep(1.0)  # rank 1 publishes first and waits for us: the helper stops it in time
    t0 = time.monotonic()
    try:
        bc.new_group([0, 1, 2])
    except bc.BaguaError as e:
        elapsed = time.monotonic() - t0
        if RANK != 1:
            assert elapsed < 2 * timeout, f"gave up after {elapsed:.1f} s ({e})"
    else:
        raise AssertionError("connecting to a stopped peer succeeded")
    finally:
        if RANK == 1:
            helper.wait(60)


def worker_main(mode: str) -> int:
    global np, bc, RANK
    import numpy

    import bagua_core
    from tests.harness.worker import run_cases

    np, bc = numpy, bagua_core
    if mode == "sizes_control":
        # Gloo groups built like NCCL groups: every call agreed on over a
        # separate control communicator (comm/agreed_communicator.h)
        from bagua_core import process_group

        process_group._separate_control = True
    bc.init_process_group()
    RANK = bc.get_rank()
    if mode == "sizes":
        cases = size_mismatch_cases()
    elif mode == "sizes_control":
        cases = [("control_is_separate", case_control_is_separate)] + size_mismatch_cases()
    elif mode == "alias_neg":
        cases = [("alltoall_send_aliases_recv", case_alias), ("torch_neg_bit", case_neg_bit)]
    elif mode == "assign":
        cases = [("load_state_dict_assign_keeps_sync", case_assign_load)]
    elif mode == "connect":
        cases = [("connect_timeout_is_bagua_timeout", case_connect_timeout)]
    elif mode == "threads":
        cases = [("threads", case_threads)]
    else:
        raise SystemExit(f"unknown mode {mode}")
    failures = run_cases(cases)
    if mode not in ("threads", "connect"):
        bc.destroy_process_group()
    sys.stdout.flush()
    os._exit(0 if failures == 0 else 1)


# --- pytest side --------------------------------------------------------------

_runs = {}


def session(mode, **env):
    if mode not in _runs:
        e = {"BAGUA_DEBUG_CHECKS": "0", "BAGUA_TIMEOUT": "20", **env}
        _runs[mode] = mp.launch(__file__, WS, timeout=120, args=[mode], env=e)
    return _runs[mode]


SIZE_CASES = [f"{kind}[{p}]" for p in COLLECTIVES for kind in ("size_mismatch", "empty_on_one_rank")] + [
    "empty_everywhere_is_a_no_op",
    "dtype_mismatch",
    "root_mismatch",
    "bool_root_is_refused",
    "unpicklable_object_raises_everywhere",
    "new_group_rank_lists_differ",
    "new_group_non_member_disagrees",
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", SIZE_CASES)
def test_size_mismatch_is_an_exception_on_every_rank(case):
    run = session("sizes")
    run.check_case(case, WS)


@pytest.mark.timeout(150)
def test_size_mismatch_session_never_aborts():
    session("sizes").check()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", ["control_is_separate"] + SIZE_CASES)
def test_size_mismatch_over_a_separate_control_communicator(case):
    """The same cases with every call agreed on over a Gloo control
    communicator beside the data one, as on NCCL groups."""
    session("sizes_control").check_case(case, WS)


@pytest.mark.timeout(150)
def test_separate_control_session_never_aborts():
    session("sizes_control").check()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", ["alltoall_send_aliases_recv", "torch_neg_bit"])
def test_aliasing_and_neg_bit(case):
    run = session("alias_neg")
    run.check_case(case, WS)
    run.check()


@pytest.mark.timeout(150)
def test_load_state_dict_assign_keeps_synchronisation():
    run = session("assign")
    run.check_case("load_state_dict_assign_keeps_sync", WS)
    run.check()


@pytest.mark.timeout(150)
def test_connect_waits_at_most_the_timeout():
    run = mp.launch(__file__, WS, timeout=120, args=["connect"], env={"BAGUA_TIMEOUT": "4"})
    run.check_case("connect_timeout_is_bagua_timeout", WS)
    run.check()


_WORLD_SIZE_WORKER = """
import sys
from bagua_core import config
import bagua_core as bc
try:
    bc.init_process_group()
except config.ConfigError as e:
    print("CONFIG-ERROR", e, flush=True)
    sys.exit(3)
except bc.BaguaError as e:
    print("BAGUA-ERROR", e, flush=True)
    sys.exit(4)
"""


_DEAD_MEMBER_WORKER = """
import os, sys, time
import bagua_core as bc
bc.init_process_group()
bc.barrier()
if bc.get_rank() == 2:
    os._exit(7)  # dies without a goodbye: the store reports it dead
t0 = time.monotonic()
try:
    bc.new_group([0, 1, 2])
except bc.PeerError as e:
    print("PEER-ERROR", round(time.monotonic() - t0, 1), e, flush=True)
    ok = "rank 2 has died" in str(e) and time.monotonic() - t0 < 5
    if bc.get_rank() == 0:
        time.sleep(2)  # hosts the store: the others still read it
    os._exit(0 if ok else 5)
os._exit(6)
"""


@pytest.mark.timeout(150)
def test_rendezvous_fails_fast_when_a_member_died():
    run = mp.launch(_DEAD_MEMBER_WORKER, WS, timeout=60, env={"BAGUA_TIMEOUT": "30"})
    assert not run.timed_out, run.summary()
    assert [w.returncode for w in run.workers] == [0, 0, 7], run.summary()


_MISSING_RANK_WORKER = """
import time
import bagua_core as bc
bc.init_process_group()
if bc.get_rank() == 2:
    time.sleep(10)  # calls neither; leaves cleanly after its peers gave up
else:
    try:
        bc.new_group([0, 1])
    except bc.CommTimeoutError as e:
        print("TIMEOUT", e, flush=True)
        assert "rank 2 did not call new_group() within 3.0 s" in str(e), e
    else:
        raise AssertionError("new_group went ahead without rank 2")
    try:
        bc.get_default_group().clone()  # only members call clone(): Gloo's rendezvous waits
    except bc.CommTimeoutError as e:
        print("TIMEOUT", e, flush=True)
        assert "group rank 2 did not come to the rendezvous" in str(e), e
    else:
        raise AssertionError("clone went ahead without rank 2")
bc.destroy_process_group()
"""


@pytest.mark.timeout(150)
def test_rendezvous_timeout_names_the_missing_rank():
    run = mp.launch(_MISSING_RANK_WORKER, WS, timeout=60, env={"BAGUA_TIMEOUT": "3"})
    run.check()


_STUCK_RANK_WORKER = """
import time
import numpy as np
import bagua_core as bc
bc.init_process_group()
bc.allreduce(np.ones(4, np.float32))
if bc.get_rank() == 2:
    time.sleep(8)  # stuck outside the collective; leaves after its peers gave up
else:
    try:
        bc.allreduce(np.ones(4, np.float32))
    except bc.BaguaError as e:
        print("FAILED", type(e).__name__, e, flush=True)
        assert "rank 2 did not reach op #" in str(e), e
    else:
        raise AssertionError("the allreduce completed without rank 2")
    if bc.get_rank() == 0:
        time.sleep(3)  # hosts the store: rank 1 may time out later and still ask it
"""


@pytest.mark.timeout(150)
def test_collective_timeout_names_the_rank_that_did_not_arrive():
    run = mp.launch(_STUCK_RANK_WORKER, WS, timeout=60, env={"BAGUA_TIMEOUT": "3"})
    run.check()
    assert any("FAILED CommTimeoutError" in w.stdout for w in run.workers[:2]), run.summary()


_OUT_OF_FDS_WORKER = """
import os, resource, sys, time
import numpy as np
import bagua_core as bc
from bagua_core import _C
bc.init_process_group()
rank = bc.get_rank()
if rank == 1:
    # use up every descriptor this process may open
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(map(int, os.listdir("/proc/self/fd"))) + 1, hard))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    t0 = time.monotonic()
    try:
        _C.TcpStore("127.0.0.1", int(os.environ["MASTER_PORT"]) + 1, 1, 20.0)
    except bc.BaguaError as e:
        print("STORE", round(time.monotonic() - t0, 2), e, flush=True)
    try:
        bc.new_group([0, 1, 2])
    except bc.BaguaError as e:
        print("GROUP", e, flush=True)
    sys.stdout.flush()
    os._exit(0)  # no goodbye: the others hear that rank 1 died
t0 = time.monotonic()
try:
    bc.new_group([0, 1, 2])
except bc.BaguaError as e:
    print("PEER", type(e).__name__, round(time.monotonic() - t0, 1), e, flush=True)
    os._exit(0)
os._exit(5)
"""


@pytest.mark.timeout(150)
def test_out_of_file_descriptors_is_said_plainly():
    run = mp.launch(_OUT_OF_FDS_WORKER, WS, timeout=90, env={"BAGUA_TIMEOUT": "20"})
    assert not run.timed_out and all(w.returncode == 0 for w in run.workers), run.summary()
    out = run.workers[1].stdout
    store = next(l for l in out.splitlines() if l.startswith("STORE"))
    assert float(store.split()[1]) < 2 and "out of file descriptors (RLIMIT_NOFILE=" in store, out
    assert "while connecting to the rendezvous store at 127.0.0.1" in store, out
    group = next(l for l in out.splitlines() if l.startswith("GROUP"))
    assert "out of file descriptors (RLIMIT_NOFILE=" in group and "connecting to peers" in group, out
    for w in (run.workers[0], run.workers[2]):
        assert "PEER PeerError" in w.stdout and "rank 1" in w.stdout, run.summary()


@pytest.mark.timeout(150)
def test_world_size_disagreement_is_named():
    run = mp.launch(
        _WORLD_SIZE_WORKER, WS, timeout=60, env={"BAGUA_TIMEOUT": "5"}, per_rank_env={2: {"WORLD_SIZE": "4"}}
    )
    assert not run.timed_out, run.summary()
    bad = run.workers[2]
    assert bad.returncode == 3 and "WORLD_SIZE=4 on rank 2 but 3 on rank 0" in bad.stdout, run.summary()
    assert all(w.returncode in (0, 4) for w in run.workers[:2]), run.summary()


@pytest.mark.timeout(150)
def test_two_threads_on_one_group_raise_not_corrupt():
    run = mp.launch(__file__, WS, timeout=120, args=["threads"], env={"BAGUA_DEBUG_CHECKS": "0", "BAGUA_TIMEOUT": "5"})
    run.check()
    details = {r: rec for r, rec in run.cases().get("threads_detail", {}).items()}
    assert len(details) == WS, run.summary()
    assert all(d["wrong"] == 0 for d in details.values()), details
    assert any("ConcurrentUseError" in d["errors"] for d in details.values()), details
    msg = next(d["messages"][0] for d in details.values() if d["messages"])
    assert "worker-1" in msg and "worker-1000" in msg, msg


if __name__ == "__main__":
    worker_main(sys.argv[1])
