"""The overlap engine, framework-free: buckets over core memory, readiness, ops.

A frontend uses it in three moves:

1. **Buckets over core memory.** ``engine.create_buckets(tensors)`` plans
   buckets from ``(name, shape, dtype)`` declarations in registration order
   (pass reverse parameter order) and allocates them; ``bucket.view(name)`` is a
   zero-copy view of one tensor's slot (``numpy.asarray(view)``), so parameters
   or gradients can live in the bucket. Then append the algorithm's step to
   each bucket: ``bucket.append_op(plan.step, **plan.params)`` (the steps of
   ``csrc/ops/registry.h``: "centralized_allreduce", "bytegrad",
   "decentralized"; see :mod:`bagua_core.algorithms` for the plans).
2. **Readiness.** ``engine.mark_ready(name)`` from a gradient hook (any
   thread). A bucket launches once all its tensors are ready and every earlier
   bucket has launched, and runs on the comm thread of its lane (bucket i on
   lane i % lanes, each lane with its own communicators), so all ranks issue
   the same collectives in the same order on each communicator while backward
   still runs. With two lanes (the default on CPU, ``BAGUA_ENGINE_LANES``)
   consecutive buckets pipeline: one computes (compresses, packs, reduces)
   while the other's bytes are on the wire.
3. **wait()** before ``optimizer.step()``: blocks (without the GIL) until every
   bucket has finished, resets readiness for the next step, and raises the
   first failure, naming the bucket and its tensors (``CommTimeoutError`` for a
   tensor never marked ready or a stuck peer, ``PeerError`` for a dead one).
   Or bucket by bucket: ``engine.wait_any(indices)`` returns one of the
   step's buckets that has finished (the lowest), so its results can be used
   (e.g. the optimizer applied to its parameters) while later buckets still
   communicate; ``wait()`` then ends the step, at once.

Decentralized averaging communicates weights (buckets over the parameters):
at the start of EVERY training forward call ``engine.mark_all_ready()`` (the
op counts steps and communicates on steps 0, k, 2k, ...; on the others it does
nothing), ``wait()`` after backward, then ``op.copy_back()`` for each bucket's
:class:`StepOp` (weights <- peer average; a no-op on steps that did not
communicate) before ``optimizer.step()``. Forward and backward only read the
weights while the comm thread averages them into the op's own peer buffer.

Threads and communicators: a communicator serves one thread at a time, and
every rank must issue its collectives in the same order. An engine's comm
threads run whenever buckets become ready, independently of the caller's
thread and of other engines, so each must be the only user of its
communicators. :meth:`Engine.for_group` therefore builds each lane of an engine
over a private clone of the group (``group.clone()``: same ranks, new communicators,
created collectively when the engine is built, in the same order on every
rank), owned and freed by the engine: two wrapped models on one group may then
communicate at the same time (e.g. a GAN, whose generator's loss flows through
the discriminator) while the caller's thread keeps using the group itself (buffer
broadcasts, primitives). The rule is one comm thread per communicator: one
engine lane per clone. An engine built directly from communicators
(``Engine(comm, ...)``) must get ones nobody else uses while it runs.

Devices: ``Engine.for_group(group, device=...)`` puts the buckets on a
``_C.Device`` (``Device.cuda(i)``; ``Device.host(delay_us)`` is the host
implementation the test suite runs the device path on). Each lane then has a
comm stream on it; pass the stream that produced the tensors to
``mark_ready(name, stream=...)`` and the optimizer's stream to
``wait(stream=...)``, which makes that stream wait for the step's device work
(without a stream, ``wait()`` blocks until the device finished). A Gloo
group serves device buckets through host staging
(``_C.stage_through_host``), in the order of the lane's stream.

Example (numpy)::

    engine = Engine.for_group(bagua_core.init_process_group())
    [bucket] = engine.create_buckets([("w", (4, 3), "float32")])
    bucket.append_op("centralized_allreduce", average=True)
    w = np.asarray(bucket.view("w"))
    w[...] = local_gradient
    engine.mark_ready("w")
    engine.wait()          # w now holds the mean over the group
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Sequence, Tuple, Union

from bagua_core import algorithm_steps, config, devices, log
from bagua_core._loader import _C
from bagua_core.dtypes import DType, DTypeLike, as_dtype

if TYPE_CHECKING:
    from bagua_core.algorithms._base import Plan
    from bagua_core.process_group import ProcessGroup

MemoryView = _C.MemoryView
StepOp = _C.StepOp
Op = _C.Op

Shape = Sequence[int]


class BucketTiming(NamedTuple):
    """Times of one bucket in the current or last step, in ns of
    ``time.monotonic_ns()``'s clock; -1 when it has not happened (yet).
    ``ready_ns`` is recorded only while ``Engine.record_ready`` is on."""

    ready_ns: int  # its last tensor was marked ready
    launch_ns: int  # all its tensors ready and every earlier bucket launched
    start_ns: int  # the comm thread began its ops
    end_ns: int  # its ops finished (or failed)


def _numel(shape: Shape) -> int:
    return int(math.prod(int(d) for d in shape))


def _shape(shape) -> Tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(d) for d in shape)


def default_bucket_bytes() -> int:
    """``BAGUA_BUCKET_SIZE`` (bytes; default 10 MiB)."""
    return config.load().bucket_size


def plan_buckets(tensors: Sequence[Tuple[str, int, object]], bucket_bytes: Optional[int] = None) -> List[List[str]]:
    """Groups ``(name, numel, dtype)`` declarations (registration order) into
    buckets of at most ``bucket_bytes`` (default ``BAGUA_BUCKET_SIZE``), one
    dtype per bucket; a bucket is larger only when it holds one larger tensor.
    Returns the tensor names of each bucket, buckets in launch order (by the
    position of their last tensor)."""
    bucket_bytes = default_bucket_bytes() if bucket_bytes is None else int(bucket_bytes)
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    decls = [(str(n), int(k), int(as_dtype(d))) for n, k, d in tensors]
    return [[decls[i][0] for i in group] for group in _C.plan_buckets(decls, bucket_bytes)]


class Bucket:
    """One bucket of an :class:`Engine`: a flat buffer of one dtype holding named
    tensors back to back (zero padding at the end up to ``alignment``)."""

    def __init__(self, engine: "Engine", index: int, core: _C.Bucket) -> None:
        self.engine = engine
        self.index = index
        self._core = core

    # ---- layout and memory ----
    @property
    def name(self) -> str:
        return self._core.name

    @property
    def dtype(self) -> DType:
        return DType(self._core.dtype)

    @property
    def numel(self) -> int:
        """Elements, padding included."""
        return self._core.numel

    @property
    def payload_numel(self) -> int:
        return self._core.payload_numel

    @property
    def nbytes(self) -> int:
        return self._core.nbytes

    @property
    def tensor_names(self) -> List[str]:
        """Names of its tensors, padding excluded, in layout order."""
        return [n for i, n in enumerate(self._core.slot_names) if not self._core.slot(i)["is_padding"]]

    def slot(self, key: Union[int, str]) -> dict:
        """Layout of one slot: name, offset (elements), numel, shape, is_padding."""
        return self._core.slot(key)

    def view(self, key: Union[int, str]) -> MemoryView:
        """Zero-copy view of one tensor's slot (by name or index), in its shape."""
        return self._core.view(key)

    def flat_view(self) -> MemoryView:
        """Zero-copy 1-D view of the whole bucket, padding included."""
        return self._core.flat_view()

    # ---- the op chain (between steps) ----
    def append_op(self, step: str, **params) -> StepOp:
        """Appends the registered engine step ``step`` (:func:`bagua_core.algorithm_steps.names`)
        with its parameters, e.g. ``append_op("bytegrad", hierarchical=False,
        average=True)``; returns its :class:`StepOp`. Steps that need an
        element count multiple of the group size (ByteGrad) need a bucket
        created with that ``alignment``."""
        return self.engine._core.append_op(self.index, str(step), params)

    def ops(self) -> List[Op]:
        return self.engine._core.ops(self.index)

    def clear_ops(self) -> None:
        self.engine._core.clear_ops(self.index)

    # ---- readiness ----
    def mark_ready(self, key: Union[int, str], stream: Optional[int] = None) -> None:
        slot = key if isinstance(key, int) else self._core.slot_index(key)
        if slot < 0:
            raise ValueError(f"bucket '{self.name}' has no tensor named {key!r}")
        self.engine._core.mark_ready(self.index, slot, stream)

    def mark_all_ready(self, stream: Optional[int] = None) -> None:
        self.engine._core.mark_bucket_ready(self.index, stream)

    def __repr__(self) -> str:
        return f"<Bucket #{self.index} '{self.name}' {self.dtype.name} numel={self.numel} tensors={len(self.tensor_names)}>"


def _release(core, groups) -> None:
    """Stops an engine's comm threads, then frees the clones they ran on."""
    try:
        core.close()
    finally:
        for group in groups:
            group.close()


def _on_device(comm, group, device):
    """``comm`` (of ``group``) for buckets on ``device``: a host communicator
    stages them through host memory; NCCL serves device memory itself."""
    if comm is None or device is None or group.device_type == "cuda":
        return comm
    return _C.stage_through_host(comm, device)


def default_lanes(group: ProcessGroup) -> int:
    """Lanes of an engine on ``group``: :func:`bagua_core.config.engine_lanes_for`
    (``BAGUA_ENGINE_LANES``, else 1 on NCCL groups and 2 on Gloo groups)."""
    return config.engine_lanes_for(config.load(), getattr(group, "backend", "gloo"))


class Engine:
    """The overlap engine over one or more lanes of communicators (one comm
    thread each; bucket i runs on lane i % lanes).

    ``comm`` is a ``_C.Communicator`` no other thread uses while the engine
    runs (see the module docstring; :meth:`for_group` makes one); hierarchical
    ops also need ``intra`` (this node's processes) and, on node leaders
    (intra rank 0), ``inter`` (one process per node). ``more_lanes``: the
    ``(comm, intra, inter)`` of each further lane, communicators of their own
    over the same ranks. ``timeout_s`` bounds ``wait()`` (default: the
    communicator's timeout, ``BAGUA_TIMEOUT``).
    """

    def __init__(
        self,
        comm: _C.Communicator,
        intra: Optional[_C.Communicator] = None,
        inter: Optional[_C.Communicator] = None,
        timeout_s: Optional[float] = None,
        more_lanes: Sequence[tuple] = (),
        device: Optional[_C.Device] = None,
    ) -> None:
        self._core = _C.Engine(comm, intra, inter, timeout_s, [tuple(lane) for lane in more_lanes])
        self._comms = (comm, intra, inter)
        self._device = device
        self._buckets: List[Bucket] = []
        self._groups = []  # the private clones it owns (for_group)
        self._release = None

    @classmethod
    def for_group(
        cls,
        group: ProcessGroup,
        hierarchical: bool = False,
        timeout_s: Optional[float] = None,
        lanes: Optional[int] = None,
        device: Optional[_C.Device] = None,
    ) -> "Engine":
        """An engine over private clones of a ``bagua_core`` process group (and,
        with ``hierarchical``, of their intra- and inter-node groups), one per
        lane (default :func:`default_lanes`). Collective: every member of the
        group calls it, in the same order, with the same number of lanes. The
        engine owns the clones: :meth:`close`, garbage collection of the engine,
        closing a clone or ``destroy_process_group()`` stop its comm threads and
        free the clones' connections and threads. ``device``: a ``_C.Device``
        for the buckets (see the module docstring); a host (Gloo) group then
        serves them through host staging."""
        if not group.is_member:
            raise ValueError(f"this process is not a member of {group!r}")
        if device is not None:
            devices.check_group_serves(group, device.type, "the engine's buckets", device.index)
        lanes = default_lanes(group) if lanes is None else int(lanes)
        if lanes < 1:
            raise ValueError(f"an engine needs at least one lane, got {lanes}")
        owned = []
        try:
            comms = []
            for _ in range(lanes):
                owned.append(group.clone())
                own = owned[-1]
                intra = inter = None
                if hierarchical:
                    intra = own.intra_node_group().comm
                    inter = own.inter_node_group().comm
                comms.append(tuple(_on_device(c, group, device) for c in (own.comm, intra, inter)))
            engine = cls(*comms[0], timeout_s=timeout_s, more_lanes=comms[1:], device=device)
        except BaseException:
            for own in owned:
                own.close()
            raise
        engine._groups = owned
        log.logger.info(
            "engine on %r: %s, %d lane(s)",
            group.name,
            "hierarchical (within each node, then between node leaders)"
            if hierarchical
            else "flat (every rank together)",
            lanes,
        )
        for own in owned:
            own._on_close.append(engine._core.close)  # destroy_process_group() stops the threads first
        # No reference to the engine itself: it may still be collected.
        engine._release = weakref.finalize(engine, _release, engine._core, owned)
        return engine

    @property
    def num_lanes(self) -> int:
        return self._core.num_lanes

    @property
    def group(self) -> Optional[ProcessGroup]:
        """The private process group (clone) of the engine's first lane, if it
        was built by :meth:`for_group`."""
        return self._groups[0] if self._groups else None

    def check_step(self, plan: Plan) -> steps.StepInfo:
        """Makes ``plan``'s step (:mod:`bagua_core.algorithms`) over this
        engine's communicators: raises ValueError when it cannot run on them,
        else returns its :class:`bagua_core.algorithm_steps.StepInfo` (e.g. the bucket
        alignment it needs)."""
        info = algorithm_steps.check_plan(plan, None, comms=self._comms)
        log.logger.info(
            "algorithm step %r (%s), communicates %s in phase %s",
            plan.step,
            plan.params_text(),
            plan.communicates,
            plan.phase,
        )
        return info

    # ---- buckets ----
    def add_bucket(
        self, name: str, tensors: Sequence[Tuple[str, Shape]], dtype: DTypeLike, alignment: int = 1
    ) -> Bucket:
        """Allocates a bucket holding ``(name, shape)`` tensors of one dtype and
        appends it to the launch order."""
        if alignment < 1:
            raise ValueError(f"alignment must be >= 1, got {alignment}")
        core = _C.Bucket(
            str(name), int(as_dtype(dtype)), [(str(n), _shape(s)) for n, s in tensors], int(alignment), self._device
        )
        index = self._core.add_bucket(core)
        bucket = Bucket(self, index, core)
        self._buckets.append(bucket)
        return bucket

    def create_buckets(
        self, tensors: Sequence[Tuple[str, Shape, object]], bucket_bytes: Optional[int] = None, alignment: int = 1
    ) -> List[Bucket]:
        """Plans (see :func:`plan_buckets`) and allocates buckets for ``(name,
        shape, dtype)`` declarations in registration order. Buckets are named
        by their index among this engine's buckets ("0", "1", ...)."""
        decls = [(str(n), _shape(s), as_dtype(d)) for n, s, d in tensors]
        by_name = {n: (s, d) for n, s, d in decls}
        if len(by_name) != len(decls):
            raise ValueError("tensor names must be unique")
        plan = plan_buckets([(n, _numel(s), d) for n, s, d in decls], bucket_bytes)
        out = []
        for names in plan:
            dtype = by_name[names[0]][1]
            out.append(self.add_bucket(str(len(self._buckets)), [(n, by_name[n][0]) for n in names], dtype, alignment))
        log.logger.info("%d bucket(s), bytes %s", len(out), [b.nbytes for b in out])
        return out

    @property
    def buckets(self) -> List[Bucket]:
        return list(self._buckets)

    def clear_buckets(self) -> None:
        """Removes every bucket (between steps), e.g. to switch algorithms."""
        self._core.clear_buckets()
        self._buckets.clear()

    # ---- readiness and steps ----
    def mark_ready(self, name: str, stream: Optional[int] = None) -> None:
        """Marks the tensor called ``name`` ready for this step (any thread).
        ``stream``: on a device, the stream that produced it."""
        self._core.mark_ready(name, stream)

    def mark_all_ready(self, stream: Optional[int] = None) -> None:
        self._core.mark_all_ready(stream)

    def wait(self, stream: Optional[int] = None) -> None:
        """Ends the step: blocks until every bucket has launched and finished,
        then resets readiness. Returns at once when no tensor was marked ready
        since the last wait(). On a device, ``stream`` (the optimizer's) is
        made to wait for the step's device work; without it the call blocks
        until the device finished."""
        self._core.wait(stream)

    def wait_any(self, buckets: Sequence[int], stream: Optional[int] = None) -> int:
        """The lowest of ``buckets`` (indices) that has finished in the current
        step, blocking (without the GIL) until one has; the lowest of them at
        once when no step is in progress. It does not end the step:
        :meth:`wait` does (at once when every bucket has finished). Timeouts
        and failures as :meth:`wait` (a bucket that does not launch within the
        timeout, a stuck or dead peer: an exception once no lane runs a
        bucket; afterwards every call raises). ``stream``: as for
        :meth:`wait`, for that bucket's device work."""
        return self._core.wait_any([int(b) for b in buckets], stream)

    def wait_bucket(self, bucket: int, stream: Optional[int] = None) -> None:
        """Blocks until bucket ``bucket`` (index) has finished in the current
        step: :meth:`wait_any` of that one bucket."""
        self._core.wait_any([int(bucket)], stream)

    @property
    def device(self) -> Optional[_C.Device]:
        """The buckets' ``_C.Device`` (None: host memory)."""
        return self._device

    @property
    def steps(self) -> int:
        """Steps completed by wait()."""
        return self._core.steps

    @property
    def launches(self) -> int:
        """Buckets launched since the engine was created."""
        return self._core.launches

    @property
    def in_step(self) -> bool:
        return self._core.in_step

    @property
    def broken(self) -> bool:
        """True after a failure: every later wait() raises."""
        return self._core.broken

    @property
    def timeout_s(self) -> float:
        return self._core.timeout_s

    def timings(self) -> List[BucketTiming]:
        """Per bucket ready/launch/start/end times of the current or last step."""
        return [BucketTiming(*t) for t in self._core.timings()]

    @property
    def record_ready(self) -> bool:
        """Whether the engine records when each tensor becomes ready (for
        traces and the autotuner; off by default, then readiness reads no
        clock). Set it between steps; it applies from the next step."""
        return self._core.record_ready

    @record_ready.setter
    def record_ready(self, on: bool) -> None:
        self._core.record_ready = bool(on)

    def ready_order(self) -> List[str]:
        """Tensor names in the order they were marked ready in the current or
        last step (needs :attr:`record_ready`); tensors never marked come last,
        in registration order."""
        marked, unmarked = [], []
        for b in self._buckets:
            times = self._core.slot_ready_ns(b.index)
            for i, name in enumerate(b._core.slot_names):
                if b.slot(i)["is_padding"]:
                    continue
                (marked if times[i] >= 0 else unmarked).append((times[i], len(marked) + len(unmarked), name))
        return [n for _, _, n in sorted(marked)] + [n for _, _, n in unmarked]

    def close(self) -> None:
        """Stops and joins the comm threads (after the buckets they run) and
        frees the clones it owns (their connections and threads). Idempotent."""
        if self._release is not None:
            self._release()
        else:
            self._core.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def monotonic_ns() -> int:
    """The engine's clock; equal to ``time.monotonic_ns()`` on Linux."""
    return _C.monotonic_ns()


def shift_one_peer(rank: int, n: int, comm_step: int) -> int:
    """The decentralized ``shift_one`` partner of ``rank`` among ``n`` (even)
    peers at communication number ``comm_step``."""
    return _C.shift_one_peer(rank, n, comm_step)
