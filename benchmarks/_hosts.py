"""Two emulated hosts on one machine: two network namespaces joined by a veth pair, each direction
shaped with ``tc tbf`` (this kernel has no netem: bandwidth only, no latency or loss).

Names carry the creating process's id (``bagua-bw-<pid>-a``, veth ``bbw<pid>a``), so runs never
clash, and :func:`remove_stale` removes what a run killed with SIGKILL left behind. Deleting a
namespace deletes its veth end, and the pair goes with it. Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from typing import List, Optional

NETNS_PREFIX = "bagua-bw-"
ADDRESSES = ("10.231.0.1", "10.231.0.2")  # only inside the namespaces
_CAP_NET_ADMIN = 12


def unavailable_reason() -> Optional[str]:
    """Why namespaces and tc cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "creating network namespaces and tc qdiscs needs root (CAP_NET_ADMIN); run as root, e.g. with sudo"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed: apt-get install -y iproute2"
    with open("/proc/self/status") as f:
        cap = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    if not cap >> _CAP_NET_ADMIN & 1:
        return "this process lacks CAP_NET_ADMIN (a container without it?): namespaces and tc cannot be set up"
    return None


def _run(*cmd: str) -> str:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def list_netns(prefix: str = NETNS_PREFIX) -> List[str]:
    """Names of the network namespaces whose name starts with ``prefix``."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(prefix)]


def _delete_netns(name: str) -> None:
    """Kills what still runs inside (only processes of the run that created it), then deletes it."""
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True, timeout=30)


def remove_stale() -> List[str]:
    """Deletes the namespaces of runs whose process no longer exists; returns their names."""
    removed = []
    for name in list_netns():
        m = re.match(re.escape(NETNS_PREFIX) + r"(\d+)-[ab]$", name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # its run is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _delete_netns(name)
        removed.append(name)
    return removed


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate such as '100mbit', '1gbit', '2.5gbit', '500kbit'."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected a number followed by kbit, mbit or gbit (e.g. 100mbit)")
    return float(m.group(1)) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]


class EmulatedHosts:
    """Context manager: on enter, hosts 0 and 1 exist (addresses ADDRESSES[0] and [1] on
    ``ifaces[0]`` and ``[1]``); on exit, whatever happened, everything created is removed."""

    def __init__(self):
        pid = os.getpid()
        self.netns = [f"{NETNS_PREFIX}{pid}-a", f"{NETNS_PREFIX}{pid}-b"]
        self.ifaces = [f"bbw{pid}a", f"bbw{pid}b"]  # at most 15 characters

    def __enter__(self) -> "EmulatedHosts":
        try:
            for ns in self.netns:
                _run("ip", "netns", "add", ns)
            # Created inside the namespaces at once: nothing is ever left in the root namespace.
            _run("ip", "link", "add", self.ifaces[0], "netns", self.netns[0], "type", "veth",
                 "peer", "name", self.ifaces[1], "netns", self.netns[1])
            for ns, dev, addr in zip(self.netns, self.ifaces, ADDRESSES):
                _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _run("ip", "-n", ns, "link", "set", dev, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def shape(self, rate: str) -> None:
        """Each direction limited to ``rate`` (token bucket: bursts of 10 ms of traffic, at least 64 KB;
        at most 50 ms of queue)."""
        burst = max(64 * 1024, int(rate_bits(rate) / 8 / 100))
        for ns, dev in zip(self.netns, self.ifaces):
            _run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", str(burst),
                 "latency", "50ms")

    def exec_prefix(self, host: int) -> List[str]:
        """The command prefix that runs a program on ``host``."""
        return ["ip", "netns", "exec", self.netns[host]]

    def close(self) -> None:
        for ns in self.netns:
            if ns in list_netns(ns):
                _delete_netns(ns)
