"""The shared-memory allreduce of the Gloo communicator (csrc/comm/shm), on
real processes of one host:

* every dtype x op against numpy at 2 and 3 ranks, for counts of 0, 1, around
  the window (a 4 KiB window, so small buffers already take many chunks) and
  far beyond it, in place and out of place;
* 2 ranks: bitwise the TCP path's result (shm=False) on inexact float data;
  3 ranks: the same bits on every rank, close to the TCP path's;
* the segment is mapped, and its name is gone from /dev/shm; a communicator
  with shm off, below its threshold, or whose ranks disagree on the setting
  stays on TCP;
* a peer killed mid-allreduce: the survivors raise PeerError naming it, well
  within the timeout, and nothing is left in /dev/shm; a stopped peer: the
  survivors raise TimeoutError naming it, and the peer, continued, fails at
  once instead of waiting (the survivor gave up);
* a /dev/shm too small for the segment (a 64 KiB tmpfs in a private mount
  namespace, root only): every rank says why and stays on TCP, with correct
  results;
* processes in different network namespaces (emulated hosts, root only) do not
  use shared memory: their host identities differ, and a two-host group keeps
  to TCP.

This file is also the worker script.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.core.test_gloo_communicator import DTYPES, OPS, assert_close, make_input, ptr, reference, storage
from tests.harness.built_with import needs_test_bindings
from tests.harness.mp import REPO, launch, session_tests
from tests.harness.worker import StoreSession, open_store

WINDOW = 4096  # bytes per rank and buffer: many chunks even for small buffers
TIMEOUT_S = 10.0
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint8": 1}


def case_names(session: str):
    names = [
        "dtypes_ops_counts_against_numpy",
        "in_place_and_out_of_place",
        "same_bits_on_every_rank",
        "segment_mapped_and_unlinked",
        "shm_off_stays_on_tcp",
        "below_threshold_stays_on_tcp",
        "ranks_disagreeing_on_shm_stay_on_tcp",
        "reuse_after_many_calls",
    ]
    if session == "w2":
        names += ["bitwise_equal_to_tcp"]
    return names


# ---------------------------------------------------------------- worker side


def shm_mappings():
    """Names of the bagua shared-memory segments this process has mapped."""
    with open("/proc/self/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if "/dev/shm/bagua-" in line}


def segment_path(mapping: str) -> str:
    return mapping.split(" (deleted)")[0]


class Session(StoreSession):
    def __init__(self):
        super().__init__()
        self.shm = self.tuned("shm", shm=True)
        self.tcp = self.tuned("tcp", shm=False)

    def tuned(self, prefix, **options):
        options.setdefault("shm_threshold_bytes", 0)
        options.setdefault("shm_window_bytes", WINDOW)
        return self._C._create_gloo_communicator_tuned(
            self.store, prefix, self.rank, self.world, TIMEOUT_S, "127.0.0.1", **options
        )

    def allreduce(self, comm, a, op="SUM", dt="float32", out=None):
        np = __import__("numpy")
        out = np.empty_like(a) if out is None else out
        comm.allreduce(ptr(a), ptr(out), a.size, DTYPES[dt], OPS[op])
        return out

    def counts(self, dt):
        per = WINDOW // ITEMSIZE[dt]
        return [0, 1, 2, 7, per - 1, per, per + 1, 2 * per, 3 * per + 5, 10 * per + 3]

    def dtypes_ops_counts_against_numpy(self):
        for dt in DTYPES:
            for op in OPS:
                for n in self.counts(dt):
                    case = f"{dt}-{op}-{n}"
                    inputs = [make_input(case, k, dt, n, op) for k in range(self.world)]
                    got = self.allreduce(self.shm, inputs[self.rank].copy(), op, dt)
                    try:
                        assert_close(got, reference(inputs, dt, op, self.world), dt, self.world)
                    except AssertionError as e:
                        raise AssertionError(f"{case}: {e}") from None

    def in_place_and_out_of_place(self):
        np = __import__("numpy")
        n = 5 * WINDOW // 4 + 3
        inputs = [make_input("inplace", k, "float32", n) for k in range(self.world)]
        want = reference(inputs, "float32", "SUM", self.world)
        a = inputs[self.rank].copy()
        self.shm.allreduce(ptr(a), ptr(a), n, DTYPES["float32"], OPS["SUM"])
        assert_close(a, want, "float32", self.world)
        src = inputs[self.rank].copy()
        out = self.allreduce(self.shm, src)
        assert_close(out, want, "float32", self.world)
        np.testing.assert_array_equal(src, inputs[self.rank])  # the input is left alone

    def inexact(self, dt, n, seed):
        np = __import__("numpy")
        rng = np.random.default_rng(1000 * seed + self.rank)
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, size=n)
        if dt == "bfloat16":
            from tests.core.test_gloo_communicator import bf16_bits

            return bf16_bits(x.astype(np.float32))
        return x.astype(storage(dt))

    def bitwise_equal_to_tcp(self):
        np = __import__("numpy")
        for i, dt in enumerate(("float32", "float64", "float16", "bfloat16")):
            for op in ("SUM", "AVG", "MIN", "MAX", "PROD"):
                n = 7 * WINDOW // ITEMSIZE[dt] + 11
                a = self.inexact(dt, n, i)
                np.testing.assert_array_equal(
                    self.allreduce(self.shm, a, op, dt), self.allreduce(self.tcp, a, op, dt), err_msg=f"{dt} {op}"
                )

    def same_bits_on_every_rank(self):
        np = __import__("numpy")
        n = 9 * WINDOW // 4 + 1
        got = self.allreduce(self.shm, self.inexact("float32", n, 7))
        every = np.empty(n * self.world, np.float32)
        self.tcp.allgather(ptr(got), ptr(every), n, DTYPES["float32"])
        for r in range(self.world):
            np.testing.assert_array_equal(every[r * n : (r + 1) * n], got, err_msg=f"rank {r} differs")
        want = self.allreduce(self.tcp, self.inexact("float32", n, 7))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)

    def segment_mapped_and_unlinked(self):
        mapped = [m for m in shm_mappings() if m.endswith("(deleted)")]
        assert mapped, f"no deleted /dev/shm/bagua-* segment mapped: {shm_mappings()}"
        for m in mapped:
            assert not os.path.exists(segment_path(m)), f"{segment_path(m)} is still in /dev/shm"

    def stays_on_tcp(self, comm, n=WINDOW):
        before = shm_mappings()
        inputs = [make_input("tcp", k, "float32", n) for k in range(self.world)]
        got = self.allreduce(comm, inputs[self.rank].copy())
        assert_close(got, reference(inputs, "float32", "SUM", self.world), "float32", self.world)
        assert shm_mappings() == before, "a new shared-memory segment was mapped"

    def shm_off_stays_on_tcp(self):
        self.stays_on_tcp(self.tcp, 100_000)

    def below_threshold_stays_on_tcp(self):
        c = self.tuned("threshold", shm=True, shm_threshold_bytes=1 << 20)
        self.stays_on_tcp(c, 1000)
        c.close()

    def ranks_disagreeing_on_shm_stay_on_tcp(self):
        c = self.tuned("disagree", shm=self.rank == 0)
        self.stays_on_tcp(c, 100_000)
        c.close()
        c = self.tuned("disagree_window", shm_window_bytes=WINDOW * (2 if self.rank == 0 else 1))
        self.stays_on_tcp(c, 100_000)
        c.close()

    def reuse_after_many_calls(self):
        """Counters keep going across calls of different sizes on one segment."""
        for i in range(200):
            n = (i * 37) % (3 * WINDOW // 4) + 1
            inputs = [make_input(f"reuse{i}", k, "int32", n) for k in range(self.world)]
            got = self.allreduce(self.shm, inputs[self.rank].copy(), "SUM", "int32")
            assert_close(got, reference(inputs, "int32", "SUM", self.world), "int32", self.world)

    def cases(self):
        return [(name, getattr(self, name)) for name in case_names(f"w{self.world}")]


def failure_session(kind: str, victim: int):
    """`victim` is SIGKILLed ("kill") or SIGSTOPped ("stop") during a large shared-memory allreduce."""
    import numpy as np

    from bagua_core import _C
    from tests.harness.worker import report

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    server, store = open_store(_C, rank)
    timeout_s = 3.0
    c = _C._create_gloo_communicator_tuned(
        store, "world", rank, world, timeout_s, "127.0.0.1", shm=True, shm_threshold_bytes=0
    )
    a = np.ones(8 << 20, np.float32)  # 32 MiB: ~30 windows, tens of milliseconds
    c.allreduce(ptr(a), ptr(a), a.size, 0, 0)
    mapped = shm_mappings()
    store.set(f"pid/{rank}", str(os.getpid()).encode())
    c.barrier()
    if rank == victim:
        sig = signal.SIGKILL if kind == "kill" else signal.SIGSTOP
        threading.Timer(0.05, lambda: os.kill(os.getpid(), sig)).start()
        try:
            while True:
                c.allreduce(ptr(a), ptr(a), a.size, 0, 0)
        except _C.BaguaError as e:  # continued after the stop: the survivors gave up on us
            report("continued_peer_fails_fast", True, message=str(e))
        store.add("done", 1)
        return
    t0 = time.monotonic()
    try:
        for _ in range(1000):  # the victim stops during one of these
            c.allreduce(ptr(a), ptr(a), a.size, 0, 0)
    except _C.BaguaError as e:
        elapsed = time.monotonic() - t0
        # The first survivor to time out makes the others fail at once, with a timeout naming the victim too.
        want = _C.PeerError if kind == "kill" else _C.CommTimeoutError
        ok = isinstance(e, want) and elapsed < timeout_s + 3.0 and f"rank {victim}" in str(e)
        report(
            "survivor_raises",
            ok,
            "" if ok else f"{type(e).__name__} after {elapsed:.1f}s: {e}",
            kind=type(e).__name__,
            elapsed=elapsed,
            message=str(e),
        )
    else:
        report("survivor_raises", False, "allreduce kept succeeding without its peer")
    left = [segment_path(m) for m in mapped if os.path.exists(segment_path(m))]
    report("nothing_left_in_dev_shm", not left, f"left: {left}")
    try:
        c.barrier()
        report("broken_afterwards", False, "barrier succeeded on a broken communicator")
    except _C.BaguaError as e:
        report("broken_afterwards", "communicator broken by an earlier failure" in str(e), str(e))
    store.add("survived", 1)
    if kind == "stop" and rank == 0:  # once every survivor has its error: the victim's failure must not hide it
        deadline = time.monotonic() + 10
        while store.add("survived", 0) < world - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(int(store.get(f"pid/{victim}")), signal.SIGCONT)
    if rank == 0:  # rank 0 serves the store: it stays until the others are done with it
        deadline = time.monotonic() + 10
        while store.add("done", 0) < world - 1 - (kind == "kill") and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        store.add("done", 1)


def netns_worker():
    """One rank of a group split over two emulated hosts: reports whether it mapped a segment."""
    import numpy as np

    from bagua_core import _C
    from tests.harness.worker import report

    rank = int(os.environ["RANK"])
    master = os.environ["MASTER_ADDR"]
    port = int(os.environ["MASTER_PORT"])
    server = _C.TcpStoreServer(master, port) if rank == 0 else None
    store = _C.TcpStore(master, port, rank, 20.0)
    c = _C._create_gloo_communicator_tuned(
        store, "world", rank, 2, 20.0, os.environ["HOST_ADDR"], shm=True, shm_threshold_bytes=0
    )
    a = np.full(1 << 18, rank + 1.0, np.float32)
    c.allreduce(ptr(a), ptr(a), a.size, 0, 0)
    report("two_hosts_stay_on_tcp", bool(np.all(a == 3.0)) and not shm_mappings(), f"maps: {shm_mappings()}")
    c.barrier()
    store.close()
    if server is not None:
        server.close()


def full_dev_shm_worker():
    """One rank of a group whose /dev/shm cannot hold the segment."""
    import numpy as np

    from bagua_core import _C
    from tests.harness.worker import report

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    server, store = open_store(_C, rank)
    c = _C.create_gloo_communicator(store, "world", rank, world, TIMEOUT_S, "127.0.0.1")
    a = np.full(1 << 16, rank + 1.0, np.float32)
    c.allreduce(ptr(a), ptr(a), a.size, 0, 0)
    c.allreduce(ptr(a), ptr(a), a.size, 0, 0)  # stays on TCP without trying again
    report(
        "full_dev_shm_falls_back_to_tcp",
        bool(np.all(a == 6.0)) and not shm_mappings(),
        f"maps: {shm_mappings()}, values: {a[:3]}",
    )
    c.barrier()
    store.close()
    if server is not None:
        server.close()


def full_dev_shm_parent():
    """In a private mount namespace: a 64 KiB /dev/shm, then a 2-rank session; prints its result."""
    import json

    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", "/dev/shm"], check=True, timeout=30)
    run = launch(os.path.abspath(__file__), 2, timeout=60, args=["full"])
    print(
        json.dumps(
            {
                "ok": run.ok(),
                "summary": run.summary(),
                "cases": {c: {str(r): v for r, v in recs.items()} for c, recs in run.cases().items()},
                "stderr": [w.stderr for w in run.workers],
            }
        )
    )


def worker_main():
    if sys.argv[1] == "full":
        full_dev_shm_worker()
        return
    if sys.argv[1] == "full-parent":
        full_dev_shm_parent()
        return

    if sys.argv[1] in ("kill", "stop"):
        failure_session(sys.argv[1], int(sys.argv[2]))
        return
    if sys.argv[1] == "netns":
        netns_worker()
        return
    s = Session()
    s.run_and_exit(s.tcp, s.shm, s.tcp)


# ---------------------------------------------------------------- pytest side

test_case, test_session_exits_cleanly = session_tests(
    __file__, {"w2": 2, "w3": 3}, case_names, timeout=120, test_timeout=180
)


@functools.lru_cache(maxsize=None)
def failure_run(kind: str, victim: int):
    return launch(os.path.abspath(__file__), 3, timeout=60, args=[kind, str(victim)])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("victim", [2, 1])
def test_peer_killed_mid_allreduce(victim):
    run = failure_run("kill", victim)
    assert not run.timed_out, run.summary()
    assert run.workers[victim].returncode == -signal.SIGKILL, run.summary()
    cases = run.cases()
    for r in {0, 1, 2} - {victim}:
        assert run.workers[r].returncode == 0, run.summary()
        for case in ("survivor_raises", "nothing_left_in_dev_shm", "broken_afterwards"):
            assert cases[case][r]["ok"], f"rank {r} {case}: {cases[case][r]}"
        assert "has died" in cases["survivor_raises"][r]["message"], cases["survivor_raises"][r]


@pytest.mark.timeout(90)
def test_peer_stopped_mid_allreduce_times_out_naming_it():
    run = failure_run("stop", 2)
    assert not run.timed_out, run.summary()
    assert all(w.returncode == 0 for w in run.workers), run.summary()
    cases = run.cases()
    for r in (0, 1):
        for case in ("survivor_raises", "nothing_left_in_dev_shm", "broken_afterwards"):
            assert cases[case][r]["ok"], f"rank {r} {case}: {cases[case][r]}"
    assert cases["continued_peer_fails_fast"][2]["ok"], run.summary()


def _identity_in(*prefix: str) -> str:
    code = "from bagua_core import _C; print(_C._shm_host_identity())"
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True
    ).stdout.strip()


def _unshare_reason():
    if os.geteuid() != 0:
        return "new network namespaces need root: run as root (e.g. sudo) to test them"
    if subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30).returncode != 0:
        return "unshare -n fails here (no CAP_SYS_ADMIN?)"
    return None


@needs_test_bindings
@pytest.mark.timeout(60)
def test_host_identity_distinguishes_network_namespaces():
    mine = _identity_in()
    assert mine and mine == _identity_in(), mine
    reason = _unshare_reason()
    if reason:
        pytest.skip(reason)
    other = _identity_in("unshare", "-n")
    assert other and other != mine, (mine, other)


@pytest.mark.timeout(120)
def test_full_dev_shm_falls_back_to_tcp():
    import json

    reason = os.geteuid() != 0 and "mounting a small /dev/shm needs root: run as root (e.g. sudo)"
    if not reason and subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode != 0:
        reason = "unshare -m fails here (no CAP_SYS_ADMIN?)"
    if reason:
        pytest.skip(reason)
    p = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, os.path.abspath(__file__), "full-parent"],
        capture_output=True,
        text=True,
        timeout=100,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["ok"], out["summary"]
    recs = out["cases"]["full_dev_shm_falls_back_to_tcp"]
    assert len(recs) == 2 and all(r["ok"] for r in recs.values()), out["summary"]
    for err in out["stderr"]:
        assert "shared-memory allreduce unavailable, using TCP" in err and "/dev/shm full" in err, err


@pytest.mark.timeout(120)
def test_group_over_two_emulated_hosts_stays_on_tcp():
    import _hosts  # benchmarks/_hosts.py (benchmarks/ is on sys.path: pyproject's pytest pythonpath)

    reason = _hosts.unavailable_reason()
    if reason:
        pytest.skip(reason)
    import json

    from tests.harness.mp import CASE_PREFIX

    with _hosts.EmulatedHosts() as hosts:
        procs = []
        for rank in (0, 1):
            env = dict(
                os.environ,
                PYTHONPATH=REPO,
                RANK=str(rank),
                WORLD_SIZE="2",
                MASTER_ADDR=_hosts.ADDRESSES[0],
                MASTER_PORT="29611",
                HOST_ADDR=_hosts.ADDRESSES[rank],
            )
            procs.append(
                subprocess.Popen(
                    [*hosts.exec_prefix(rank), sys.executable, os.path.abspath(__file__), "netns"],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=60))
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        recs = [json.loads(line[len(CASE_PREFIX) :]) for line in out.splitlines() if line.startswith(CASE_PREFIX)]
        assert recs and all(r["ok"] for r in recs), (recs, err[-2000:])


if __name__ == "__main__":
    worker_main()
