"""The rendezvous behind the process groups: the job's store, and how ranks
meet in it from Python.

``connect_store()``: rank 0 hosts the store server (``_C.TcpStoreServer`` on
``MASTER_ADDR``:store port) and every rank connects a client (``_C.TcpStore``);
the other ranks wait for the server of this initialisation (its *generation*:
a rank re-initialising quickly may still reach the previous server) and check
that rank 0 has the same ``WORLD_SIZE``. A single process has no store.
``exchange()`` / ``exchange_then_meet()``: every rank publishes a value and
reads everyone's; while ranks are missing, Ctrl-C works and one line every
10 s names them, ``CommTimeoutError`` comes after ``BAGUA_TIMEOUT`` and
``PeerError`` at once when the store reports one of them dead.
``close_store()`` closes the client and, on rank 0, the server.
"""

from __future__ import annotations

import ipaddress
import socket
import time
import warnings
from typing import List, Sequence

from bagua_core import config, log
from bagua_core._loader import _C
from bagua_core.errors import BaguaError

_GENERATION_KEY = "bagua/generation"
_WORLD_SIZE_KEY = "bagua/world_size"
_PRESENT_KEY = "bagua/present"
_ATTEMPT_S = 0.25  # longest blocking store call while waiting for peers: Ctrl-C is seen between calls
_NOTICE_EVERY_S = 10.0


class _WaitNotice:
    """While waiting: one line every 10 s saying what for (``what``: text, or a
    function giving it)."""

    def __init__(self, what, rank: int, deadline: float):
        self._what, self._rank, self._deadline = what, rank, deadline
        self._next = time.monotonic() + _NOTICE_EVERY_S

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + _NOTICE_EVERY_S
            what = self._what() if callable(self._what) else self._what
            log.logger.warning(
                "bagua: rank %d is waiting for %s; timeout in %.0f s (BAGUA_TIMEOUT)",
                self._rank,
                what,
                max(0.0, self._deadline - now),
            )


class Rendezvous:
    """The job's store for one initialisation (``generation``), and the
    exchanges through it."""

    def __init__(self, settings: config.Settings, generation: int):
        self.settings = settings
        self.generation = generation
        # The address peers reach this process on (its communicators listen there).
        self.hostname = settings.hostname or _local_address(settings.master_addr)
        self.server = None
        self.store = None
        self.local_server = None  # a single process's store for NCCL's unique id
        self.local_store = None

    def connect_store(self) -> None:
        s = self.settings
        if s.world_size == 1:
            return  # nobody to meet: no store, no ports
        _warn_if_unauthenticated(s)
        if s.rank == 0:
            self.server = _C.TcpStoreServer(s.master_addr, s.store_port, secret=s.store_secret, **s.store_limits)
            self.store = _C.TcpStore(s.master_addr, s.store_port, 0, s.timeout_s, s.store_secret)
            self.store.set(_WORLD_SIZE_KEY, str(s.world_size).encode())  # before the generation: ranks wait for that
            self.store.set(_GENERATION_KEY, str(self.generation).encode())
            return
        # A rank re-initialising quickly may still reach the server of the
        # previous generation, before rank 0 closed it: wait for the new one.
        # Short attempts keep Ctrl-C working while rank 0 is not there yet.
        deadline = time.monotonic() + s.timeout_s
        waiting = _WaitNotice(
            f"rank 0's rendezvous store at {s.master_addr}:{s.store_port} (is rank 0 running, "
            "with the same MASTER_ADDR and MASTER_PORT?)",
            s.rank,
            deadline,
        )
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _C.CommTimeoutError(
                    f"no rendezvous store of generation {self.generation} at "
                    f"{s.master_addr}:{s.store_port} within {s.timeout_s} s (is rank 0 running, and are "
                    "MASTER_ADDR and BAGUA_STORE_PORT the same on every rank?)"
                )
            store = None
            try:
                # short attempts; later calls keep the full timeout
                attempt = min(remaining, _ATTEMPT_S)
                store = _C.TcpStore(
                    s.master_addr, s.store_port, s.rank, s.timeout_s, s.store_secret, connect_timeout_s=attempt
                )
                found = int(store.get(_GENERATION_KEY, attempt))
            except BaguaError:
                if store is not None:
                    store.close()
                waiting.tick()
                time.sleep(0.05)
                continue
            if found == self.generation:
                theirs = int(store.get(_WORLD_SIZE_KEY, remaining))
                if theirs != s.world_size:
                    store.close()
                    raise config.ConfigError(
                        f"WORLD_SIZE={s.world_size} on rank {s.rank} but {theirs} on rank 0: every rank must "
                        "be started with the same WORLD_SIZE"
                    )
                self.store = store
                return
            store.close()
            if found > self.generation:
                raise RuntimeError(
                    f"the rendezvous store is at initialisation {found} but this process at "
                    f"{self.generation}: every rank must call init_process_group() the same number of times"
                )
            time.sleep(0.05)

    def wait_for_everyone(self) -> None:
        """Returns once every rank reached the store (the communicators' own
        rendezvous, in C++, then finds everyone there)."""
        if self.settings.world_size > 1:
            self.exchange(_PRESENT_KEY, b"1", "join the job")

    def exchange(self, prefix: str, value: bytes, what: str) -> List[bytes]:
        """Every rank of the job publishes ``value`` under ``prefix/<rank>``;
        returns everyone's values in rank order. The one way ranks meet in the
        store from Python: while some are missing, Ctrl-C works and one line
        every 10 s names them; after BAGUA_TIMEOUT ``CommTimeoutError`` names
        the ranks that never came, and ``PeerError`` comes at once when the
        store reports one of them dead."""
        s = self.settings
        self.store.set(f"{prefix}/{s.rank}", value)
        keys = [f"{prefix}/{r}" for r in range(s.world_size)]
        self._wait_for(keys, what)
        return [self.store.get(k) for k in keys]

    def _wait_for(self, keys: List[str], what: str) -> None:
        """Returns once every key is in the store (see :meth:`exchange`)."""
        s = self.settings
        deadline = time.monotonic() + s.timeout_s
        waiting = None
        pause = 0.005
        where = f"(rendezvous at {s.master_addr}:{s.store_port})"
        while not self.store.check(keys):
            dead = self.store.dead_ranks()
            if dead:
                dead = sorted(set(self._missing(keys)) & set(dead))
                if dead:
                    one = len(dead) == 1
                    raise _C.PeerError(
                        f"{_ranks_str(dead)} {'has' if one else 'have'} died before "
                        f"{'it' if one else 'they'} could {what} {where}"
                    )
            if waiting is None:
                waiting = _WaitNotice(lambda: f"{_ranks_str(self._missing(keys))} to {what} {where}", s.rank, deadline)
            if time.monotonic() >= deadline:
                raise _C.CommTimeoutError(
                    f"{_ranks_str(self._missing(keys))} did not {what} within {s.timeout_s} s {where}"
                )
            waiting.tick()
            time.sleep(pause)
            pause = min(2 * pause, 0.1)

    def exchange_then_meet(self, prefix: str, value: bytes, what: str) -> List[bytes]:
        """:meth:`exchange`, and rank 0 returns only once every rank has read
        everyone's value: a decision that fails initialisation (whose ranks
        then close the store, rank 0 its server) reaches every rank. The
        others only say they have read and never wait on the store again for
        it, so rank 0 closing the server cannot cut one of them off."""
        values = self.exchange(prefix, value, what)
        s = self.settings
        if s.rank == 0:
            self._wait_for([f"{prefix}/read/{r}" for r in range(1, s.world_size)], what)
        else:
            self.store.set(f"{prefix}/read/{s.rank}", b"1")
        return values

    def _missing(self, keys: List[str]) -> List[int]:
        """The ranks whose key (``.../<rank>``) is not in the store yet."""
        return [int(k.rsplit("/", 1)[1]) for k in keys if not self.store.check([k])]

    def nccl_store(self):
        """The store NCCL's unique ids go through: the job's, or for a single
        process a private one on loopback."""
        if self.store is not None:
            return self.store
        if self.local_store is None:
            self.local_server = _C.TcpStoreServer("127.0.0.1", 0)
            self.local_store = _C.TcpStore("127.0.0.1", self.local_server.port, 0, self.settings.timeout_s)
        return self.local_store

    def close_store(self) -> None:
        """Closes the store client and the servers this process hosts. Idempotent."""
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.local_store is not None:
            self.local_store.close()
            self.local_server.close()
            self.local_store = self.local_server = None


def _ranks_str(ranks: Sequence[int]) -> str:
    shown = ", ".join(map(str, ranks[:16])) + (", ..." if len(ranks) > 16 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def _warn_if_unauthenticated(s: config.Settings) -> None:
    """Once per process: a store reachable from other hosts without a secret."""
    global _warned_secret
    if s.store_secret or _warned_secret or s.num_nodes == 1:
        return
    _warned_secret = True
    warnings.warn(
        f"{config.STORE_SECRET_ENV} is not set: Bagua's rendezvous store on {s.master_addr}:{s.store_port} "
        "accepts any client that reaches it. Set it to the same secret on every node (bagua-run does this "
        "for single-node jobs).",
        RuntimeWarning,
        stacklevel=3,
    )


_warned_secret = False


def _local_address(master_addr: str) -> str:
    """The local address that routes to ``master_addr`` (loopback stays loopback)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(master_addr, None, type=socket.SOCK_DGRAM)[0]
        if ipaddress.ip_address(addr[0].split("%")[0]).is_loopback:
            return addr[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr[0], 9))  # UDP: no packet is sent
            return s.getsockname()[0]
    except (OSError, ValueError):
        return socket.gethostbyname(socket.gethostname())
