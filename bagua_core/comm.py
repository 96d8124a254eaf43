"""Communication primitives on any DLPack array (numpy, torch, JAX, CuPy, Buffer).

The original Bagua's primitives, with the same arguments, except that ``comm``
is called ``group`` (a :class:`~bagua_core.ProcessGroup` or one of its
communicators, ``group.get_global_communicator()`` and the like; default: the
world group) and that ``recv`` may be ``None`` for out-of-place operations: a
:class:`~bagua_core.Buffer` of the right shape and dtype is then allocated and
returned (JAX arrays are immutable: view the result with
``jax.numpy.from_dlpack``). Out-of-place operations return ``recv``; in-place
ones return None.

* Ranks (``src``, ``dst``, ``peer``) are ranks within ``group``.
* Arrays must be C-contiguous, of a supported dtype (float32, float64, float16,
  bfloat16, int32, int64, uint8), on the group's device; destinations must be
  writable (JAX arrays and read-only numpy arrays are not). Violations raise
  TypeError / ValueError before anything is sent.
* Every call blocks until done. Before a collective moves data the ranks
  agree on the call (operation, dtype, element count, root), so a mismatch
  raises :class:`~bagua_core.MismatchError` on every rank instead of
  corrupting or aborting. Empty arrays move no data but still take part in
  that agreement: every rank must make the call. send/recv of an empty array
  is a no-op. On a group this process is not a member of, every primitive
  returns at once.
* ``send`` may alias ``recv`` (the send data is copied aside first).
* Chunked operations split the flat element order: chunk ``i`` is elements
  ``[i*n, (i+1)*n)``.
"""

from __future__ import annotations

import enum
import operator
import pickle
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from bagua_core import devices
from bagua_core._loader import _C
from bagua_core.buffer import Buffer
from bagua_core.dlpack import DLPackView, _lazy_sign, import_array
from bagua_core.group_communicator import GroupCommunicator
from bagua_core.one_caller import one_caller
from bagua_core.process_group import ProcessGroup, get_default_group

# An array argument: anything exporting DLPack (numpy, torch, jax, CuPy, a bagua_core.Buffer).
Array = Any
# A group argument: a process group or one of its communicators (group.get_global_communicator(), ...).
Group = Union[ProcessGroup, GroupCommunicator]


class ReduceOp(enum.IntEnum):
    """Reduction operators (values of the original Bagua)."""

    SUM = 0
    PROD = 1
    PRODUCT = 1  # the original's name
    MIN = 2
    MAX = 3
    BOR = 7  # bitwise or, and, xor: integer dtypes, Gloo groups
    BAND = 8
    BXOR = 9
    AVG = 10


_OP_NAMES = {
    "sum": ReduceOp.SUM,
    "prod": ReduceOp.PROD,
    "product": ReduceOp.PROD,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "avg": ReduceOp.AVG,
    "mean": ReduceOp.AVG,
    "bor": ReduceOp.BOR,
    "band": ReduceOp.BAND,
    "bxor": ReduceOp.BXOR,
}
Op = Union[ReduceOp, int, str]  # a ReduceOp, its code or a name from _OP_NAMES


def _op(op) -> int:
    if isinstance(op, str):
        try:
            return int(_OP_NAMES[op.lower()])
        except KeyError:
            raise ValueError(f"unknown reduce op {op!r} (use one of {sorted(_OP_NAMES)})") from None
    try:
        if isinstance(op, bool):
            raise TypeError
        code = operator.index(op)
    except TypeError:
        raise TypeError(f"op must be a ReduceOp, an int or a name like 'sum', got {op!r}") from None
    try:
        return int(ReduceOp(code))
    except ValueError:
        raise ValueError(f"unknown reduce op {op!r}") from None


# --- arguments ---------------------------------------------------------------


def _group(group: Optional[Group]) -> ProcessGroup:
    if group is None:
        return get_default_group()
    if isinstance(group, GroupCommunicator):
        return group.group
    if not isinstance(group, ProcessGroup):
        raise TypeError(
            "group must be a bagua_core.ProcessGroup or one of its communicators "
            f"(group.get_global_communicator(), ...), got {type(group).__name__}"
        )
    return group


def _view(fn: str, what: str, x, g: ProcessGroup, writable: bool) -> DLPackView:
    if x is None:
        raise TypeError(f"{fn}: {what} is required here")
    try:
        v = import_array(x)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{fn}: {what}: {e}") from e
    devices.check_group_serves(g, v.device_type, f"{fn}: {what}", v.device_index)
    index = getattr(g.comm, "device_index", None)  # device communicators (NCCL) are bound to one device
    if index is not None and v.device_type == "cuda" and v.device_index != index:
        raise ValueError(f"{fn}: {what} is on cuda:{v.device_index} but group '{g.name}' uses cuda:{index}")
    if writable and v.read_only and _lazy_sign(x):
        raise ValueError(
            f"{fn}: {what} is a torch view with the negative or conjugate bit set (e.g. "
            "z.conj().imag): its memory holds other values than it shows, so it cannot be written "
            "in place; pass a resolved tensor (.resolve_neg() / .resolve_conj() / .clone())"
        )
    if writable and v.read_only:
        raise ValueError(
            f"{fn}: {what} is read-only ({type(x).__name__}); JAX arrays are immutable: pass "
            "recv=None to get a new bagua_core.Buffer, or a writable array"
        )
    return v


def _comm(g: ProcessGroup, *views: Optional[DLPackView]):
    """The communicator that serves ``views`` (one device, checked by _view):
    the group's own, or on a Gloo group with CUDA arrays its staged wrapper."""
    v = next((x for x in views if x is not None), None)
    if v is None or v.device_type == g.device_type:
        return g.comm
    return devices.staged(g.comm, devices.cuda(v.device_index))


def _output(fn: str, recv, g: ProcessGroup, shape: Tuple[int, ...], like: DLPackView):
    """(the object to return, its view): ``recv`` checked, or a new Buffer."""
    if recv is None:
        buf = Buffer(list(shape), like.dtype, like.device_type, like.device_index, False)
        return buf, import_array(buf)
    v = _view(fn, "recv", recv, g, writable=True)
    _same_dtype(fn, like, v)
    return recv, v


def _same_dtype(fn: str, a: DLPackView, b: DLPackView) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{fn}: send is {a.dtype.name} but recv is {b.dtype.name}")


def _expect_numel(fn: str, what: str, v: DLPackView, n: int, why: str) -> None:
    if v.numel != n:
        raise ValueError(f"{fn}: {what} has {v.numel} elements, expected {n} ({why})")


def _chunk(fn: str, what: str, v: DLPackView, size: int) -> int:
    if v.numel % size:
        raise ValueError(f"{fn}: {what} has {v.numel} elements, not a multiple of the group size {size}")
    return v.numel // size


def _root(fn: str, name: str, r, g: ProcessGroup) -> int:
    try:
        if isinstance(r, bool):  # True would silently mean rank 1
            raise TypeError
        r = operator.index(r)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be an integer rank, got {r!r}") from None
    if not 0 <= r < g.size:
        raise ValueError(f"{fn}: {name}={r} is out of range for group '{g.name}' of size {g.size}")
    return r


def _counts(fn: str, name: str, xs, size: int) -> list:
    try:
        out = [operator.index(x) for x in xs]
    except TypeError:
        raise TypeError(f"{fn}: {name} must be a sequence of integers, got {xs!r}") from None
    if len(out) != size:
        raise ValueError(f"{fn}: {name} needs one entry per rank ({size}), got {len(out)}")
    if any(x < 0 for x in out):
        raise ValueError(f"{fn}: {name} has negative entries: {out}")
    return out


def _displs(fn: str, name: str, xs, counts: list) -> list:
    """One displacement per rank; or, as Bagua 0.9.2 accepted, the cumulative
    form with one more entry at the end: where the last rank's chunk ends."""
    try:
        out = [operator.index(x) for x in xs]
    except TypeError:
        raise TypeError(f"{fn}: {name} must be a sequence of integers, got {xs!r}") from None
    size = len(counts)
    if len(out) == size + 1 and size > 0:
        end = out[size - 1] + counts[size - 1]
        if out[size] != end:
            raise ValueError(
                f"{fn}: {name} has {size + 1} entries for {size} ranks; the last one must be where the last "
                f"rank's chunk ends ({out[size - 1]} + {counts[size - 1]} = {end}), got {out[size]}"
            )
        out = out[:size]
    return _counts(fn, name, out, size)


def _fits(fn: str, what: str, v: DLPackView, counts: list, displs: list) -> None:
    need = max((c + d for c, d in zip(counts, displs) if c), default=0)
    if need > v.numel:
        raise ValueError(f"{fn}: {what} has {v.numel} elements but its counts/displs reach element {need}")


def _stacked(size: int, v: DLPackView) -> Tuple[int, ...]:
    return (size,) + tuple(v.shape)


def _split(n: int, v: DLPackView) -> Tuple[int, ...]:
    """Shape of one of n chunks of v: the first dimension divided when it can be."""
    if v.shape and v.shape[0] % n == 0:
        return (v.shape[0] // n,) + tuple(v.shape[1:])
    return (v.numel // n,)


def _scratch(v: DLPackView, count: int, start: Optional[int] = None) -> Buffer:
    """A scratch Buffer of ``count`` elements like ``v``, holding ``v[start:start+count]``
    when ``start`` is given. In-place calls use it where the engine does not
    promise that aliased buffers work."""
    buf = Buffer([count], v.dtype, v.device_type, v.device_index, False)
    if start is not None:
        _C.copy_memory(buf.address, _offset(v, start), buf.nbytes, v.device_type)
    return buf


def _offset(v: DLPackView, elements: int) -> int:
    return v.address + elements * v.dtype.itemsize


def _overlaps(a: DLPackView, b: DLPackView) -> bool:
    return a.address < b.address + b.numel * b.dtype.itemsize and b.address < a.address + a.numel * a.dtype.itemsize


def _unaliased(s: DLPackView, r: DLPackView):
    """(address of the send data, keep-alive): a copy of ``s`` when it overlaps ``r``,
    since the engine reads send while it writes recv."""
    if s.numel and r.numel and _overlaps(s, r):
        copy = _scratch(s, s.numel, start=0)
        return copy.address, copy
    return s.address, None


# --- point to point ----------------------------------------------------------
# The primitives below are named once, in bagua_core.PRIMITIVES (the package
# lists them without importing this module, which loads the extension).


@one_caller
def send(tensor: Array, dst: int, group: Optional[Group] = None) -> None:
    """Sends ``tensor`` to group rank ``dst`` (which calls :func:`recv`)."""
    g = _group(group)
    if not g.is_member:
        return
    v = _view("send", "tensor", tensor, g, writable=False)
    dst = _root("send", "dst", dst, g)
    if v.numel:
        _comm(g, v).send(v.address, v.numel, int(v.dtype), dst)


@one_caller
def recv(tensor: Array, src: int, group: Optional[Group] = None) -> None:
    """Receives into ``tensor`` what group rank ``src`` sends."""
    g = _group(group)
    if not g.is_member:
        return
    v = _view("recv", "tensor", tensor, g, writable=True)
    src = _root("recv", "src", src, g)
    if v.numel:
        _comm(g, v).recv(v.address, v.numel, int(v.dtype), src)


# --- collectives -------------------------------------------------------------


@one_caller
def broadcast(tensor: Array, src: int = 0, group: Optional[Group] = None) -> None:
    """Copies ``tensor`` of group rank ``src`` into ``tensor`` of every rank (in place;
    only written on the other ranks, so ``src`` may pass a read-only array)."""
    g = _group(group)
    if not g.is_member:
        return
    src = _root("broadcast", "src", src, g)
    v = _view("broadcast", "tensor", tensor, g, writable=g.rank != src)
    _comm(g, v).broadcast(v.address, v.numel, int(v.dtype), src)


@one_caller
def reduce(
    send_tensor: Array,
    recv_tensor: Optional[Array] = None,
    dst: int = 0,
    op: Op = ReduceOp.SUM,
    group: Optional[Group] = None,
) -> Array:
    """Reduces ``send_tensor`` of every rank into ``recv_tensor`` of ``dst``.
    ``recv_tensor`` is only needed (and allocated when None) on ``dst``."""
    g = _group(group)
    if not g.is_member:
        return recv_tensor
    fn = "reduce"
    dst = _root(fn, "dst", dst, g)
    s = _view(fn, "send", send_tensor, g, writable=False)
    code = _op(op)
    out, r = recv_tensor, None
    if recv_tensor is not None or g.rank == dst:
        out, r = _output(fn, recv_tensor, g, tuple(s.shape), s)
        _expect_numel(fn, "recv", r, s.numel, "same as send")
    _comm(g, s, r).reduce(s.address, r.address if r is not None else 0, s.numel, int(s.dtype), code, dst)
    return out


@one_caller
def reduce_inplace(tensor: Array, dst: int = 0, op: Op = ReduceOp.SUM, group: Optional[Group] = None) -> None:
    """Like :func:`reduce` with the result written over ``tensor`` on ``dst``
    (left unchanged elsewhere)."""
    g = _group(group)
    if not g.is_member:
        return
    dst = _root("reduce_inplace", "dst", dst, g)
    v = _view("reduce_inplace", "tensor", tensor, g, writable=g.rank == dst)
    code = _op(op)
    _comm(g, v).reduce(v.address, v.address, v.numel, int(v.dtype), code, dst)


@one_caller
def allreduce(
    send_tensor: Array, recv_tensor: Optional[Array] = None, op: Op = ReduceOp.SUM, group: Optional[Group] = None
) -> Array:
    """Reduces ``send_tensor`` of every rank into ``recv_tensor`` of every rank
    (returned; a new :class:`Buffer` when ``recv_tensor`` is None). Any array
    with ``__dlpack__`` works: numpy, torch, JAX, CuPy.

    Example:
        >>> x = np.full(4, bagua_core.get_rank() + 1, np.float32)
        >>> out = bagua_core.allreduce(x, op=bagua_core.ReduceOp.SUM)
        >>> np.from_dlpack(out)  # a world of one process: the input
        array([1., 1., 1., 1.], dtype=float32)
    """
    g = _group(group)
    if not g.is_member:
        return recv_tensor
    fn = "allreduce"
    s = _view(fn, "send", send_tensor, g, writable=False)
    code = _op(op)
    out, r = _output(fn, recv_tensor, g, tuple(s.shape), s)
    _expect_numel(fn, "recv", r, s.numel, "same as send")
    _comm(g, s, r).allreduce(s.address, r.address, s.numel, int(s.dtype), code)
    return out


@one_caller
def allreduce_inplace(tensor: Array, op: Op = ReduceOp.SUM, group: Optional[Group] = None) -> None:
    """Reduces ``tensor`` of every rank and writes the result into ``tensor`` on
    every rank.
    """
    g = _group(group)
    if not g.is_member:
        return
    v = _view("allreduce_inplace", "tensor", tensor, g, writable=True)
    code = _op(op)
    _comm(g, v).allreduce(v.address, v.address, v.numel, int(v.dtype), code)


@one_caller
def allgather(send_tensor: Array, recv_tensor: Optional[Array] = None, group: Optional[Group] = None) -> Array:
    """Concatenates every rank's ``send_tensor`` (in rank order) into ``recv_tensor``,
    which holds ``size * send.numel`` elements (allocated as ``(size, *send.shape)``).

    Example:
        >>> out = bagua_core.allgather(np.arange(3, dtype=np.int64))
        >>> np.from_dlpack(out).shape  # (world size, 3)
        (1, 3)
    """
    g = _group(group)
    if not g.is_member:
        return recv_tensor
    fn = "allgather"
    s = _view(fn, "send", send_tensor, g, writable=False)
    out, r = _output(fn, recv_tensor, g, _stacked(g.size, s), s)
    _expect_numel(fn, "recv", r, g.size * s.numel, f"group size {g.size} x send")
    _comm(g, s, r).allgather(s.address, r.address, s.numel, int(s.dtype))
    return out


@one_caller
def allgather_inplace(tensor: Array, group: Optional[Group] = None) -> None:
    """``tensor`` holds ``size`` chunks; each rank contributes the chunk at its rank."""
    g = _group(group)
    if not g.is_member:
        return
    v = _view("allgather_inplace", "tensor", tensor, g, writable=True)
    n = _chunk("allgather_inplace", "tensor", v, g.size)
    _comm(g, v).allgather(_offset(v, g.rank * n), v.address, n, int(v.dtype))


@one_caller
def gather(
    send_tensor: Array, recv_tensor: Optional[Array] = None, dst: int = 0, group: Optional[Group] = None
) -> Array:
    """Like :func:`allgather`, with the result only on ``dst`` (``recv_tensor`` is
    only needed, and allocated when None, there)."""
    g = _group(group)
    if not g.is_member:
        return recv_tensor
    fn = "gather"
    dst = _root(fn, "dst", dst, g)
    s = _view(fn, "send", send_tensor, g, writable=False)
    out, r = recv_tensor, None
    if recv_tensor is not None or g.rank == dst:
        out, r = _output(fn, recv_tensor, g, _stacked(g.size, s), s)
        _expect_numel(fn, "recv", r, g.size * s.numel, f"group size {g.size} x send")
    _comm(g, s, r).gather(s.address, r.address if r is not None else 0, s.numel, int(s.dtype), dst)
    return out


@one_caller
def gather_inplace(tensor: Array, count: int, dst: int = 0, group: Optional[Group] = None) -> None:
    """On ``dst``, ``tensor`` holds ``size * count`` elements and its own
    contribution at chunk ``dst``; elsewhere it holds the ``count`` elements sent."""
    g = _group(group)
    if not g.is_member:
        return
    fn = "gather_inplace"
    dst = _root(fn, "dst", dst, g)
    count = _counts(fn, "count", [count], 1)[0]
    v = _view(fn, "tensor", tensor, g, writable=g.rank == dst)
    if g.rank != dst:
        _expect_numel(fn, "tensor", v, count, "count on a non-dst rank")
        _comm(g, v).gather(v.address, 0, count, int(v.dtype), dst)
        return
    _expect_numel(fn, "tensor", v, g.size * count, f"group size {g.size} x count on dst")
    mine = _scratch(v, count, start=dst * count)
    _comm(g, v).gather(mine.address, v.address, count, int(v.dtype), dst)


@one_caller
def scatter(send_tensor: Array, recv_tensor: Array, src: int = 0, group: Optional[Group] = None) -> Array:
    """Chunk ``i`` of ``send_tensor`` on ``src`` (``size * recv.numel`` elements; only
    read there, may be None elsewhere) goes to ``recv_tensor`` of rank ``i``.
    ``recv_tensor`` is required: non-src ranks could not know its shape."""
    g = _group(group)
    if not g.is_member:
        return recv_tensor
    fn = "scatter"
    src = _root(fn, "src", src, g)
    r = _view(fn, "recv", recv_tensor, g, writable=True)
    s = None
    if g.rank == src or send_tensor is not None:
        s = _view(fn, "send", send_tensor, g, writable=False)
        _same_dtype(fn, s, r)
        _expect_numel(fn, "send", s, g.size * r.numel, f"group size {g.size} x recv")
    _comm(g, s, r).scatter(s.address if s is not None else 0, r.address, r.numel, int(r.dtype), src)
    return recv_tensor


@one_caller
def scatter_inplace(tensor: Array, count: int, src: int = 0, group: Optional[Group] = None) -> None:
    """On ``src``, ``tensor`` holds ``size * count`` elements (chunk ``src`` stays);
    elsewhere it receives ``count`` elements."""
    g = _group(group)
    if not g.is_member:
        return
    fn = "scatter_inplace"
    src = _root(fn, "src", src, g)
    count = _counts(fn, "count", [count], 1)[0]
    v = _view(fn, "tensor", tensor, g, writable=g.rank != src)
    if g.rank != src:
        _expect_numel(fn, "tensor", v, count, "count on a non-src rank")
        _comm(g, v).scatter(0, v.address, count, int(v.dtype), src)
        return
    _expect_numel(fn, "tensor", v, g.size * count, f"group size {g.size} x count on src")
    mine = _scratch(v, count)  # chunk src already sits in place
    _comm(g, v).scatter(v.address, mine.address, count, int(v.dtype), src)


@one_caller
def reduce_scatter(
    send_tensor: Array, recv_tensor: Optional[Array] = None, op: Op = ReduceOp.SUM, group: Optional[Group] = None
) -> Array:
    """Reduces ``send_tensor`` (``size`` chunks) across ranks; rank ``i`` receives
    the reduction of chunk ``i``."""
    g = _group(group)
    if not g.is_member:
        return recv_tensor
    fn = "reduce_scatter"
    s = _view(fn, "send", send_tensor, g, writable=False)
    code = _op(op)
    n = _chunk(fn, "send", s, g.size)
    out, r = _output(fn, recv_tensor, g, _split(g.size, s), s)
    _expect_numel(fn, "recv", r, n, f"send / group size {g.size}")
    _comm(g, s, r).reduce_scatter(s.address, r.address, n, int(s.dtype), code)
    return out


@one_caller
def reduce_scatter_inplace(tensor: Array, op: Op = ReduceOp.SUM, group: Optional[Group] = None) -> None:
    """The result for this rank is written over chunk ``rank`` of ``tensor``."""
    g = _group(group)
    if not g.is_member:
        return
    fn = "reduce_scatter_inplace"
    v = _view(fn, "tensor", tensor, g, writable=True)
    code = _op(op)
    n = _chunk(fn, "tensor", v, g.size)
    mine = _scratch(v, n)
    _comm(g, v).reduce_scatter(v.address, mine.address, n, int(v.dtype), code)
    _C.copy_memory(_offset(v, g.rank * n), mine.address, mine.nbytes, v.device_type)


@one_caller
def alltoall(send_tensor: Array, recv_tensor: Optional[Array] = None, group: Optional[Group] = None) -> Array:
    """Chunk ``j`` of ``send_tensor`` goes to rank ``j``, which stores it as chunk
    ``i`` (the sender's rank) of ``recv_tensor``."""
    g = _group(group)
    if not g.is_member:
        return recv_tensor
    fn = "alltoall"
    s = _view(fn, "send", send_tensor, g, writable=False)
    n = _chunk(fn, "send", s, g.size)
    out, r = _output(fn, recv_tensor, g, tuple(s.shape), s)
    _expect_numel(fn, "recv", r, s.numel, "same as send")
    src, _keep = _unaliased(s, r)
    _comm(g, r, s).alltoall(src, r.address, n, int(s.dtype))
    return out


@one_caller
def alltoall_inplace(tensor: Array, group: Optional[Group] = None) -> None:
    """As :func:`alltoall`, with ``tensor`` both sent and received (its chunk
    ``j`` goes to rank ``j`` and is replaced by rank ``j``'s chunk ``i``).
    """
    g = _group(group)
    if not g.is_member:
        return
    v = _view("alltoall_inplace", "tensor", tensor, g, writable=True)
    n = _chunk("alltoall_inplace", "tensor", v, g.size)
    before = _scratch(v, v.numel, start=0)
    _comm(g, v).alltoall(before.address, v.address, n, int(v.dtype))


@one_caller
def alltoall_v(
    send_tensor: Array,
    send_counts: Sequence[int],
    send_displs: Sequence[int],
    recv_tensor: Optional[Array],
    recv_counts: Sequence[int],
    recv_displs: Sequence[int],
    group: Optional[Group] = None,
) -> Array:
    """Rank ``i`` sends ``send_counts[j]`` elements from offset ``send_displs[j]`` to
    rank ``j``, which stores them at ``recv_displs[i]`` (``recv_counts[i]`` of them).
    ``recv_tensor=None`` allocates a 1-D buffer just large enough. Displacements
    may also come in Bagua 0.9.2's cumulative form, with the end of the last
    chunk as one more entry."""
    g = _group(group)
    if not g.is_member:
        return recv_tensor
    fn = "alltoall_v"
    s = _view(fn, "send", send_tensor, g, writable=False)
    sc, rc = _counts(fn, "send_counts", send_counts, g.size), _counts(fn, "recv_counts", recv_counts, g.size)
    sd, rd = _displs(fn, "send_displs", send_displs, sc), _displs(fn, "recv_displs", recv_displs, rc)
    _fits(fn, "send", s, sc, sd)
    length = max((c + d for c, d in zip(rc, rd) if c), default=0)
    out, r = _output(fn, recv_tensor, g, (length,), s)
    _fits(fn, "recv", r, rc, rd)
    src, _keep = _unaliased(s, r)
    _comm(g, r, s).alltoall_v(src, sc, sd, r.address, rc, rd, int(s.dtype))
    return out


@one_caller
def alltoall_v_inplace(
    tensor: Array, counts: Sequence[int], displs: Sequence[int], group: Optional[Group] = None
) -> None:
    """:func:`alltoall_v` with the same counts and displacements on both sides."""
    g = _group(group)
    if not g.is_member:
        return
    fn = "alltoall_v_inplace"
    v = _view(fn, "tensor", tensor, g, writable=True)
    c = _counts(fn, "counts", counts, g.size)
    d = _displs(fn, "displs", displs, c)
    _fits(fn, "tensor", v, c, d)
    before = _scratch(v, v.numel, start=0)
    _comm(g, v).alltoall_v(before.address, c, d, v.address, c, d, int(v.dtype))


@one_caller
def barrier(group: Optional[Group] = None) -> None:
    """Returns once every rank of the group has called it."""
    g = _group(group)
    if g.is_member:
        g.comm.barrier()  # type: ignore[union-attr]  # a member's group has its communicator


@one_caller
def broadcast_object(obj: Any, src: int = 0, group: Optional[Group] = None) -> Any:
    """Returns group rank ``src``'s ``obj`` on every rank (pickled: length first,
    then the bytes). It unpickles what ``src`` sent, so it trusts its peers
    (ranks of the same job; see the security model in the documentation). An object that
    cannot be pickled raises on ``src`` and ValueError on the others. The
    bytes travel on the group's host control communicator (Gloo, also on NCCL
    groups)."""
    g = _group(group).control_group
    if not g.is_member:
        return obj
    src = _root("broadcast_object", "src", src, g)
    failure = None
    if g.rank == src:
        try:
            payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        except Exception as e:  # noqa: BLE001 - any pickling failure; the peers must hear of it
            failure, payload = e, None
        length = np.array([-1 if payload is None else payload.size], dtype=np.int64)
    else:
        length = np.zeros(1, dtype=np.int64)
    broadcast(length, src, g)
    if failure is not None:
        raise failure
    if length[0] < 0:
        raise ValueError(f"broadcast_object: rank {src} could not pickle its object")
    if g.rank != src:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    broadcast(payload, src, g)
    return obj if g.rank == src else pickle.loads(payload.tobytes())  # type: ignore[union-attr]  # set above
