"""Choosing a free master port on this machine."""

from __future__ import annotations

import random
import socket
from typing import Tuple

# The lowest port handed out here: above the registered services people run.
_LOWEST = 20000


def _bindable(port: int) -> bool:
    # No SO_REUSEADDR: a port still in TIME_WAIT counts as taken, which is the safe answer.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))
        return True
    except OSError:
        return False


def _ephemeral_range() -> Tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_master_ports(attempts: int = 200) -> int:
    """A port ``p`` such that ``p``, ``p + 1`` and ``p + 2`` are free right now.

    ``p`` is for ``MASTER_PORT`` (torchrun's own store sits there when torch
    rendezvous is used), ``p + 1`` for Bagua's store (``BAGUA_STORE_PORT``'s
    default) and ``p + 2`` for JAX's coordinator when the workers call
    ``jax.distributed.initialize()`` (``bagua_core.config.Settings.jax_coordinator_address``).
    They are drawn outside the kernel's ephemeral range: a port
    from there can be taken by any outgoing connection (Gloo opens many)
    between this check and the moment the store listens.
    """
    lo, hi = _ephemeral_range()
    spans = [(a, b) for a, b in ((_LOWEST, lo - 3), (hi + 1, 65532)) if b > a]
    rng = random.Random()  # seeded from the OS: concurrent launchers draw differently
    for _ in range(attempts):
        if spans:
            a, b = rng.choice(spans)
            port = rng.randint(a, b)
        else:  # no room outside the ephemeral range: let the kernel pick
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        if port < 65534 and all(_bindable(port + k) for k in range(3)):
            return port
    raise RuntimeError(f"found no free ports p, p + 1, p + 2 in {attempts} attempts")
