"""A user-space delay line between emulated hosts, for kernels without ``netem``.

Each host's link is a TUN device (layer 3, one per network namespace) whose other end is this
process. Every IPv4 packet a host sends is read here, held ``--delay-ms`` (the one-way delay), then
leaves the destination's port at ``--rate`` (one packet after the other, as a switch port: at most
``--queue-ms`` of backlog, later packets are dropped) and is written into the destination host's
TUN device. The senders' own rate is shaped by the kernel (``tc tbf`` on each TUN device, set by
benchmarks/_hosts.py), as on the veth links; this process adds the delay and the receiving side.

    python _delay_line.py --delay-ms 5 --rate 100mbit NETNS:DEVICE:ADDRESS ...

It creates the TUN devices inside the namespaces (their addresses are set by the caller), prints
``ready`` on stdout, and forwards until SIGTERM or until stdin closes (its parent died). The
devices are not persistent: they vanish when this process exits.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import ipaddress
import os
import select
import signal
import struct
import sys
import time

import _hosts  # benchmarks/_hosts.py (which starts this script as a process of its own)

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
CLONE_NEWNET = 0x40000000
MAX_PACKET = 65536


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tun(netns: str, device: str) -> int:
    """A TUN device named ``device`` created inside namespace ``netns``; returns its file descriptor."""
    home = f"/proc/{os.getpid()}/ns/net"
    _setns(f"/var/run/netns/{netns}")
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", device.encode(), IFF_TUN | IFF_NO_PI))
    finally:
        _setns(home)
    return fd


class DelayLine:
    """Forwards packets between TUN devices by destination address (see the module's docstring)."""

    def __init__(self, ports, delay_s: float, rate_bps: float, queue_s: float):
        self.fds = [fd for fd, _ in ports]
        self.by_address = {addr: fd for fd, addr in ports}
        self.delay, self.rate, self.queue = delay_s, rate_bps, queue_s
        self.port_free = {fd: 0.0 for fd in self.fds}  # when each destination's port is idle again
        self.pending = []  # heap of (delivery time, sequence, fd, packet)
        self.seq = 0
        self.forwarded = self.dropped = 0

    def receive(self, packet: bytes, now: float) -> None:
        if len(packet) < 20 or packet[0] >> 4 != 4:
            return  # only IPv4 travels (the hosts have IPv4 addresses only)
        dst = self.by_address.get(packet[16:20])
        if dst is None:
            return
        arrival = now + self.delay
        start = max(arrival, self.port_free[dst])
        if start - arrival > self.queue:
            self.dropped += 1
            return
        done = start + len(packet) * 8 / self.rate
        self.port_free[dst] = done
        heapq.heappush(self.pending, (done, self.seq, dst, packet))
        self.seq += 1

    def deliver_due(self, now: float) -> None:
        while self.pending and self.pending[0][0] <= now:
            _, _, fd, packet = heapq.heappop(self.pending)
            try:
                os.write(fd, packet)
                self.forwarded += 1
            except (BlockingIOError, OSError):
                self.dropped += 1  # the host's stack is not taking packets (device down): a lost packet

    def run(self, stop_fd: int) -> None:
        watched = self.fds + [stop_fd]
        while True:
            now = time.monotonic()
            self.deliver_due(now)
            timeout = max(0.0, self.pending[0][0] - now) if self.pending else None
            readable, _, _ = select.select(watched, [], [], timeout)
            if stop_fd in readable and not os.read(stop_fd, 1):
                return  # stdin closed: the parent is gone
            now = time.monotonic()
            for fd in readable:
                if fd == stop_fd:
                    continue
                while True:  # drain: one select per burst, not per packet
                    try:
                        packet = os.read(fd, MAX_PACKET)
                    except BlockingIOError:
                        break
                    self.receive(packet, now)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delay-ms", type=float, required=True, help="one-way delay")
    p.add_argument("--rate", required=True, help="each destination port's rate, e.g. 100mbit")
    p.add_argument("--queue-ms", type=float, default=50.0, help="a port's longest backlog (tbf's latency)")
    p.add_argument("ports", nargs="+", help="NETNS:DEVICE:IPV4-ADDRESS, one per host")
    args = p.parse_args(argv)
    ports = []
    for spec in args.ports:
        netns, device, addr = spec.split(":")
        ports.append((open_tun(netns, device), ipaddress.IPv4Address(addr).packed))
    line = DelayLine(ports, args.delay_ms / 1e3, _hosts.rate_bits(args.rate), args.queue_ms / 1e3)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    try:
        line.run(sys.stdin.fileno())
    except KeyboardInterrupt:
        pass
    finally:
        print(f"delay line: {line.forwarded} packets forwarded, {line.dropped} dropped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
