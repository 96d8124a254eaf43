"""Emulated hosts on one machine: one network namespace per host. Two hosts are joined by a veth
pair; three or more each by a veth pair to a bridge in a "switch" namespace (a star, like hosts
on one switch). Every link is shaped in each direction with ``tc tbf``. A one-way delay is added
with ``netem`` where the kernel has it; where it has not (the kernel this was written on), the
hosts' links become TUN devices joined by a user-space delay line (benchmarks/_delay_line.py:
the delay and each receiving port's rate, the senders still shaped by ``tc tbf``) for as long as a
delayed link is asked for (:meth:`EmulatedHosts.delay_method` says which).

Names carry the creating process's id (hosts ``bagua-bw-<pid>-a``, ``-b``, ...; the switch
``bagua-bw-<pid>-s``; host link ends ``bbw<pid>a``, ...; switch ports ``bbw<pid>sa``, ...), so
runs never clash, and :func:`remove_stale` removes what a run killed with SIGKILL left behind.
A host's link keeps its name and address whichever kind it is. Nothing is ever created in the
root namespace, and deleting a namespace deletes its veth ends, the pairs and the bridge with
them. Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from typing import List, Optional

import _launch  # benchmarks/_launch.py: children that die with their parent

NETNS_PREFIX = "bagua-bw-"
NETNS_ETC = "/etc/netns"  # per-namespace files that `ip netns exec` mounts over /etc
MAX_HOSTS = 8
ADDRESSES = tuple(f"10.231.0.{i + 1}" for i in range(MAX_HOSTS))  # only inside the namespaces
_LETTERS = "abcdefgh"
SWITCH = "s"
_CAP_NET_ADMIN = 12
DELAY_LINE_MTU = 9000  # jumbo frames: a sixth of the packets for the user-space delay line to move
_DELAY_LINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_delay_line.py")


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


def prepare(args, script: str, loopback: str):
    """A driver's first step (bandwidth.py, time_to_accuracy.py): ``--cleanup`` alone, or whether
    shaping is possible. Returns (the exit code to stop with, or None; why shaping is off, or None).
    Without shaping, only ``--no-shaping`` and ``--smoke`` go on, over loopback (``loopback`` says
    what that means for the run); otherwise the driver stops with 2 and says why. Namespaces left by
    killed runs are removed either way."""
    if args.cleanup:
        removed = remove_stale() if unavailable_reason() is None else []
        print(f"removed {len(removed)} namespace(s) left by killed runs: {removed}")
        return 0, None
    reason = "--no-shaping given" if args.no_shaping else unavailable_reason()
    if reason is None:
        removed = remove_stale()
        if removed:
            print(f"removed namespaces left by killed runs: {removed}", flush=True)
    elif not (args.no_shaping or args.smoke):
        print(
            f"{script}: cannot shape the network: {reason}.\n(--no-shaping runs over loopback instead.)",
            file=sys.stderr,
        )
        return 2, reason
    else:
        print(f"{script}: shaping skipped: {reason}; {loopback}.", flush=True)
    return None, reason


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
    shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)


def remove_stale() -> List[str]:
    """Deletes the namespaces of runs whose process no longer exists; returns their names."""
    removed = []
    for name in list_netns():
        m = re.match(re.escape(NETNS_PREFIX) + r"(\d+)-[a-z]$", name)
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


def parse_link(spec: str):
    """``(rate, one-way delay in ms or None)`` of a link such as '100mbit' or '100mbit+5ms'."""
    rate, _, delay = spec.strip().lower().partition("+")
    rate_bits(rate)
    if not delay:
        return rate, None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)ms", delay)
    if not m:
        raise ValueError(f"link {spec!r}: expected a rate, optionally followed by +<delay>ms (e.g. 100mbit+5ms)")
    return rate, float(m.group(1))


class EmulatedHosts:
    """Context manager: on enter, hosts 0 .. n-1 exist (address ADDRESSES[i] on ``ifaces[i]`` in
    namespace ``netns[i]``); on exit, whatever happened, everything created is removed."""

    def __init__(self, n: int = 2):
        if not 2 <= n <= MAX_HOSTS:
            raise ValueError(f"EmulatedHosts: 2 to {MAX_HOSTS} hosts, not {n}")
        pid = os.getpid()
        self.netns = [f"{NETNS_PREFIX}{pid}-{c}" for c in _LETTERS[:n]]
        self.ifaces = [f"bbw{pid}{c}" for c in _LETTERS[:n]]  # at most 15 characters
        # With more than two hosts: the switch namespace, its bridge and its port facing each host.
        self.switch = f"{NETNS_PREFIX}{pid}-{SWITCH}" if n > 2 else None
        self.bridge = f"bbw{pid}br"
        self.ports = [f"bbw{pid}{SWITCH}{c}" for c in _LETTERS[:n]] if n > 2 else []
        self._delay_line = None
        self._netem_reason = False

    def __enter__(self) -> "EmulatedHosts":
        self._delay_line = None  # the user-space delay line's process while the links are TUN devices
        self._netem_reason = False  # not asked yet
        try:
            for ns in self.netns + ([self.switch] if self.switch else []):
                _run("ip", "netns", "add", ns)
            for ns in self.netns:
                _run("ip", "-n", ns, "link", "set", "lo", "up")
            self._add_veth_links()
            self._write_hosts_files()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _add_veth_links(self) -> None:
        # Created inside the namespaces at once: nothing is ever left in the root namespace.
        if self.switch is None:
            _run(
                "ip",
                "link",
                "add",
                self.ifaces[0],
                "netns",
                self.netns[0],
                "type",
                "veth",
                "peer",
                "name",
                self.ifaces[1],
                "netns",
                self.netns[1],
            )
        else:
            _run("ip", "-n", self.switch, "link", "add", self.bridge, "type", "bridge")
            for ns, dev, port in zip(self.netns, self.ifaces, self.ports):
                _run("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
                _run("ip", "-n", self.switch, "link", "set", port, "master", self.bridge)
                _run("ip", "-n", self.switch, "link", "set", port, "up")
            _run("ip", "-n", self.switch, "link", "set", self.bridge, "up")
        self._address_links()

    def _address_links(self, mtu: Optional[int] = None) -> None:
        for ns, dev, addr in zip(self.netns, self.ifaces, ADDRESSES):
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            if mtu is not None:
                _run("ip", "-n", ns, "link", "set", dev, "mtu", str(mtu))
            _run("ip", "-n", ns, "link", "set", dev, "up")

    def _remove_veth_links(self) -> None:
        pairs = 1 if self.switch is None else len(self.netns)  # deleting one end deletes the pair
        for ns, dev in zip(self.netns[:pairs], self.ifaces[:pairs]):
            _run("ip", "-n", ns, "link", "del", dev)
        if self.switch is not None:
            _run("ip", "-n", self.switch, "link", "del", self.bridge)

    def _start_delay_line(self, rate: str, delay_ms: float) -> None:
        """Replaces the veth links by TUN devices of the same names and addresses, joined by a
        delay line process (benchmarks/_delay_line.py) with this delay and receiving rate."""
        if self._delay_line is None:
            self._remove_veth_links()
        else:
            self._stop_delay_line()
        ports = [f"{ns}:{dev}:{addr}" for ns, dev, addr in zip(self.netns, self.ifaces, ADDRESSES)]
        proc = subprocess.Popen(
            [sys.executable, _DELAY_LINE, "--delay-ms", str(delay_ms), "--rate", rate, *ports],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_launch.die_with_parent,
        )
        self._delay_line = proc
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the delay line did not start (exit code {proc.wait(timeout=30)})")
        self._address_links(mtu=DELAY_LINE_MTU)

    def _stop_delay_line(self) -> None:
        """Stops the delay line process: its TUN devices vanish with it."""
        proc, self._delay_line = self._delay_line, None
        if proc is None:
            return
        proc.stdin.close()  # it exits when its stdin closes
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _use_veth_links(self) -> None:
        if self._delay_line is not None:
            self._stop_delay_line()
            self._add_veth_links()

    def _egress(self):
        """(namespace, device, is a host's own end) of every shaped link end."""
        ends = [(ns, dev, True) for ns, dev in zip(self.netns, self.ifaces)]
        ports = self.ports if self._delay_line is None else []  # the delay line shapes what hosts receive
        return ends + [(self.switch, port, False) for port in ports]

    def delay_method(self) -> str:
        """How :meth:`shape` emulates a delay here: ``"netem"``, or ``"delay line"`` (user space)."""
        return "netem" if self.netem_unavailable_reason() is None else "delay line"

    def shape(self, rate: str, delay_ms: Optional[float] = None) -> None:
        """Each direction of every link limited to ``rate`` (token bucket: bursts of 10 ms of traffic,
        at least 64 KB; at most 50 ms of queue); with ``delay_ms``, any host reaches any other in
        ``delay_ms`` one way: each host's outgoing packets are held that long by netem under the
        tbf, or, without netem, by the user-space delay line (the links are then TUN devices of
        MTU ``DELAY_LINE_MTU`` until a shape() without delay)."""
        netem = delay_ms is not None and self.delay_method() == "netem"
        if delay_ms is not None and not netem:
            self._start_delay_line(rate, delay_ms)
        else:
            self._use_veth_links()
        burst = max(64 * 1024, int(rate_bits(rate) / 8 / 100))
        for ns, dev, own in self._egress():
            # Deleted first: a replaced tbf would keep the netem of an earlier shape() under it.
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True, timeout=30)
            _run(
                "tc",
                "-n",
                ns,
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "handle",
                "1:",
                "tbf",
                "rate",
                rate,
                "burst",
                str(burst),
                "latency",
                "50ms",
            )
            if netem and own:
                _run(
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:1",
                    "handle",
                    "10:",
                    "netem",
                    "delay",
                    f"{delay_ms}ms",
                )

    def netem_unavailable_reason(self) -> Optional[str]:
        """Why the kernel cannot delay packets (it has no netem qdisc), or None. Tried once, on host
        0's link, whose shaping it removes (:meth:`shape` sets it again)."""
        if self._netem_reason is False:
            ns, dev = self.netns[0], self.ifaces[0]
            p = subprocess.run(
                ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "9:", "netem", "delay", "1ms"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            self._netem_reason = None
            if p.returncode != 0:
                self._netem_reason = (
                    f"tc netem fails here ({p.stderr.strip() or p.returncode}; the kernel lacks CONFIG_NET_SCH_NETEM?)"
                )
            else:
                _run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root")
        return self._netem_reason

    def tx_bytes_path(self, host: int) -> str:
        """Inside host ``host`` (under :meth:`exec_prefix`): the counter of the bytes it sent on its link."""
        return f"/sys/class/net/{self.ifaces[host]}/statistics/tx_bytes"

    def exec_prefix(self, host: int) -> List[str]:
        """The command prefix that runs a program on ``host``."""
        return ["ip", "netns", "exec", self.netns[host]]

    def _write_hosts_files(self) -> None:
        """Inside each host this machine's name resolves to the host's own address, not 127.0.0.1
        (``ip netns exec`` mounts /etc/netns/<namespace>/hosts over /etc/hosts): programs that find
        their address from their host name (Horovod's Gloo) then publish one the others can reach."""
        name = socket.gethostname()
        for ns, addr in zip(self.netns, ADDRESSES):
            os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
            with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as f:
                f.write(f"127.0.0.1 localhost\n{addr} {name}\n")

    def close(self) -> None:
        for ns in self.netns:
            shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
        self._stop_delay_line()
        for ns in self.netns + ([self.switch] if self.switch else []):
            if ns in list_netns(ns):
                _delete_netns(ns)
