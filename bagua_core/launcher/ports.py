"""Choosing a free master port on this machine."""

from __future__ import annotations

import socket


def _bindable(port: int) -> bool:
    # No SO_REUSEADDR: a port still in TIME_WAIT counts as taken, which is the safe answer.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))
        return True
    except OSError:
        return False


def free_port_pair(attempts: int = 200) -> int:
    """A port ``p`` such that ``p`` and ``p + 1`` are both free right now.

    ``p`` is for ``MASTER_PORT`` (torchrun's own store sits there when torch
    rendezvous is used) and ``p + 1`` for Bagua's store (``BAGUA_STORE_PORT``'s
    default).
    """
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port < 65535 and _bindable(port) and _bindable(port + 1):
            return port
    raise RuntimeError(f"found no free pair of ports (p, p + 1) in {attempts} attempts")
