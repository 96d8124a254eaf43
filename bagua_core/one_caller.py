"""One caller at a time per process group.

A group's collectives pair up by call order, and two threads calling into one
group take their turns in a different order on each rank: their calls pair
with the wrong partners and the results are silently wrong. So a group serves
one thread at a time: a call that arrives while another thread's call on the
same group is in progress raises :class:`ConcurrentUseError` naming both
threads. The group is then unusable on this rank (its communicator is closed,
so peers fail fast instead of waiting or pairing wrongly) and the call that was
in progress raises too, since its partner on a peer may have been the other
thread's call. Use one group per thread (``new_group``/``clone``) instead.
Sequential use from different threads is fine.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any, Callable, TypeVar, cast

from bagua_core.errors import ConcurrentUseError
from bagua_core.group_communicator import GroupCommunicator
from bagua_core.process_group import ProcessGroup, get_default_group

F = TypeVar("F", bound=Callable[..., Any])


class _Guard:
    def __init__(self):
        self.lock = threading.Lock()
        self.holder = None  # (thread ident, thread name, primitive)
        self.depth = 0
        self.broken = ""


_guards: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_guards_lock = threading.Lock()


def _guard(group) -> _Guard:
    g = _guards.get(group)
    if g is None:
        with _guards_lock:
            g = _guards.setdefault(group, _Guard())
    return g


def _enter(group, guard: _Guard, fn: str) -> None:
    me = threading.current_thread()
    if guard.holder is not None and guard.holder[0] == me.ident:
        guard.depth += 1  # a primitive built on others (broadcast_object)
        return
    if guard.broken:
        raise ConcurrentUseError(guard.broken)
    if not guard.lock.acquire(blocking=False):
        other = guard.holder
        who = f"thread {other[1]!r} in {other[2]}" if other else "another thread"
        guard.broken = (
            f"{fn} on process group '{group.name}' was called from thread {me.name!r} while {who} "
            "was using the same group: a group serves one thread at a time (calls pair up by order, "
            "so concurrent calls pair wrongly across ranks). This group is now closed on this rank; "
            "give each thread its own group (bagua_core.new_group or ProcessGroup.clone)"
        )
        _break(group)
        raise ConcurrentUseError(guard.broken)
    guard.holder = (me.ident, me.name, fn)
    guard.depth = 1


def _exit(guard: _Guard) -> None:
    guard.depth -= 1
    if guard.depth == 0:
        guard.holder = None
        guard.lock.release()
        if guard.broken:
            raise ConcurrentUseError(guard.broken)


def _break(group) -> None:
    """Closes the communicator (after the call in progress) so peers fail fast."""
    comm = getattr(group, "_comm", None)
    if comm is not None:
        comm.close()


def one_caller(fn: F) -> F:
    """Decorates a primitive whose ``group`` argument names the group it uses
    (its signature, as type checkers see it, is kept)."""
    index = list(inspect.signature(fn).parameters).index("group")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        group = kwargs.get("group") if len(args) <= index else args[index]
        if group is None:
            group = get_default_group()
        if isinstance(group, GroupCommunicator):
            group = group.group
        if not isinstance(group, ProcessGroup):
            return fn(*args, **kwargs)  # which raises the TypeError
        guard = _guard(group)
        _enter(group, guard, fn.__name__)
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            try:
                _exit(guard)
            except ConcurrentUseError as misuse:
                raise misuse from e
            raise
        _exit(guard)
        return result

    return cast(F, wrapper)
