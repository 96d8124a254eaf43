"""The rendezvous store against strangers: a client must prove it holds the
job's secret (BAGUA_STORE_SECRET) before anything else; values and total
bytes are bounded; keys are written once; connections in their handshake
hold at most a tiny frame and cannot lock the ranks out; the connection cap
stays below the descriptor limit. Last, against a live 3-process job: a
hostile client (the job keeps training, no rank is reported dead, rank 0's
memory and descriptors stay bounded), and an authenticated client that goes
silent (closed after the idle timeout, while the ranks, quiet for several
idle timeouts, keep their store connections).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import pytest

from tests.core.test_store import HOST, OP_SET, closed_by_server, frame, hello, raw_connect, raw_hello, s
from tests.harness import mp

SECRET = "test-secret-0123456789"


def _C():
    from bagua_core import _C as c

    return c


@pytest.fixture
def server():
    srv = _C().TcpStoreServer(HOST, 0, io_timeout_s=2.0, secret=SECRET, max_value_bytes=1000, max_total_bytes=5000)
    yield srv
    srv.close()


@pytest.mark.timeout(60)
def test_only_clients_with_the_secret_are_served(server):
    C = _C()
    with C.TcpStore(HOST, server.port, 0, 5.0, SECRET) as a:
        a.set("k", b"v")
        for wrong in ("", "guess"):
            with pytest.raises(C.BaguaError, match="BAGUA_STORE_SECRET"):
                C.TcpStore(HOST, server.port, 1, 5.0, wrong)
        assert a.get("k") == b"v"
    # the raw handshake with Python's own HMAC-SHA256 agrees with the engine's
    raw_hello(server.port, 3, SECRET.encode()).close()


@pytest.mark.timeout(60)
def test_a_stranger_cannot_report_a_rank_dead(server):
    C = _C()
    obs = C.TcpStore(HOST, server.port, -1, 5.0, SECRET)
    for rank in (0, 1, 2):
        sock = raw_connect(server.port)
        sock.sendall(hello(rank))  # says hello as that rank, never authenticates
        sock.close()
    bad = raw_connect(server.port)
    bad.sendall(hello(1))
    bad.recv(64)
    bad.sendall(frame(bytes([9]) + s(b"\0" * 32)))  # a wrong proof
    assert closed_by_server(bad, 3.0)
    time.sleep(0.3)
    assert obs.dead_ranks() == []
    obs.close()


@pytest.mark.timeout(60)
def test_no_large_frames_before_authentication(server):
    sock = raw_connect(server.port)
    sock.sendall(struct.pack("<I", 60 << 20) + b"x" * 4096)  # a 60 MiB frame announced
    assert closed_by_server(sock, 1.0)  # at once
    sock = raw_connect(server.port)
    sock.sendall(hello(0))
    sock.recv(64)
    sock.sendall(frame(bytes([OP_SET]) + s(b"k") + s(b"v")))  # a request instead of the proof
    assert closed_by_server(sock, 1.0)


@pytest.mark.timeout(60)
def test_value_and_total_sizes_are_bounded(server):
    C = _C()
    with C.TcpStore(HOST, server.port, 0, 5.0, SECRET) as a:
        with pytest.raises(C.BaguaError, match="BAGUA_STORE_MAX_VALUE_BYTES"):
            a.set("big", b"x" * 1001)
        with pytest.raises(C.BaguaError, match="BAGUA_STORE_MAX_BYTES"):
            for i in range(10):
                a.set(f"v{i}", b"x" * 900)
        with pytest.raises(C.BaguaError, match="written once"):
            a.set("v0", b"forged")
        assert a.get("v0") == b"x" * 900
        assert not a.check(["big"])


@pytest.mark.timeout(60)
def test_a_handshake_flood_does_not_lock_the_ranks_out(server):
    C = _C()
    flood = [raw_connect(server.port) for _ in range(300)]
    t0 = time.monotonic()
    with C.TcpStore(HOST, server.port, 0, 5.0, SECRET) as a:
        a.set("in", b"1")
    assert time.monotonic() - t0 < 2.0
    for sock in flood:
        sock.close()


_SERVER_UNDER_LOW_LIMIT = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
from bagua_core import _C
srv = _C.TcpStoreServer("127.0.0.1", 0, secret=%r)
print(srv.port, flush=True)
sys.stdin.readline()
"""


@pytest.mark.timeout(60)
def test_connections_stay_below_the_descriptor_limit():
    """A store server in a process limited to 128 descriptors: 200 clients
    that authenticate (the most a holder of the secret can do) get at most
    half of them; the process keeps running and serves again afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER_UNDER_LOW_LIMIT % SECRET],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=mp.REPO,
        env=mp.repo_env(),
    )
    try:
        port = int(proc.stdout.readline())
        socks = []
        for _ in range(200):
            try:
                socks.append(raw_hello(port, -1, SECRET.encode()))
            except (AssertionError, OSError):
                pass  # refused: over the cap
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        assert fds < 128, fds
        assert 32 <= len(socks) <= 64, len(socks)
        assert proc.poll() is None
        for sock in socks:
            sock.close()
        time.sleep(0.3)
        raw_hello(port, 0, SECRET.encode()).close()
    finally:
        proc.stdin.close()
        proc.wait(10)


# --- a hostile client against a live job -----------------------------------------

_ATTACK = r"""
import json, socket, struct, sys, time
from bagua_core import _C
port = int(sys.argv[1])
out = {}
try:
    _C.TcpStore("127.0.0.1", port, 1, 3.0, "not-the-secret")
    out["wrong_secret"] = "accepted"
except _C.BaguaError as e:
    out["wrong_secret"] = "refused" if "secret" in str(e) else str(e)
def hello(rank):
    body = struct.pack("<BIIi", 1, 0x54534742, 2, rank)
    return struct.pack("<I", len(body)) + body
for r in range(3):  # claim to be each rank, then vanish
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", port))
        try:
            s.sendall(hello(r))
        except OSError:
            pass
        s.close()
held = []
for _ in range(8):  # announce 60 MiB frames before hello
    s = socket.create_connection(("127.0.0.1", port))
    try:
        s.sendall(struct.pack("<I", 60 << 20) + b"x" * (1 << 20)); held.append(s)
    except OSError:  # the store already cut this connection off: what it should do
        s.close()
for _ in range(400):  # idle connections
    try:
        held.append(socket.create_connection(("127.0.0.1", port)))
    except OSError:
        break
time.sleep(1.0)
out["held"] = len(held)
print(json.dumps(out), flush=True)
"""


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def worker_main() -> int:
    import numpy as np

    import bagua_core as bc
    from tests.harness.worker import report

    g = bc.init_process_group()
    rank, ws = g.rank, g.size
    store_port = int(os.environ["MASTER_PORT"]) + 1
    before_rss, before_fds = _rss_mb(), len(os.listdir("/proc/self/fd"))
    attacker = None
    if rank == 0:
        attacker = subprocess.Popen(
            [sys.executable, "-c", _ATTACK, str(store_port)], stdout=subprocess.PIPE, text=True, env=mp.repo_env()
        )
    wrong = 0
    peak_rss, peak_fds = before_rss, before_fds
    for steps in range(1, 301):  # about 4 s: the attack runs meanwhile
        x = np.full(1000, rank + 1, np.float32)
        bc.allreduce_inplace(x)
        wrong += int(not np.all(x == ws * (ws + 1) / 2))
        if steps % 10 == 0:  # while the attacker holds its connections
            peak_rss = max(peak_rss, _rss_mb())
            peak_fds = max(peak_fds, len(os.listdir("/proc/self/fd")))
        time.sleep(0.01)
    sub = bc.new_group([0, 2])  # a rendezvous after the attack
    if rank in (0, 2):
        y = np.full(3, rank, np.float32)
        bc.allreduce_inplace(y, group=sub)
        assert np.all(y == 2), y
    attack = {}
    if attacker is not None:
        attack = json.loads(attacker.communicate(timeout=60)[0].strip().splitlines()[-1])
    dead = g._ctx.store.dead_ranks()
    report(
        "live_job_under_attack",
        True,
        wrong=wrong,
        dead=dead,
        attack=attack,
        rss_growth_mb=peak_rss - before_rss,
        fds_growth=peak_fds - before_fds,
    )
    bc.destroy_process_group()
    return 0


@pytest.mark.timeout(150)
def test_live_job_keeps_training_under_a_hostile_client():
    run = mp.launch(__file__, 3, timeout=120, env={"BAGUA_STORE_SECRET": SECRET, "BAGUA_TIMEOUT": "30"})
    run.check()
    recs = run.cases()["live_job_under_attack"]
    assert len(recs) == 3, run.summary()
    for r, rec in recs.items():
        assert rec["wrong"] == 0 and rec["dead"] == [], (r, rec)
    zero = recs[0]
    assert zero["attack"]["wrong_secret"] == "refused", zero
    assert zero["rss_growth_mb"] < 100, zero  # 8 x 60 MiB announced frames were never buffered
    assert zero["fds_growth"] < 200, zero  # idle strangers were evicted, not kept


_SILENT = r"""
import sys, time
from tests.core.test_store import closed_by_server, raw_hello
sock = raw_hello(int(sys.argv[1]), 1, sys.argv[2].encode())  # holds the secret, claims rank 1
t0 = time.monotonic()
closed = closed_by_server(sock, 10.0)
print("SILENT", "closed" if closed else "open", round(time.monotonic() - t0, 2), flush=True)
"""

IDLE_S = 1.0


def quiet_main() -> int:
    """Ranks stay quiet for four idle timeouts, then meet in the store again."""
    import numpy as np

    import bagua_core as bc
    from tests.harness.worker import report

    g = bc.init_process_group()
    rank = g.rank
    silent = None
    if rank == 0:
        silent = subprocess.Popen(
            [sys.executable, "-c", _SILENT, str(int(os.environ["MASTER_PORT"]) + 1), SECRET],
            stdout=subprocess.PIPE,
            text=True,
            env=mp.repo_env(),
        )
    time.sleep(4 * IDLE_S)
    sub = bc.new_group([0, 1, 2])  # a rendezvous through the store after the quiet time
    x = np.full(3, rank + 1, np.float32)
    bc.allreduce_inplace(x, group=sub)
    assert np.all(x == 6), x
    silent_out = silent.communicate(timeout=30)[0].split() if silent is not None else []
    report("quiet_ranks_keep_their_store_connections", True, dead=g._ctx.store.dead_ranks(), silent=silent_out)
    # Quiet again, then rank 2 dies without a goodbye: only a store connection
    # that was kept open all along can tell the others.
    time.sleep(3 * IDLE_S)
    if rank == 2:
        os._exit(0)
    t0 = time.monotonic()
    while 2 not in g._ctx.store.dead_ranks() and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    report("a_quiet_rank_that_dies_is_reported_dead", True, after_s=time.monotonic() - t0)
    if rank == 0:
        time.sleep(1)  # hosts the store: rank 1 may still ask it
    os._exit(0)


@pytest.mark.timeout(150)
def test_silent_authenticated_clients_are_dropped_quiet_ranks_are_not():
    run = mp.launch(
        __file__,
        3,
        timeout=120,
        args=["quiet"],
        env={"BAGUA_STORE_SECRET": SECRET, "BAGUA_TIMEOUT": "30", "BAGUA_STORE_IDLE_TIMEOUT": str(IDLE_S)},
    )
    run.check()
    recs = run.cases()["quiet_ranks_keep_their_store_connections"]
    assert len(recs) == 3, run.summary()
    assert all(rec["dead"] == [] for rec in recs.values()), recs  # silence is not death
    tag, state, after = recs[0]["silent"]
    assert state == "closed" and float(after) < IDLE_S + 2.0, recs[0]
    deaths = run.cases()["a_quiet_rank_that_dies_is_reported_dead"]
    assert sorted(deaths) == [0, 1] and all(d["after_s"] < 5 for d in deaths.values()), deaths


if __name__ == "__main__":
    sys.exit(quiet_main() if sys.argv[1:] == ["quiet"] else worker_main())
