"""Process groups: which processes talk to each other, over which communicator.

``init_process_group()`` reads the environment through :mod:`bagua_core.config`
(torchrun's contract), starts the rendezvous store (:mod:`bagua_core.rendezvous`:
``_C.TcpStoreServer`` on ``MASTER_ADDR``:store port, hosted by rank 0; none for
a single process) and connects the world group's Gloo communicator. Calling it
again with the same settings returns the existing world group; with different
settings it raises ``RuntimeError`` (``destroy_process_group()`` first).

``new_group(ranks)`` makes a sub-group. Every rank of the job calls it, in the
same order and with the same ranks (the groups are numbered by call order;
the ranks' lists are compared through the store, and a difference raises
``MismatchError`` on every rank); only the members connect.
Non-members get a group with ``is_member == False``, ``rank == -1`` and
``comm is None``: every primitive on it returns immediately without doing
anything.

``group.clone()`` makes a private copy of a group: the same ranks over new
communicators (a fresh rendezvous). A communicator serves one thread at a time,
in the same order on every rank; a thread that communicates on its own (an
engine's comm thread) therefore gets a clone, so that two of them never
interleave their collectives differently on different ranks. ``close()`` frees
a clone's (or a ``new_group``'s) communicators and threads.

For hierarchical algorithms a group splits by node: ``intra_node_group()`` is
the group's ranks on this node; ``inter_node_group()`` the node leaders (the
first group rank on each node; on other ranks a non-member group). Node
identities come from every rank's ``NODE_RANK`` / ``LOCAL_RANK``, exchanged at
initialisation (ranks of a node need not be contiguous), so 4 processes with
``LOCAL_WORLD_SIZE=2`` act as 2 nodes of 2. Both are created on first use and
only their members rendezvous.

Ranks passed to primitives (``src``, ``dst``, ``peer``) are ranks within the
group, as in the original Bagua; ``group.ranks[i]`` is the global rank of group
rank ``i``.

Backends (:mod:`bagua_core.backend`; setting ``BAGUA_BACKEND`` or the
``backend`` argument of ``init_process_group()`` / ``new_group()``): a Gloo
group communicates host memory; an NCCL group communicates CUDA memory of
device ``LOCAL_RANK`` (``group.device_type == "cuda"``, ``group.device_index``).
``auto`` (the default) is NCCL when every rank of the job can run it, else
Gloo. ``new_group()`` defaults to the world group's backend; clones and
intra/inter-node groups keep their group's. An NCCL group has two
communicators: the NCCL one (rendezvous: rank 0 publishes NCCL's unique id in
the job's store) and a Gloo *control* communicator over the same ranks
(``group.control_group``, a host-memory view of the group) that carries what
the ranks exchange about host data: node identities, the agreement checks of
:mod:`bagua_core.agreement`, ``broadcast_object``, and the cross-rank
agreement on every NCCL collective before it runs (comm/agreed_communicator.h:
one small Gloo allgather per call, or one per engine step through
``expect_calls``). On a Gloo group ``control_group`` is the group itself.
``close()`` closes both.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from bagua_core import _nccl, backend as backends, config, log
from bagua_core._loader import _C
from bagua_core.dtypes import DType
from bagua_core.group_communicator import GroupCommunicator
from bagua_core.rendezvous import Rendezvous


class ProcessGroup:
    """A set of ranks with a communicator.

    Attributes: ``name`` (its store prefix), ``ranks`` (sorted global ranks),
    ``size``, ``rank`` (this process's rank in the group, -1 when not a member),
    ``is_member``, ``backend`` ("nccl" or "gloo"), ``device_type`` ("cuda" on
    NCCL, "cpu" on Gloo), ``device_index`` (the CUDA device of an NCCL group:
    ``LOCAL_RANK``; None on Gloo and on non-members), ``control_group``.
    """

    def __init__(self, ctx: "_Context", name: str, ranks: Sequence[int], backend: str = "gloo", register: bool = True):
        self._ctx = ctx
        self.name = name
        self.backend = backend
        self.ranks = tuple(ranks)
        self.size = len(self.ranks)
        me = ctx.settings.rank
        self.rank = self.ranks.index(me) if me in self.ranks else -1
        self._comm = None
        self._handle: Optional[int] = None
        self._intra: Optional[ProcessGroup] = None
        self._inter: Optional[ProcessGroup] = None
        self._clones = 0  # clones made so far: names the next one
        self._closed = False
        # run by close() before the communicators go, e.g. to stop an engine's comm thread
        self._on_close: List[Callable[[], None]] = []
        self._control: Optional[ProcessGroup] = None  # the Gloo control view, when separate
        if register:
            ctx.groups.append(self)

    @property
    def is_member(self) -> bool:
        return self.rank >= 0

    @property
    def device_type(self) -> str:
        return "cuda" if self.comm is not None and self.comm.device_type == 1 else "cpu"

    @property
    def device_index(self) -> Optional[int]:
        comm = self.comm
        return None if comm is None else comm.device_index

    @property
    def control_group(self) -> "ProcessGroup":
        """The group's ranks over its host control communicator (Gloo): for
        host metadata (numpy arrays, ``broadcast_object``), never for device
        memory. On a Gloo group, the group itself; on an NCCL group a view
        closed with it (no clones or sub-groups of its own)."""
        self._check_alive()
        return self._control if self._control is not None else self

    @property
    def comm(self) -> Optional[_C.Communicator]:
        """The ``_C.Communicator`` (None on non-members)."""
        self._check_alive()
        return self._comm

    @property
    def handle(self) -> Optional[int]:
        """Integer handle of the communicator in the engine's registry, for XLA
        FFI calls inside ``jax.jit`` (registered on first use; None on non-members)."""
        comm = self.comm
        if comm is None:
            return None
        if self._handle is None:
            self._handle = _C.register_communicator(comm)
        return self._handle

    def global_rank(self, group_rank: int) -> int:
        if not 0 <= group_rank < self.size:
            raise ValueError(f"rank {group_rank} is out of range for {self.name} of size {self.size}")
        return self.ranks[group_rank]

    def intra_node_group(self) -> "ProcessGroup":
        """This group's ranks on this process's node (created on first use)."""
        self._check_alive()
        if self._intra is None:
            node = self._ctx.node_of[self._ctx.settings.rank]
            ranks = [r for r in self.ranks if self._ctx.node_of[r] == node]
            self._intra = self._ctx.make_group(f"{self.name}/intra{node}", ranks, self.backend)
        return self._intra

    def inter_node_group(self) -> "ProcessGroup":
        """One rank per node: this group's first rank on each node, i.e. the ranks
        whose local rank equals that of the group's first rank on their node
        (created on first use; a non-member group on the other ranks)."""
        self._check_alive()
        if self._inter is None:
            leaders: Dict[int, int] = {}
            for r in self.ranks:
                leaders.setdefault(self._ctx.node_of[r], r)
            self._inter = self._ctx.make_group(f"{self.name}/inter", sorted(leaders.values()), self.backend)
        return self._inter

    def get_global_communicator(self) -> GroupCommunicator:
        """This group as Bagua 0.9.2's communicator object (``rank()``,
        ``nranks()``; accepted wherever a group is)."""
        return GroupCommunicator(self, "global")

    def get_inter_node_communicator(self) -> GroupCommunicator:
        """:meth:`inter_node_group` as a communicator object (its first call
        is made by every member of this group)."""
        return GroupCommunicator(self.inter_node_group(), "inter")

    def get_intra_node_communicator(self) -> GroupCommunicator:
        """:meth:`intra_node_group` as a communicator object (its first call
        is made by every member of this group)."""
        return GroupCommunicator(self.intra_node_group(), "intra")

    @property
    def store(self) -> Optional[_C.Store]:
        """The job's rendezvous store client (a ``_C.Store``; None in a
        single-process job), e.g. to share small decisions between ranks."""
        return self._ctx.store

    def clone(self) -> "ProcessGroup":
        """A private copy of this group: the same ranks over new communicators,
        connected under the store prefix ``"<name>/clone<k>"`` (its intra- and
        inter-node groups, when used, are new as well). Every member calls it,
        in the same order (the k-th clone of a group has the same name on every
        member); only members connect. Free it with :meth:`close` (also done by
        ``destroy_process_group()``)."""
        self._check_alive()
        with _lock:
            self._clones += 1
            return self._ctx.make_group(f"{self.name}/clone{self._clones}", self.ranks, self.backend)

    @property
    def closed(self) -> bool:
        return self._closed or not self._ctx.alive

    def close(self) -> None:
        """Frees this group's communicators, with their connections and threads,
        and those of its intra- and inter-node groups, after the operation in
        progress. The group becomes unusable. Idempotent. For groups made by
        :meth:`clone` or ``new_group()``; the world group ends with
        ``destroy_process_group()``."""
        if self is self._ctx.world:
            raise ValueError("the world group cannot be closed on its own: call destroy_process_group()")
        with _lock:
            self._close()

    def _check_alive(self) -> None:
        if not self._ctx.alive:
            raise RuntimeError(f"process group '{self.name}' was destroyed (destroy_process_group())")
        if self._closed:
            raise RuntimeError(f"process group '{self.name}' was closed")

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        callbacks, self._on_close = self._on_close, []
        for fn in callbacks:
            fn()
        for sub in (self._intra, self._inter, self._control):
            if sub is not None:
                sub._close()
        if self._handle is not None:
            _C.unregister_communicator(self._handle)
            self._handle = None
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.close()
        if self in self._ctx.groups:
            self._ctx.groups.remove(self)

    def __repr__(self) -> str:
        who = f"rank {self.rank}/{self.size}" if self.is_member else f"non-member, size {self.size}"
        return f"<ProcessGroup '{self.name}' {self.backend} {who} ranks={list(self.ranks)}>"


class _Context(Rendezvous):
    """Everything an initialised process group owns: the rendezvous (the job's
    store, :mod:`bagua_core.rendezvous`) and the groups made over it."""

    def __init__(self, settings: config.Settings, generation: int, separate_control: bool = False):
        super().__init__(settings, generation)
        self.groups: List[ProcessGroup] = []
        self.next_group_id = 1
        self.node_of: List[int] = []
        self.local_of: List[int] = []
        self.alive = True
        self.world: Optional[ProcessGroup] = None
        self.availability: Optional[List[backends.Availability]] = None  # NCCL, per global rank
        # For tests: Gloo groups also get a separate control communicator, as NCCL groups do.
        self.separate_control = separate_control

    def _gloo(self, name: str, g: ProcessGroup):
        return _C.create_gloo_communicator(
            self.store,
            name,
            g.rank,
            g.size,
            self.settings.timeout_s,
            self.hostname,
            self.settings.debug_checks,
            shm=self.settings.shm,
            wire_packing=self.settings.wire_packing or "",
        )

    def make_group(self, name: str, ranks: Sequence[int], backend: str = "gloo") -> ProcessGroup:
        g = ProcessGroup(self, name, ranks, backend)
        if not g.is_member:
            return g
        if backend != "nccl" and not self.separate_control:
            g._comm = self._gloo(name, g)
            return g
        # The control communicator first, under its own prefix; then the data one.
        control = self._gloo(f"{name}/control", g)
        try:
            if backend == "nccl":
                data = _nccl.create_communicator(
                    self.nccl_store(), name, g.rank, g.size, self.settings.local_rank, self.settings.timeout_s
                )
            else:
                data = self._gloo(name, g)
            g._comm = _C.agree_over_control(data, control)
        except BaseException:
            control.close()
            if g in self.groups:
                self.groups.remove(g)
            raise
        g._control = ProcessGroup(self, f"{name}/control", ranks, "gloo", register=False)
        g._control._comm = control
        return g

    def nccl_availability(self) -> List[backends.Availability]:
        """Every rank's answer to "can you run NCCL?" (collective over the job
        on first use; every rank then holds the same list)."""
        if self.availability is None:
            mine = backends.local_availability(self.settings)
            if self.settings.world_size == 1:
                self.availability = [mine]
            else:
                values = self.exchange_then_meet("bagua/nccl_available", mine.encode(), "say whether it can run NCCL")
                self.availability = [backends.Availability.decode(v) for v in values]
        return self.availability

    def choose_world_backend(self) -> str:
        """The world group's backend. Every rank's request must be the same;
        one store exchange carries the requests and (unless Gloo was asked
        for) whether each rank can run NCCL."""
        s = self.settings
        mine = backends.local_availability(s) if s.backend != "gloo" else None
        if s.world_size == 1:
            if mine is not None:
                self.availability = [mine]
        else:
            value = s.backend.encode() + b"|" + (b"-" if mine is None else mine.encode())
            values = self.exchange_then_meet("bagua/backend", value, "choose the backend")
            asked = [v.split(b"|", 1) for v in values]
            for r, (theirs, _) in enumerate(asked):
                if theirs != asked[0][0]:
                    raise config.ConfigError(
                        f"rank {r} asked for backend '{theirs.decode()}' while rank 0 asked for "
                        f"'{asked[0][0].decode()}' (BAGUA_BACKEND or init_process_group(backend=)): every rank "
                        "must ask for the same"
                    )
            if mine is not None:
                self.availability = [backends.Availability.decode(a) for _, a in asked]
        if s.backend == "gloo":
            return "gloo"
        everyone = self.nccl_availability()
        chosen = backends.choose(s.backend, everyone, range(s.world_size), "init_process_group")
        if chosen == "gloo":
            log.logger.info(
                "bagua: backend auto chose Gloo: %s", backends.fallback_reason(everyone, range(s.world_size))
            )
        return chosen

    def exchange_node_identities(self) -> None:
        s = self.settings
        mine = np.array([s.node_rank, s.local_rank], dtype=np.int64)
        everyone = np.empty((s.world_size, 2), dtype=np.int64)
        if s.world_size == 1:
            everyone[0] = mine
        else:
            control = self.world.control_group.comm  # host memory: never on an NCCL communicator
            control.allgather(mine.ctypes.data, everyone.ctypes.data, 2, int(DType.int64))
        self.node_of = [int(n) for n in everyone[:, 0]]
        self.local_of = [int(l) for l in everyone[:, 1]]
        seen: Dict[tuple, int] = {}
        for r, key in enumerate(zip(self.node_of, self.local_of)):
            if key in seen:
                raise RuntimeError(
                    f"ranks {seen[key]} and {r} both claim node {key[0]} local rank {key[1]}: "
                    "check NODE_RANK / LOCAL_RANK"
                )
            seen[key] = r

    def close(self) -> None:
        # Groups first (their callbacks stop engine threads), then the store.
        try:
            for g in list(reversed(self.groups)):
                g._close()
        finally:
            self.alive = False
            self.close_store()


_separate_control = False  # for tests: see _Context.separate_control
_lock = threading.RLock()
_ctx: Optional[_Context] = None
_generation = 0


def init_process_group(
    settings: Optional[config.Settings] = None, backend: Optional[str] = None, *, generation: Optional[int] = None
) -> ProcessGroup:
    """Joins the job described by the environment (or ``settings``) and returns
    the world group. ``backend`` ("auto", "nccl" or "gloo") overrides
    ``BAGUA_BACKEND``; every rank must ask for the same (see the module
    docstring). A repeated call with the same settings returns the same
    group; with different ones it raises ``RuntimeError``. ``generation``:
    the rendezvous generation the ranks agreed on (:mod:`bagua_core.live`;
    default: this process's count of initialisations)."""
    global _ctx, _generation
    settings = config.load() if settings is None else settings
    if backend is not None:
        settings = dataclasses.replace(settings, backend=config.parse_backend("backend", backend))
    with _lock:
        if _ctx is not None:
            if _ctx.settings != settings:
                raise RuntimeError(
                    "init_process_group() was already called with different settings "
                    f"({_ctx.settings} != {settings}); call destroy_process_group() first"
                )
            return _ctx.world
        _generation = _generation + 1 if generation is None else generation
        ctx = _Context(settings, _generation, separate_control=_separate_control)
        try:
            ctx.connect_store()
            ctx.wait_for_everyone()
            ctx.world = ctx.make_group("world", range(settings.world_size), ctx.choose_world_backend())
            ctx.exchange_node_identities()
        except BaseException:
            ctx.close()
            raise
        _ctx = ctx
        log.configure(settings)
        if not settings.launched:
            _say_single_process_once()
        _log_layout(ctx)
        return ctx.world


def _log_layout(ctx: "_Context") -> None:
    s = ctx.settings
    local_sizes = {}
    for node in ctx.node_of:
        local_sizes[node] = local_sizes.get(node, 0) + 1
    log.logger.info(
        "rank %d of %d: %d node(s), ranks per node %s; this is node %d, local rank %d",
        s.rank,
        s.world_size,
        len(local_sizes),
        [local_sizes[n] for n in sorted(local_sizes)],
        s.node_rank,
        s.local_rank,
    )


_said_single_process = False


def _say_single_process_once() -> None:
    global _said_single_process
    if not _said_single_process:
        _said_single_process = True
        log.logger.warning(
            "bagua: no launcher environment (RANK, WORLD_SIZE, ... or Slurm's): this process runs alone, "
            "as a single process; start several with bagua-run or torchrun"
        )


# A process that exits without destroy_process_group() still closes its
# connections cleanly, so its peers do not take it for dead.
atexit.register(lambda: destroy_process_group())


def is_initialized() -> bool:
    """Whether :func:`init_process_group` has run in this process (and
    :func:`destroy_process_group` has not).
    """
    return _ctx is not None


def destroy_process_group() -> None:
    """Closes every communicator (their threads end), the store client and, on
    rank 0, the store server. Groups created before become unusable. A no-op
    when not initialised."""
    global _ctx
    with _lock:
        ctx, _ctx = _ctx, None
        if ctx is not None:
            ctx.close()


def _context() -> _Context:
    ctx = _ctx
    if ctx is None:
        raise RuntimeError(
            "Bagua is not initialised: call bagua_torch.init_process_group() (PyTorch), "
            "bagua_jax.init() (JAX) or bagua_core.init_process_group() first"
        )
    return ctx


def get_default_group() -> ProcessGroup:
    """The world group made by :func:`init_process_group` (every rank of the
    job); the group collectives use when none is passed.
    """
    return _context().world


def group_named(name: str) -> ProcessGroup:
    """The live group called ``name`` (its :attr:`ProcessGroup.name`, e.g.
    ``"world"``, ``"group1"``)."""
    ctx = _context()
    for g in ctx.groups:
        if g.name == name and not g.closed:
            return g
    raise ValueError(f"no process group named {name!r} (live groups: {[g.name for g in ctx.groups]})")


def new_group(ranks: Optional[Sequence[int]] = None, backend: Optional[str] = None) -> ProcessGroup:
    """A group of the given global ranks (default: all). Every rank must call it,
    in the same order, with the same ranks and backend; ranks are validated and
    sorted. ``backend``: "auto" (NCCL when every member can run it), "nccl" or
    "gloo"; default: the world group's. ``ranks=[]`` gives, as in Bagua 0.9.2,
    a group no rank is a member of (collectives on it return at once)."""
    with _lock:
        ctx = _context()
        world = ctx.settings.world_size
        if ranks is None:
            ranks = range(world)
        members = []
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
                raise TypeError(f"new_group: ranks must be integers, got {r!r}")
            if not 0 <= r < world:
                raise ValueError(f"new_group: rank {r} is out of range for world size {world}")
            members.append(int(r))
        requested = config.parse_backend("new_group backend", backend, default=ctx.world.backend)
        if len(set(members)) != len(members):
            raise ValueError(f"new_group: duplicate ranks in {list(ranks)}")
        name = f"group{ctx.next_group_id}"
        ctx.next_group_id += 1
        members.sort()
        if world > 1:
            _agree_on_members(ctx, name, members, requested)
        chosen = (
            "gloo"
            if requested == "gloo" or not members  # no member: no communicator is ever made
            else backends.choose(requested, ctx.nccl_availability(), members, f"new_group ({name})")
        )
        return ctx.make_group(name, members, chosen)


def _agree_on_members(ctx: "_Context", name: str, members: List[int], backend: str) -> None:
    """Every rank of the job compares the member lists (and backends) all
    ranks passed to this ``new_group`` call; on any difference every rank
    raises ``MismatchError`` naming a rank whose call differs from rank 0's."""
    lists = ctx.exchange(f"{name}/members", (",".join(map(str, members)) + "|" + backend).encode(), "call new_group()")
    for r, theirs in enumerate(lists):
        if theirs != lists[0]:
            ours_ranks, ours_backend = lists[0].decode().split("|")
            their_ranks, their_backend = theirs.decode().split("|")
            if their_ranks != ours_ranks:
                raise _C.MismatchError(
                    f"new_group ({name}): rank {r} passed ranks [{their_ranks}] while rank 0 passed "
                    f"[{ours_ranks}]; every rank must call new_group() with the same ranks, in the same order"
                )
            raise _C.MismatchError(
                f"new_group ({name}): rank {r} asked for backend '{their_backend}' while rank 0 asked for "
                f"'{ours_backend}'; every rank must call new_group() with the same backend"
            )


def _settings() -> config.Settings:
    ctx = _ctx
    return ctx.settings if ctx is not None else config.load()


def get_rank() -> int:
    """Global rank (from the environment when not initialised)."""
    return _settings().rank


def get_world_size() -> int:
    """Number of processes in the job (from the environment when not initialised)."""
    return _settings().world_size


def get_local_rank() -> int:
    """Rank of this process on its node (``LOCAL_RANK``)."""
    return _settings().local_rank


def get_local_world_size() -> int:
    """Number of processes on this node (``LOCAL_WORLD_SIZE``)."""
    return _settings().local_world_size


def get_node_rank() -> int:
    """Index of this node in the job (``NODE_RANK`` or ``GROUP_RANK``; default
    ``RANK // LOCAL_WORLD_SIZE``).
    """
    return _settings().node_rank
