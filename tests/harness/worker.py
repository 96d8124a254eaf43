"""Helpers used inside worker processes started by tests.harness.mp.launch."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Callable, Iterable, Tuple

from tests.harness.mp import CASE_PREFIX


def report(case: str, ok: bool, error: str = "", **extra) -> None:
    rec = {"case": case, "ok": ok, "error": error, **extra}
    sys.stdout.write(CASE_PREFIX + json.dumps(rec) + "\n")
    sys.stdout.flush()


def run_cases(cases: Iterable[Tuple[str, Callable[[], None]]]) -> int:
    """Runs each case, reporting success or the exception; returns the failure count.

    Every rank must run the same cases in the same order (they are collectives);
    a failing case on one rank may make its peers fail too, and that is reported.
    """
    failures = 0
    for name, fn in cases:
        try:
            fn()
            report(name, True)
        except Exception as e:  # noqa: BLE001 - the point is to report anything
            failures += 1
            report(name, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}")
    return failures


def expect_error(exc_type, fn, *needles):
    """Calls ``fn``; it must raise ``exc_type`` with every one of ``needles``
    in its message. Returns the exception."""
    try:
        fn()
    except exc_type as e:
        for n in needles:
            assert n in str(e), f"{n!r} not in the message: {e}"
        return e
    raise AssertionError(f"expected {exc_type.__name__}" + (f" mentioning {needles[0]!r}" if needles else ""))


def exit_as_dead_peer(case: str, rank: int, world: int) -> None:
    """On the last rank: reports ``case`` passed and exits at once, without a
    word to the others (the peer that dies in a dead-peer case)."""
    if rank == world - 1:
        report(case, True)
        sys.stdout.flush()
        os._exit(0)


def expect_failure_within(seconds: float, fn, *needles) -> None:
    """Calls ``fn`` (e.g. a collective with a dead peer); it must raise,
    with every one of ``needles`` in its message, within ``seconds``."""
    start = time.monotonic()
    expect_error(Exception, fn, *needles)  # JAX's runtime error type varies by version
    elapsed = time.monotonic() - start
    assert elapsed < seconds, f"failed only after {elapsed:.1f} s"


def open_store(_C, rank):
    """The rendezvous store: server on rank 0 at MASTER_PORT + 1, a client per rank."""
    port = int(os.environ["MASTER_PORT"]) + 1
    server = _C.TcpStoreServer("127.0.0.1", port) if rank == 0 else None
    return server, _C.TcpStore("127.0.0.1", port, rank, 30.0)


class StoreSession:
    """One rank of a communicator test session: ``rank``, ``world``, the store
    (``server`` on rank 0) and ``_C``. Subclasses give ``cases()`` and call
    :meth:`run_and_exit`."""

    def __init__(self):
        from bagua_core import _C

        self._C = _C
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.server, self.store = open_store(_C, self.rank)

    def run_and_exit(self, last_comm, *close) -> None:
        """Runs the cases, then a barrier on ``last_comm`` so that nobody needs
        the store (served by rank 0) any more, closes the communicators in
        ``close`` and the store, and exits 1 on failure."""
        failures = run_cases(self.cases())
        last_comm.barrier()
        for comm in close:
            comm.close()
        self.store.close()
        if self.server is not None:
            self.server.close()
        sys.exit(1 if failures else 0)


def wait_for_survivors(store, rank: int, world: int, victim: int, timeout_s: float = 10.0) -> None:
    """After a peer was killed: rank 0 serves the store, so it stays until the
    other survivors are done with it."""
    if victim == 0:
        return
    store.add("survivors_done", 1)
    deadline = time.monotonic() + timeout_s
    while rank == 0 and store.add("survivors_done", 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.01)


def threads() -> int:
    """Threads of this process."""
    return len(os.listdir("/proc/self/task"))


def resources() -> dict:
    """What a group holds while it lives: threads, descriptors (sockets among
    them) and mapped shared-memory segments of this process."""
    fds = [os.path.join("/proc/self/fd", f) for f in os.listdir("/proc/self/fd")]
    links = []
    for fd in fds:
        try:
            links.append(os.readlink(fd))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    with open("/proc/self/maps") as f:
        segments = {line.split()[-1] for line in f if "/dev/shm/bagua-" in line}
    return {
        "threads": threads(),
        "fds": len(links),
        "sockets": sum(link.startswith("socket:") for link in links),
        "shm segments": len(segments),
    }


def wait_for_threads(expected: int, timeout_s: float = 3.0) -> None:
    """Asserts the thread count falls back to ``expected`` (a thread ends a moment after it is joined)."""
    deadline = time.monotonic() + timeout_s
    while threads() > expected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert threads() == expected, f"{threads()} threads, {expected} expected"
