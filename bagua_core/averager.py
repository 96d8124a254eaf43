"""Asynchronous model average's background loop, framework-free
(``csrc/sched/async_averager.h``): a frontend hands it the buckets holding
its weights and takes the weight lock around every change of them.

    averager = AsyncAverager(group, [bucket, ...], description.plan())
    averager.start()                    # rounds every sync_interval_ms
    with averager.weights_locked():     # an optimizer step: never half an average
        ...
    averager.abort()                    # every rank: last round, same weights everywhere

The loop runs on a private clone of ``group`` (created collectively: every
member builds its averager in the same order), owned and freed by the
averager, so it never interleaves with the training group's collectives.
A failure of the loop (a dead or stuck peer) is raised, as ``PeerError`` or
``CommTimeoutError``, by the next ``lock()`` / ``weights_locked()``,
``start()``, ``abort()`` or ``check()``.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence

from bagua_core import devices, log
from bagua_core._loader import _C
from bagua_core.dtypes import as_dtype

if TYPE_CHECKING:
    from bagua_core.algorithms._base import Plan
    from bagua_core.process_group import ProcessGroup


def weight_buckets(tensors: Sequence[tuple], device: Optional[_C.Device] = None) -> list:
    """Zeroed buckets (``_C.Bucket``), one per dtype, for ``(name, shape,
    dtype)`` declarations, tensors in the order given, in host memory or on
    ``device`` (a ``_C.Device``); ``bucket.view(name)`` is a zero-copy view
    of one tensor."""
    by_dtype: dict = {}
    for name, shape, dtype in tensors:
        by_dtype.setdefault(int(as_dtype(dtype)), []).append((str(name), tuple(int(d) for d in shape)))
    return [_C.Bucket(f"weights{i}", dt, ts, 1, device) for i, (dt, ts) in enumerate(by_dtype.items())]


def _release(core, group) -> None:
    try:
        core.close()
    finally:
        group.close()


class AsyncAverager:
    """The background averaging of ``buckets`` (``_C.Bucket`` objects holding
    the weights, one dtype each) over every rank of ``group``, as ``plan`` (an
    ``AsyncModelAverage`` plan) says. ``timeout_s`` bounds ``abort()``'s wait
    for the other ranks (default: the group's timeout).

    Buckets on a device (``device``, the buckets' ``_C.Device``): the loop
    averages them on a stream of its own, in device memory, after the
    training stream's last change; ``producer_stream()`` names that stream
    (called when the weight lock is released), None for host work."""

    def __init__(
        self,
        group: ProcessGroup,
        buckets: Sequence,
        plan: Plan,
        timeout_s: Optional[float] = None,
        device: Optional[_C.Device] = None,
        producer_stream: Optional[Callable[[], Optional[int]]] = None,
    ) -> None:
        if not group.is_member:
            raise ValueError(f"this process is not a member of {group!r}")
        if device is not None:
            devices.check_group_serves(group, device.type, "the averaged weights", device.index)
        self._producer_stream = producer_stream or (lambda: None)
        own = group.clone()
        try:
            comm = own.comm
            if device is not None and own.device_type != "cuda":
                comm = devices.staged(comm, device)
            # the stop flags are host memory: on NCCL groups they go on the Gloo control communicator
            self._core = _C.AsyncAverager(
                comm, list(buckets), dict(plan.params), timeout_s, control=own.control_group.comm
            )
        except BaseException:
            own.close()
            raise
        self._held = False
        own._on_close.append(self._core.close)  # destroy_process_group() stops the loop first
        self._release = weakref.finalize(self, _release, self._core, own)
        log.logger.info("asynchronous model average on %r: %s", group.name, self._core.description)

    def start(self) -> None:
        """Starts (or resumes) the rounds; a no-op while they run."""
        self._core.start()

    def abort(self) -> None:
        """Every rank calls it: blocks until every rank did, the last round
        ran with training stopped everywhere (every rank then holds the same
        weights) and the loop ended. A no-op when it is not running. Releases
        the weight lock first if this thread holds it. Raises
        ``CommTimeoutError`` when some rank did not call it within the
        timeout: the request is withdrawn and the averaging goes on."""
        self.unlock()
        self._core.abort()

    def lock(self) -> None:
        """Takes the weight lock (no-op if this frontend holds it already)."""
        if not self._held:
            self._core.lock_weights()
            self._held = True

    def unlock(self) -> None:
        if self._held:
            self._held = False
            self._core.unlock_weights(self._producer_stream())

    @contextlib.contextmanager
    def weights_locked(self) -> Iterator[None]:
        self.lock()
        try:
            yield
        finally:
            self.unlock()

    def check(self) -> None:
        self._core.check()

    @property
    def core(self) -> _C.AsyncAverager:
        """The engine's loop, for the engine objects built on it (``_C.AsyncWeights``)."""
        return self._core

    @property
    def running(self) -> bool:
        return self._core.running

    @property
    def rounds(self) -> int:
        """Averaging rounds completed on this rank."""
        return self._core.rounds

    def close(self) -> None:
        """Stops the loop without asking the peers (shutdown; call
        :meth:`abort` first to leave the ranks with the same weights) and
        frees its clone of the group."""
        self.unlock()
        self._release()
