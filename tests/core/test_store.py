"""Rendezvous store: TcpStoreServer + TcpStore, in one process and across processes.

Hostile-client tests speak the wire protocol (csrc/store/tcp_store_protocol.h)
over raw sockets and check that only the offending connection is dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import socket
import struct
import threading
import time

import pytest

from bagua_core import _C
from tests.harness import mp

HOST = "127.0.0.1"
MAGIC = 0x54534742
VERSION = 2
OP_HELLO, OP_SET, OP_GET, OP_ADD, OP_AUTH, OP_PING = 1, 2, 3, 4, 9, 10
MAX_FRAME = (64 << 20) + 4096 + 64

pytestmark = pytest.mark.timeout(60)


# --------------------------------------------------------------------------- helpers


def frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def s(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def hello(rank: int) -> bytes:
    return frame(struct.pack("<BIIi", OP_HELLO, MAGIC, VERSION, rank))


def raw_connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=5)
    sock.settimeout(5)
    return sock


def recv_frame(sock: socket.socket) -> bytes:
    hdr = b""
    while len(hdr) < 4:
        chunk = sock.recv(4 - len(hdr))
        assert chunk, "connection closed"
        hdr += chunk
    (n,) = struct.unpack("<I", hdr)
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        assert chunk, "connection closed"
        body += chunk
    return body


def proof(secret: bytes, nonce: bytes, rank: int) -> bytes:
    """The handshake's HMAC, computed with Python's own hmac (an independent
    reference for the engine's SHA-256)."""
    return hmac.new(secret, b"bagua-store-auth-v2:" + nonce + struct.pack("<i", rank), hashlib.sha256).digest()


def raw_hello(port: int, rank: int, secret: bytes = b"") -> socket.socket:
    """A raw connection that has said hello and authenticated."""
    sock = raw_connect(port)
    sock.sendall(hello(rank))
    reply = recv_frame(sock)
    assert reply[:5] == struct.pack("<BI", 0, MAGIC) and struct.unpack("<I", reply[5:9])[0] == 32, reply
    sock.sendall(frame(bytes([OP_AUTH]) + s(proof(secret, reply[9:41], rank))))
    assert recv_frame(sock)[:1] == b"\x00"  # OK, then the server's idle timeout
    return sock


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True when the server closes the connection within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    try:
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            if not sock.recv(1 << 20):
                return True
            if time.monotonic() > deadline:
                return False
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    finally:
        sock.close()


def still_serving(port: int) -> None:
    with _C.TcpStore(HOST, port, -1, 5.0) as c:
        key = f"probe/{random.random()}"
        c.set(key, b"ok")
        assert c.get(key) == b"ok"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@pytest.fixture
def server():
    srv = _C.TcpStoreServer(HOST, 0)
    yield srv
    srv.close()


@pytest.fixture
def strict_server():
    """Disconnects clients that stall for more than 0.5 s."""
    srv = _C.TcpStoreServer(HOST, 0, io_timeout_s=0.5)
    yield srv
    srv.close()


# --------------------------------------------------------------------------- basics


def test_set_get_add_check_wait(server):
    with _C.TcpStore(HOST, server.port, 0, 5.0) as a, _C.TcpStore(HOST, server.port, 1, 5.0) as b:
        a.set("k", b"\x00binary\xffvalue")
        assert b.get("k") == b"\x00binary\xffvalue"
        a.set("k", b"\x00binary\xffvalue")  # the same value again: fine
        with pytest.raises(_C.BaguaError, match="written once"):
            a.set("k", b"")  # another value: keys are written once
        a.set("empty", b"")
        assert b.get("empty") == b""
        assert a.add("n", 5) == 5
        assert b.add("n", -7) == -2
        assert a.get("n") == b"-2"  # counters are decimal text, like torch's store
        assert a.check(["k", "n"]) and not a.check(["k", "missing"]) and a.check([])
        b.wait(["k", "n"], timeout_s=1.0)
        assert a.timeout_s == 5.0 and a.rank == 0 and a.port == server.port
        big = os.urandom(8 << 20)
        a.set("big", big)
        assert b.get("big") == big


def test_blocking_get_released_by_later_set(server):
    with _C.TcpStore(HOST, server.port, 0, 5.0) as a, _C.TcpStore(HOST, server.port, 1, 5.0) as b:
        threading.Timer(0.3, lambda: b.set("late", b"v")).start()
        t0 = time.monotonic()
        assert a.get("late", timeout_s=5.0) == b"v"
        assert 0.25 < time.monotonic() - t0 < 2.0
        threading.Timer(0.2, lambda: (b.set("w1", b""), b.set("w2", b""))).start()
        a.wait(["w1", "w2"], timeout_s=5.0)


def test_get_and_wait_time_out(server):
    with _C.TcpStore(HOST, server.port, 0, 5.0) as a:
        t0 = time.monotonic()
        with pytest.raises(_C.CommTimeoutError, match=rf"'never'.*{HOST}:{server.port}"):
            a.get("never", timeout_s=0.4)
        assert 0.35 < time.monotonic() - t0 < 2.0
        with pytest.raises(_C.CommTimeoutError, match="'x', 'y'"):
            a.set("x", b"")
            a.wait(["x", "y"], timeout_s=0.1)
        # The connection stays usable after a timeout.
        a.set("after", b"1")
        assert a.get("after") == b"1"


def test_blocked_get_does_not_block_other_clients(server):
    with _C.TcpStore(HOST, server.port, 0, 5.0) as a, _C.TcpStore(HOST, server.port, 1, 5.0) as b:
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("v", a.get("slow", timeout_s=5.0)))
        t.start()
        time.sleep(0.1)
        t0 = time.monotonic()
        for i in range(50):
            b.set(f"other/{i}", b"x")
            assert b.get(f"other/{i}") == b"x"
        assert time.monotonic() - t0 < 3.0  # not held up by the 5 s get
        b.set("slow", b"done")
        t.join(5)
        assert result["v"] == b"done"


def test_one_client_shared_by_threads(server):
    with _C.TcpStore(HOST, server.port, 0, 5.0) as a:
        threads = [threading.Thread(target=lambda: [a.add("c", 1) for _ in range(100)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert a.add("c", 0) == 400


def test_blocked_get_does_not_block_other_threads_of_the_same_client(server):
    with _C.TcpStore(HOST, server.port, 0, 5.0) as a:
        t = threading.Thread(target=lambda: a.get("released", timeout_s=5.0))
        t.start()
        time.sleep(0.1)
        t0 = time.monotonic()
        assert a.dead_ranks() == []
        a.set("released", b"")
        t.join(5)
        assert not t.is_alive() and time.monotonic() - t0 < 3.0


_FORK_SCRIPT = r"""
import os, socket, sys
from bagua_core._loader import _C
server = _C.TcpStoreServer("127.0.0.1", 0)
a = _C.TcpStore("127.0.0.1", server.port, 0, 5.0)
a.set("k", b"v")
pid = os.fork()
if pid == 0:  # child: must neither use nor tear down the parent's store
    code = 0
    try:
        a.get("k")
        code = 3
    except _C.BaguaError as e:
        code = 0 if "fork" in str(e) else 4
    except BaseException:
        code = 5
    try:
        a.close()
        server.close()
    except BaseException:
        code = 6
    os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, os.waitstatus_to_exitcode(status)
assert a.get("k") == b"v"
assert a.dead_ranks() == []
with _C.TcpStore("127.0.0.1", server.port, 1, 5.0) as b:  # the server still serves
    b.set("x", b"1")
a.close()
print("ok")
"""


def test_fork_child_cannot_disturb_the_parent():
    # In a fresh interpreter: forking this test process, which may hold JAX's
    # threads, could deadlock the child.
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [mp.REPO, os.environ.get("PYTHONPATH")])))
    p = subprocess.Popen(
        [sys.executable, "-c", _FORK_SCRIPT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    assert p.returncode == 0 and out.strip() == "ok", err


def test_bad_arguments(server):
    with _C.TcpStore(HOST, server.port, 0, 5.0) as a:
        with pytest.raises(ValueError, match="key"):
            a.set("k" * 5000, b"")
        with pytest.raises(ValueError, match="timeout"):
            a.get("k", timeout_s=-1)
        with pytest.raises(ValueError, match="timeout"):
            a.wait(["k"], timeout_s=float("nan"))
        with pytest.raises(TypeError):
            a.set("k", "not bytes")
        a.set("text", b"abc")
        with pytest.raises(_C.BaguaError, match="not an integer"):
            a.add("text", 1)
        a.add("max", 2**63 - 1)
        with pytest.raises(_C.BaguaError, match="overflow"):
            a.add("max", 1)
        assert a.get("max") == str(2**63 - 1).encode()
    with pytest.raises(ValueError):
        _C.TcpStoreServer("", 0)
    with pytest.raises(ValueError):
        _C.TcpStore(HOST, 70000, 0, 1.0)


def test_close_is_idempotent_and_later_calls_fail(server):
    a = _C.TcpStore(HOST, server.port, 0, 5.0)
    a.close()
    a.close()
    with pytest.raises(_C.BaguaError, match="closed"):
        a.get("k")


# --------------------------------------------------------------------------- connection set-up


def test_client_waits_for_a_late_server():
    port = free_port()
    started = {}

    def start_server():
        time.sleep(0.4)
        started["srv"] = _C.TcpStoreServer(HOST, port)

    t = threading.Thread(target=start_server)
    t.start()
    try:
        with _C.TcpStore(HOST, port, 0, 10.0) as a:
            a.set("k", b"v")
            assert a.get("k") == b"v"
    finally:
        t.join(5)
        started["srv"].close()


def test_connect_timeout_names_the_store():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(_C.CommTimeoutError, match=rf"{HOST}:{port}.*BAGUA_STORE_PORT"):
        _C.TcpStore(HOST, port, 0, 0.3)
    assert time.monotonic() - t0 < 2.0


def test_port_in_use_error_names_address_and_setting(server):
    with pytest.raises(_C.BaguaError, match=rf"{HOST}:{server.port}.*BAGUA_STORE_PORT"):
        _C.TcpStoreServer(HOST, server.port)


def test_listens_only_on_the_given_address(server):
    # 127.0.0.2 is another loopback address of this host; the store bound to
    # 127.0.0.1 must not answer there.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", server.port), timeout=2).close()


def test_server_loss_is_reported_as_unreachable():
    srv = _C.TcpStoreServer(HOST, 0)
    a = _C.TcpStore(HOST, srv.port, 1, 5.0)
    result = {}

    def blocked_get():
        try:
            a.get("never", timeout_s=30)
        except Exception as e:  # noqa: BLE001
            result["e"] = e

    t = threading.Thread(target=blocked_get)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    srv.close()  # must not hang on the blocked client
    t.join(5)
    assert time.monotonic() - t0 < 2.0
    assert isinstance(result["e"], _C.BaguaError) and not isinstance(result["e"], _C.CommTimeoutError)
    assert f"{HOST}:{srv.port} (rank 0) is unreachable" in str(result["e"])
    with pytest.raises(_C.BaguaError, match="unreachable"):
        a.set("k", b"")
    a.close()


# --------------------------------------------------------------------------- liveness


def test_dead_ranks_in_process(server):
    obs = _C.TcpStore(HOST, server.port, -1, 5.0)
    _C.TcpStore(HOST, server.port, 3, 5.0).close()  # clean goodbye: not dead
    sock = raw_hello(server.port, 4)
    sock.close()  # vanished without a goodbye
    deadline = time.monotonic() + 5
    while obs.dead_ranks() != [4] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert obs.dead_ranks() == [4]
    # A rank that comes back is alive again.
    _C.TcpStore(HOST, server.port, 4, 5.0).close()
    assert obs.dead_ranks() == []
    obs.close()


# --------------------------------------------------------------------------- hostile clients


def test_random_garbage_closes_only_that_connection(strict_server):
    port = strict_server.port
    keep = _C.TcpStore(HOST, port, 0, 5.0)
    keep.set("before", b"1")
    rng = random.Random(1234)
    for i in range(5):
        sock = raw_connect(port)
        sock.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096))))
        assert closed_by_server(sock, 3.0), f"garbage #{i} not rejected"
    # Well-formed length, but not a hello.
    sock = raw_connect(port)
    sock.sendall(frame(b"\x02garbage body"))
    assert closed_by_server(sock, 3.0)
    assert keep.get("before") == b"1"
    still_serving(port)
    keep.close()


def test_oversized_length_prefix_is_rejected(strict_server):
    port = strict_server.port
    sock = raw_connect(port)
    sock.sendall(struct.pack("<I", 0xFFFFFFFF))
    assert closed_by_server(sock, 1.0)  # at once, without waiting for the body
    sock = raw_hello(port, 5)
    sock.sendall(struct.pack("<I", MAX_FRAME + 1))
    assert closed_by_server(sock, 1.0)
    # A key over the limit inside a well-sized frame.
    sock = raw_hello(port, 6)
    sock.sendall(frame(bytes([OP_SET]) + s(b"k" * 5000) + s(b"v")))
    assert closed_by_server(sock, 1.0)
    # A field length pointing past the end of its frame.
    sock = raw_hello(port, 7)
    sock.sendall(frame(bytes([OP_GET]) + struct.pack("<I", 1000) + b"abc"))
    assert closed_by_server(sock, 1.0)
    still_serving(port)


def test_truncated_message_closes_only_that_connection(strict_server):
    port = strict_server.port
    obs = _C.TcpStore(HOST, port, -1, 5.0)
    # Half a SET, then silence: dropped after io_timeout (0.5 s).
    stalled = raw_hello(port, 8)
    msg = frame(bytes([OP_SET]) + s(b"key") + s(b"v" * 1000))
    stalled.sendall(msg[: len(msg) // 2])
    t0 = time.monotonic()
    still_serving(port)  # served meanwhile
    assert closed_by_server(stalled, 3.0)
    assert time.monotonic() - t0 < 2.5
    assert not obs.check(["key"])
    # Half a SET, then the connection closes: that rank is dead.
    sock = raw_hello(port, 9)
    sock.sendall(msg[:7])
    sock.close()
    deadline = time.monotonic() + 3
    while 9 not in obs.dead_ranks() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert set(obs.dead_ranks()) == {8, 9}
    still_serving(port)
    obs.close()


def test_idle_connection_is_closed_and_others_are_served(strict_server):
    port = strict_server.port
    idle = raw_connect(port)  # never says anything
    t0 = time.monotonic()
    still_serving(port)
    assert closed_by_server(idle, 3.0)
    assert time.monotonic() - t0 < 2.5
    still_serving(port)


def test_authenticated_idle_timeout_spares_waiting_requests_and_pings():
    srv = _C.TcpStoreServer(HOST, 0, io_timeout_s=5.0, idle_timeout_s=0.5)
    try:
        port = srv.port
        waiting = raw_hello(port, 1)  # a get waiting longer than the idle timeout is not idle
        waiting.sendall(frame(bytes([OP_GET]) + s(b"never") + struct.pack("<q", 1500)))
        pinging = raw_hello(port, 2)
        silent = raw_hello(port, 3)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.2:  # pinged: open for 2.4 idle timeouts
            pinging.sendall(frame(bytes([OP_PING])))
            assert recv_frame(pinging) == b"\x00"
            time.sleep(0.1)
        assert closed_by_server(silent, 1.0)  # silent for 0.5 s: closed
        waiting.settimeout(5)
        assert recv_frame(waiting) == b"\x01"  # the get's own timeout, then idle again
        assert closed_by_server(waiting, 2.0)
        with _C.TcpStore(HOST, port, 0, 5.0) as obs:
            assert obs.dead_ranks() == []  # silence is not death
    finally:
        srv.close()


def test_client_that_never_reads_replies(strict_server):
    port = strict_server.port
    with _C.TcpStore(HOST, port, 0, 5.0) as a:
        a.set("big", b"x" * (4 << 20))
    sock = raw_hello(port, 10)
    get = frame(bytes([OP_GET]) + s(b"big") + struct.pack("<q", 0))
    sock.sendall(get * 20)  # 80 MiB of replies it will not read
    still_serving(port)
    time.sleep(1.0)  # io_timeout is 0.5 s
    assert closed_by_server(sock, 3.0)
    still_serving(port)


def test_many_connections_at_once(server):
    socks = [raw_connect(server.port) for _ in range(200)]
    still_serving(server.port)
    for sock in socks:
        sock.close()
    still_serving(server.port)


# --------------------------------------------------------------------------- across processes

WORKER = r"""
import os, signal, time
from bagua_core import _C
from tests.harness.worker import run_cases

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1
server = None
if rank == 0:
    time.sleep(0.5)  # the other ranks connect first and must retry
    server = _C.TcpStoreServer(host, port)
store = _C.TcpStore(host, port, rank, 20.0)
victim = world - 1

def barrier(name):
    if store.add(name, 1) == world:
        store.set(name + "/go", b"")
    store.wait([name + "/go"])

def exchange():
    store.set(f"x/{rank}", bytes([rank]) * 1000)
    for r in range(world):
        assert store.get(f"x/{r}") == bytes([r]) * 1000

def atomic_add():
    values = [store.add("counter", 1) for _ in range(300)]
    assert len(set(values)) == 300 and values == sorted(values)
    barrier("b1")
    assert int(store.get("counter")) == 300 * world
    store.set(f"seen/{rank}", ",".join(map(str, values)).encode())
    seen = []
    for r in range(world):
        seen += map(int, store.get(f"seen/{r}").split(b","))
    assert sorted(seen) == list(range(1, 300 * world + 1)), "every add returned a distinct value"

def sigkilled_rank_is_dead():
    barrier("b2")
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while victim not in store.dead_ranks() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.dead_ranks() == [victim], store.dead_ranks()
    try:
        store.get(f"from/{victim}", timeout_s=0.2)
        raise AssertionError("get did not time out")
    except _C.CommTimeoutError as e:
        assert f"ranks that died: {victim}" in str(e), str(e)

run_cases([("exchange", exchange), ("atomic_add", atomic_add),
           ("sigkilled_rank_is_dead", sigkilled_rank_is_dead)])

# Survivors leave cleanly; rank 0 keeps serving until they are gone.
if rank != 0:
    store.close()
    with _C.TcpStore(host, port, -1, 20.0) as s:
        s.add("left", 1)
else:
    deadline = time.monotonic() + 10
    while store.add("left", 0) < world - 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.dead_ranks() == [victim], "clean close() must not count as death"
    store.close()
    server.close()
"""


@pytest.fixture(scope="module")
def mp_run():
    return mp.launch(WORKER, world_size=3, timeout=40)


@pytest.mark.parametrize("case", ["exchange", "atomic_add", "sigkilled_rank_is_dead"])
def test_across_processes(mp_run, case):
    got = mp_run.cases().get(case, {})
    survivors = [0, 1]
    for r in survivors:
        assert r in got and got[r]["ok"], f"rank {r}: {got.get(r)}\n{mp_run.summary()}"
    if case != "sigkilled_rank_is_dead":
        assert got.get(2, {}).get("ok"), mp_run.summary()


def test_processes_exit_cleanly(mp_run):
    assert not mp_run.timed_out, mp_run.summary()
    assert [w.returncode for w in mp_run.workers] == [0, 0, -9], mp_run.summary()
