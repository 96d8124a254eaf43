"""benchmarks/_hosts.py's delayed links on a kernel without netem: the user-space delay line
(benchmarks/_delay_line.py) between 2 and 3 emulated hosts delays every packet the asked time
one way and its TCP throughput stays at the shaped rate; the veth links come back without a delay;
the bytes sent are counted on the TUN devices; nothing (namespace, process) is left behind.
Measured with real TCP connections between the namespaces."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.harness.benchmark_scripts import _hosts, needs_netns

PORT = 5301
# Host 0 serves: a one-byte ping answered at once, then it counts what it receives for a while.
SERVER = f"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("{_hosts.ADDRESSES[0]}", {PORT})); s.listen(1)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(15):
    c.recv(1); c.sendall(b"p")
n, t0 = 0, None
while True:
    d = c.recv(1 << 20)
    if not d:
        break
    if t0 is None:
        t0 = time.perf_counter()
    else:
        n += len(d)
print(n * 8 / (time.perf_counter() - t0) / 1e6)
"""
# Another host: 15 round trips (median printed, ms), then 2 s of bulk data.
CLIENT = f"""
import socket, time
c = socket.create_connection(("{_hosts.ADDRESSES[0]}", {PORT}), timeout=20)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(15):
    t = time.perf_counter(); c.sendall(b"p"); c.recv(1); rtts.append(time.perf_counter() - t)
print(sorted(rtts)[7] * 1e3, flush=True)
buf, t = b"x" * (1 << 16), time.perf_counter()
while time.perf_counter() - t < 2:
    c.sendall(buf)
c.close()
"""


def _measure(hosts, client_host):
    """(median round trip in ms, Mbit/s received by host 0) between host 0 and ``client_host``."""
    server = subprocess.Popen(hosts.exec_prefix(0) + [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(50):  # until it listens
            probe = subprocess.run(hosts.exec_prefix(0) + ["ss", "-ltn"], capture_output=True, text=True)
            if f":{PORT}" in probe.stdout:
                break
            time.sleep(0.1)
        client = subprocess.run(
            hosts.exec_prefix(client_host) + [sys.executable, "-c", CLIENT], capture_output=True, text=True, timeout=40
        )
        assert client.returncode == 0, client.stderr
        out, _ = server.communicate(timeout=20)
        return float(client.stdout.split()[0]), float(out.split()[0])
    finally:
        server.kill()
        server.wait()


def _tx_bytes(hosts, host):
    p = subprocess.run(hosts.exec_prefix(host) + ["cat", hosts.tx_bytes_path(host)], capture_output=True, text=True)
    return int(p.stdout)


def _delay_lines():
    p = subprocess.run(["pgrep", "-f", "_delay_line.py"], capture_output=True, text=True)
    return p.stdout.split()


@needs_netns
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_delayed_link_delays_and_keeps_its_rate_then_veth_comes_back(n):
    before = set(_hosts.list_netns())
    with _hosts.EmulatedHosts(n) as hosts:
        if hosts.delay_method() == "netem":
            pytest.skip("this kernel has netem: the delay line is not used")
        hosts.shape("100mbit", 5.0)
        sent = _tx_bytes(hosts, n - 1)
        rtt, mbit = _measure(hosts, n - 1)
        assert 10.0 <= rtt < 30.0, rtt  # 5 ms each way, plus the forwarding
        assert 60.0 < mbit < 115.0, mbit  # shaped to 100 Mbit/s
        assert _tx_bytes(hosts, n - 1) - sent > 2 * 60e6 / 8  # counted on the TUN device

        hosts.shape("100mbit")  # no delay: the kernel's veth links again, of the same names
        assert not _delay_lines()
        rtt, mbit = _measure(hosts, n - 1)
        assert rtt < 5.0, rtt
        assert 60.0 < mbit < 115.0, mbit
        hosts.shape("1gbit", 2.0)
        assert len(_delay_lines()) == 1
    assert set(_hosts.list_netns()) == before
    assert not _delay_lines()


def test_link_specs_parse():
    assert _hosts.parse_link("100mbit+5ms") == ("100mbit", 5.0)
    assert _hosts.parse_link("1gbit") == ("1gbit", None)
    with pytest.raises(ValueError):
        _hosts.parse_link("100mbit+5")


@needs_netns
@pytest.mark.timeout(60)
def test_inside_a_host_the_host_name_resolves_to_its_own_address():
    """What Horovod's Gloo publishes as its address (its host name's), reachable from the other hosts."""
    import os
    import socket

    resolve = [sys.executable, "-c", "import socket; print(socket.gethostbyname(socket.gethostname()))"]
    with _hosts.EmulatedHosts(3) as hosts:
        for host, addr in enumerate(_hosts.ADDRESSES[:3]):
            p = subprocess.run(hosts.exec_prefix(host) + resolve, capture_output=True, text=True, timeout=20)
            assert p.stdout.strip() == addr, p
        etc = [os.path.join(_hosts.NETNS_ETC, ns) for ns in hosts.netns]
    assert not any(os.path.exists(d) for d in etc)
    assert socket.gethostbyname(socket.gethostname()) != _hosts.ADDRESSES[0]  # outside: as before
