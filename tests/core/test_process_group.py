"""Process groups: initialisation from the environment, repeated and mismatched
initialisation, handles, destroy (no threads left) and re-initialisation, debug
checks, clones (independent communicators, closed without leaving threads);
no threads, descriptors, sockets or shared-memory segments left over three
regroupings; a peer killed with SIGKILL during a collective.

This file is also the worker script (numpy only: fast to start).
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tests.harness import mp
from tests.harness.worker import resources, threads, wait_for_threads

KILL_TIMEOUT_S = 8  # BAGUA_TIMEOUT of the kill sessions


def main_case_names():
    return [name for name, _ in main_cases()]


def main_cases():
    return [
        ("queries_before_init", case_queries_before_init),
        ("init_returns_world", case_init),
        ("init_twice", case_init_twice),
        ("handles", case_handles),
        ("hostname", case_hostname),
        ("destroy_and_reinit", case_destroy_and_reinit),
        ("quick_reinit_while_rank0_lags", case_quick_reinit),
        ("debug_checks_catch_mismatch", case_debug_checks),
        ("clone_is_independent_and_closes", case_clone),
        ("no_threads_left", case_no_threads_left),
        ("no_leaks_over_three_regroupings", case_no_leaks_over_three_regroupings),
    ]


# --- workers --------------------------------------------------------------------

np = bc = None
BASELINE_THREADS = 0


def expect_raises(exc, match, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert match in str(e), f"{str(e)!r} lacks {match!r}"
        return
    raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")


def case_queries_before_init():
    assert not bc.is_initialized()
    env = os.environ
    assert bc.get_rank() == int(env["RANK"]) and bc.get_world_size() == int(env["WORLD_SIZE"])
    assert bc.get_local_rank() == int(env["LOCAL_RANK"])
    assert bc.get_local_world_size() == int(env["LOCAL_WORLD_SIZE"])
    assert bc.get_node_rank() == int(env["NODE_RANK"])
    expect_raises(RuntimeError, "init_process_group", bc.allreduce, np.zeros(2))
    expect_raises(RuntimeError, "init_process_group", bc.new_group, [0])


def case_init():
    g = bc.init_process_group()
    assert bc.is_initialized() and bc.get_default_group() is g
    rank, ws = bc.get_rank(), bc.get_world_size()
    assert (g.rank, g.size, g.ranks, g.is_member, g.device_type) == (rank, ws, tuple(range(ws)), True, "cpu")
    assert g.comm.rank == rank and g.comm.size == ws and "world" in g.comm.describe()
    assert g.comm.timeout_s == float(os.environ["BAGUA_TIMEOUT"])
    assert g.global_rank(ws - 1) == ws - 1
    x = np.full(3, rank, np.int64)
    assert (bc.allreduce(x).numpy() == ws * (ws - 1) // 2).all()


def case_init_twice():
    import dataclasses

    from bagua_core import config

    g = bc.get_default_group()
    assert bc.init_process_group() is g, "same settings: the existing group"
    other = dataclasses.replace(config.load(), timeout_s=123.0)
    expect_raises(RuntimeError, "different settings", bc.init_process_group, other)


def case_handles():
    g = bc.get_default_group()
    h = g.handle
    assert isinstance(h, int) and g.handle == h
    sub = bc.new_group([0])
    if bc.get_rank() == 0:
        assert isinstance(sub.handle, int) and sub.handle != h
    else:
        assert sub.handle is None and sub.comm is None and "non-member" in repr(sub)


def case_hostname():
    from bagua_core.rendezvous import _local_address

    assert _local_address("127.0.0.1") == "127.0.0.1"
    assert _local_address("localhost") in ("127.0.0.1", "::1")


def case_destroy_and_reinit():
    old = bc.get_default_group()
    bc.destroy_process_group()
    assert not bc.is_initialized()
    bc.destroy_process_group()  # no-op
    expect_raises(RuntimeError, "destroyed", lambda: old.comm)
    expect_raises(RuntimeError, "destroyed", bc.allreduce, np.zeros(2), None, "sum", old)
    expect_raises(RuntimeError, "init_process_group", bc.allreduce, np.zeros(2))
    g = bc.init_process_group()
    assert g is not old
    ws = bc.get_world_size()
    assert (bc.allreduce(np.ones(4)).numpy() == ws).all()


def case_quick_reinit():
    import time

    # rank 0 (the store's host) is slow to let go: the others re-initialise
    # while the old store still answers, and must wait for the new one.
    for _ in range(2):
        if bc.get_rank() == 0:
            time.sleep(0.3)
        bc.destroy_process_group()
        bc.init_process_group()
        assert (bc.allreduce(np.ones(2)).numpy() == bc.get_world_size()).all()


def case_debug_checks():
    import dataclasses

    from bagua_core import config

    bc.destroy_process_group()
    bc.init_process_group(dataclasses.replace(config.load(), debug_checks=True))
    rank = bc.get_rank()
    bc.allreduce(np.ones(3))  # agreeing ranks pass
    expect_raises(bc.MismatchError, "", bc.allreduce, np.ones(3 + (rank == 1), np.float32))
    bc.destroy_process_group()
    bc.init_process_group()


def case_clone():
    import threading

    g = bc.get_default_group()
    rank, ws = bc.get_rank(), bc.get_world_size()
    bc.barrier()
    before = threads()
    c = g.clone()
    assert c.name.startswith("world/clone") and c.ranks == g.ranks and c.rank == g.rank
    assert c.comm is not g.comm and c.name in c.comm.describe()
    # a thread communicating on the clone never meets the group's collectives,
    # whatever the interleaving on each rank
    results = {}

    def on_clone():
        results["clone"] = [bc.allreduce(np.full(5, rank + 1.0), group=c).numpy() for _ in range(20)]

    t = threading.Thread(target=on_clone)
    t.start()
    mine = [bc.allreduce(np.full(3, 10.0 * (rank + 1)), group=g).numpy() for _ in range(20)]
    t.join(60)
    total = ws * (ws + 1) / 2
    assert all((x == 10 * total).all() and x.shape == (3,) for x in mine)
    assert all((x == total).all() and x.shape == (5,) for x in results["clone"])
    _ = c.intra_node_group().comm  # closed with the clone
    raw = c.comm
    c.close()
    c.close()  # idempotent
    assert c.closed and not g.closed
    expect_raises(RuntimeError, "closed", lambda: c.comm)
    x = np.ones(2, np.float32)
    expect_raises(bc.BaguaError, "closed", raw.allreduce, x.ctypes.data, x.ctypes.data, 2, int(bc.DType.float32), 0)
    wait_for_threads(before)
    expect_raises(ValueError, "destroy_process_group", g.close)
    sub = bc.new_group([0, 2])
    sc = sub.clone()  # every rank may call it; only members connect
    assert sc.is_member == sub.is_member and (sc.comm is None) == (sub.comm is None)
    if sc.is_member:
        assert (bc.allreduce(np.ones(2), group=sc).numpy() == 2).all()
    sc.close()
    sub.close()
    g.clone()  # left open: destroy_process_group() frees it (no_threads_left)


def case_no_threads_left():
    _ = bc.new_group([0, 1]).comm  # a few communicators more
    bc.get_default_group().intra_node_group()
    bc.destroy_process_group()
    assert threads() == BASELINE_THREADS, f"{threads()} threads after destroy, {BASELINE_THREADS} before init"


def regroup() -> None:
    """One membership change as a worker sees it: a new group, traffic over
    every transport (TCP, shared memory, a subgroup, a clone), then destroy."""
    bc.init_process_group()
    assert (bc.allreduce(np.ones(1 << 20, np.float32)).numpy() == bc.get_world_size()).all()
    bc.allreduce(np.ones(8), group=bc.new_group([0, 1]))
    bc.get_default_group().clone()
    live = resources()
    assert live["sockets"] > 0 and live["shm segments"] > 0, live  # what the destroy must free
    bc.destroy_process_group()


def case_no_leaks_over_three_regroupings():
    regroup()  # one-time setup (e.g. the step thread) is not a leak
    wait_for_threads(BASELINE_THREADS)
    before = resources()
    for _ in range(3):
        regroup()
    wait_for_threads(before["threads"])
    after = resources()
    assert after == before, f"after 3 regroupings {after}, before {before}"


def kill_worker(victim: int) -> int:
    """Every rank loops over allreduces; the victim SIGKILLs itself mid-way."""
    import threading
    import time

    from tests.harness.worker import report

    bc.init_process_group()
    rank = bc.get_rank()
    x = np.ones(1 << 20, np.float32)
    if rank == victim:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    start = time.monotonic()
    try:
        for _ in range(100000):
            bc.allreduce_inplace(x)
            if time.monotonic() - start > 60:
                break
        report("survivor_raises", False, "the loop ended without an error")
    except bc.BaguaError as e:
        report(
            "survivor_raises",
            True,
            elapsed=time.monotonic() - start - 0.3,
            error_type=type(e).__name__,
            message=str(e)[:300],
        )
    bc.destroy_process_group()
    return 0


def worker_main(mode: str) -> int:
    global np, bc, BASELINE_THREADS
    import numpy

    import bagua_core
    from tests.harness.worker import run_cases

    np, bc = numpy, bagua_core
    if mode.startswith("kill"):
        return kill_worker(int(mode[4:]))
    BASELINE_THREADS = threads()
    return 0 if run_cases(main_cases()) == 0 else 1


# --- pytest -----------------------------------------------------------------------


def _session(key, launch):
    cache = _session.__dict__.setdefault("cache", {})
    if key not in cache:
        cache[key] = launch()
    return cache[key]


def main_session():
    return _session("main", lambda: mp.launch(os.path.abspath(__file__), 3, timeout=90, args=["main"]))


@pytest.mark.parametrize("case", main_case_names())
def test_process_group(case):
    run = main_session()
    got = run.cases().get(case, {})
    assert sorted(got) == [0, 1, 2], f"missing ranks for {case}\n{run.summary()}"
    errors = {r: rec["error"] for r, rec in got.items() if not rec["ok"]}
    assert not errors, "\n".join(f"--- rank {r}\n{e}" for r, e in sorted(errors.items()))


def test_main_session_exits_cleanly():
    main_session().check()


def test_single_process_needs_no_store():
    """Without a launcher (no RANK): world size 1, no store, no ports, even when
    the default store port is taken."""
    import socket
    import subprocess

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID")
        }
        env.update(MASTER_ADDR="127.0.0.1", BAGUA_STORE_PORT=str(taken.getsockname()[1]), PYTHONPATH=mp.REPO)
        code = (
            "import numpy as np, bagua_core as bc; g = bc.init_process_group(); "
            "assert (g.rank, g.size) == (0, 1); "
            "assert (bc.allreduce(np.arange(3.0)).numpy() == np.arange(3.0)).all(); "
            "assert bc.broadcast_object({'a': 1}) == {'a': 1}; "
            "assert bc.new_group([0]).inter_node_group().size == 1; bc.destroy_process_group()"
        )
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("world_size,victim", [(3, 2), (2, 0)])
def test_killed_peer_fails_every_survivor(world_size, victim):
    """victim 0 also takes the rendezvous store down with it."""
    run = mp.launch(
        os.path.abspath(__file__),
        world_size,
        timeout=KILL_TIMEOUT_S + 40,
        args=[f"kill{victim}"],
        env={"BAGUA_TIMEOUT": str(KILL_TIMEOUT_S)},
    )
    assert not run.timed_out, run.summary()
    assert run.workers[victim].returncode == -signal.SIGKILL, run.summary()
    cases = run.cases().get("survivor_raises", {})
    for w in run.workers:
        if w.rank == victim:
            continue
        assert w.returncode == 0, run.summary()
        rec = cases.get(w.rank)
        assert rec and rec["ok"], run.summary()
        assert rec["elapsed"] < KILL_TIMEOUT_S + 2, rec
        print(f"rank {w.rank}: {rec['error_type']} after {rec['elapsed']:.2f}s: {rec['message']}")


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))


@pytest.mark.timeout(60)
def test_ctrl_c_while_waiting_at_rendezvous_stops_at_once_and_says_what_it_waits_for():
    # rank 1 without rank 0 waits for the store; rank 0 without rank 1 waits for rank 1
    import subprocess
    import time

    waits = {
        1: "rank 1 is waiting for rank 0's rendezvous store at 127.0.0.1:",
        0: "rank 0 is waiting for rank 1 to join the job",
    }
    procs = {}
    for rank in (0, 1):
        env = mp.worker_env(rank, 2, mp.free_master_ports(), extra={"BAGUA_TIMEOUT": "50"})
        procs[rank] = subprocess.Popen(
            [sys.executable, "-c", "import bagua_core; bagua_core.init_process_group()"],
            env=env,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=mp.REPO,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        for rank, p in procs.items():
            line = p.stderr.readline().decode()  # the first notice, after 10 s
            assert waits[rank] in line and "timeout in" in line, line
            start = time.monotonic()
            p.send_signal(signal.SIGINT)
            p.wait(timeout=5)
            assert time.monotonic() - start < 2.0
            assert b"KeyboardInterrupt" in p.stderr.read()
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
