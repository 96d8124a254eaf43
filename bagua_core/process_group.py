"""Process groups: which processes talk to each other, over which communicator.

``init_process_group()`` reads the environment through :mod:`bagua_core.config`
(torchrun's contract), starts the rendezvous store (``_C.TcpStoreServer`` on
``MASTER_ADDR``:store port, hosted by rank 0; none for a single process) and
connects the world group's Gloo communicator. Calling it again with the same settings returns the existing
world group; with different settings it raises ``RuntimeError``
(``destroy_process_group()`` first).

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
import ipaddress
import socket
import threading
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from bagua_core import _nccl, backend as backends, config, log
from bagua_core._loader import _C
from bagua_core.dtypes import DType
from bagua_core.errors import BaguaError
from bagua_core.group_communicator import GroupCommunicator

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
            log.logger.warning("bagua: rank %d is waiting for %s; timeout in %.0f s (BAGUA_TIMEOUT)",
                               self._rank, what, max(0.0, self._deadline - now))


class ProcessGroup:
    """A set of ranks with a communicator.

    Attributes: ``name`` (its store prefix), ``ranks`` (sorted global ranks),
    ``size``, ``rank`` (this process's rank in the group, -1 when not a member),
    ``is_member``, ``backend`` ("nccl" or "gloo"), ``device_type`` ("cuda" on
    NCCL, "cpu" on Gloo), ``device_index`` (the CUDA device of an NCCL group:
    ``LOCAL_RANK``; None on Gloo and on non-members), ``control_group``.
    """

    def __init__(self, ctx: "_Context", name: str, ranks: Sequence[int], backend: str = "gloo",
                 register: bool = True):
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


class _Context:
    """Everything an initialised process group owns."""

    def __init__(self, settings: config.Settings, generation: int):
        self.settings = settings
        self.generation = generation
        self.hostname = settings.hostname or _local_address(settings.master_addr)
        self.server = None
        self.store = None
        self.groups: List[ProcessGroup] = []
        self.next_group_id = 1
        self.node_of: List[int] = []
        self.local_of: List[int] = []
        self.alive = True
        self.world: Optional[ProcessGroup] = None
        self.availability: Optional[List[backends.Availability]] = None  # NCCL, per global rank
        self.local_server = None  # a single process's store for NCCL's unique id
        self.local_store = None
        # For tests: Gloo groups also get a separate control communicator, as NCCL groups do.
        self.separate_control = _separate_control

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
        waiting = _WaitNotice(f"rank 0's rendezvous store at {s.master_addr}:{s.store_port} (is rank 0 running, "
                              "with the same MASTER_ADDR and MASTER_PORT?)", s.rank, deadline)
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
                store = _C.TcpStore(s.master_addr, s.store_port, s.rank, s.timeout_s, s.store_secret,
                                    connect_timeout_s=attempt)
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
                        "be started with the same WORLD_SIZE")
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
                    raise _C.PeerError(f"{_ranks_str(dead)} {'has' if one else 'have'} died before "
                                       f"{'it' if one else 'they'} could {what} {where}")
            if waiting is None:
                waiting = _WaitNotice(lambda: f"{_ranks_str(self._missing(keys))} to {what} {where}", s.rank, deadline)
            if time.monotonic() >= deadline:
                raise _C.CommTimeoutError(f"{_ranks_str(self._missing(keys))} did not {what} within {s.timeout_s} s "
                                          f"{where}")
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

    def _gloo(self, name: str, g: ProcessGroup):
        return _C.create_gloo_communicator(
            self.store, name, g.rank, g.size, self.settings.timeout_s, self.hostname,
            self.settings.debug_checks, shm=self.settings.shm, wire_packing=self.settings.wire_packing or "",
        )

    def nccl_store(self):
        """The store NCCL's unique ids go through: the job's, or for a single
        process a private one on loopback."""
        if self.store is not None:
            return self.store
        if self.local_store is None:
            self.local_server = _C.TcpStoreServer("127.0.0.1", 0)
            self.local_store = _C.TcpStore("127.0.0.1", self.local_server.port, 0, self.settings.timeout_s)
        return self.local_store

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
                data = _nccl.create_communicator(self.nccl_store(), name, g.rank, g.size,
                                                 self.settings.local_rank, self.settings.timeout_s)
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
                values = self.exchange_then_meet("bagua/nccl_available", mine.encode(),
                                                "say whether it can run NCCL")
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
                        "must ask for the same")
            if mine is not None:
                self.availability = [backends.Availability.decode(a) for _, a in asked]
        if s.backend == "gloo":
            return "gloo"
        everyone = self.nccl_availability()
        chosen = backends.choose(s.backend, everyone, range(s.world_size), "init_process_group")
        if chosen == "gloo":
            log.logger.info("bagua: backend auto chose Gloo: %s", backends.fallback_reason(everyone, range(s.world_size)))
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
        "for single-node jobs).", RuntimeWarning, stacklevel=3)


_warned_secret = False
_separate_control = False  # for tests: see _Context.separate_control
_lock = threading.RLock()
_ctx: Optional[_Context] = None
_generation = 0


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


def init_process_group(settings: Optional[config.Settings] = None, backend: Optional[str] = None) -> ProcessGroup:
    """Joins the job described by the environment (or ``settings``) and returns
    the world group. ``backend`` ("auto", "nccl" or "gloo") overrides
    ``BAGUA_BACKEND``; every rank must ask for the same (see the module
    docstring). A repeated call with the same settings returns the same
    group; with different ones it raises ``RuntimeError``."""
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
        _generation += 1
        ctx = _Context(settings, _generation)
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
    log.logger.info("rank %d of %d: %d node(s), ranks per node %s; this is node %d, local rank %d",
                    s.rank, s.world_size, len(local_sizes), [local_sizes[n] for n in sorted(local_sizes)],
                    s.node_rank, s.local_rank)


_said_single_process = False


def _say_single_process_once() -> None:
    global _said_single_process
    if not _said_single_process:
        _said_single_process = True
        log.logger.warning(
            "bagua: no launcher environment (RANK, WORLD_SIZE, ... or Slurm's): this process runs alone, "
            "as a single process; start several with bagua-run or torchrun")


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
        raise RuntimeError("Bagua is not initialised: call bagua_torch.init_process_group() (PyTorch), "
                           "bagua_jax.init() (JAX) or bagua_core.init_process_group() first")
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
    "gloo"; default: the world group's."""
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
        if not members:
            raise ValueError("new_group: ranks is empty")
        requested = config.parse_backend("new_group backend", backend, default=ctx.world.backend)
        if len(set(members)) != len(members):
            raise ValueError(f"new_group: duplicate ranks in {list(ranks)}")
        name = f"group{ctx.next_group_id}"
        ctx.next_group_id += 1
        members.sort()
        if world > 1:
            _agree_on_members(ctx, name, members, requested)
        chosen = "gloo" if requested == "gloo" else backends.choose(
            requested, ctx.nccl_availability(), members, f"new_group ({name})")
        return ctx.make_group(name, members, chosen)


def _agree_on_members(ctx: "_Context", name: str, members: List[int], backend: str) -> None:
    """Every rank of the job compares the member lists (and backends) all
    ranks passed to this ``new_group`` call; on any difference every rank
    raises ``MismatchError`` naming a rank whose call differs from rank 0's."""
    lists = ctx.exchange(f"{name}/members", (",".join(map(str, members)) + "|" + backend).encode(),
                         "call new_group()")
    for r, theirs in enumerate(lists):
        if theirs != lists[0]:
            ours_ranks, ours_backend = lists[0].decode().split("|")
            their_ranks, their_backend = theirs.decode().split("|")
            if their_ranks != ours_ranks:
                raise _C.MismatchError(
                    f"new_group ({name}): rank {r} passed ranks [{their_ranks}] while rank 0 passed "
                    f"[{ours_ranks}]; every rank must call new_group() with the same ranks, in the same order")
            raise _C.MismatchError(
                f"new_group ({name}): rank {r} asked for backend '{their_backend}' while rank 0 asked for "
                f"'{ours_backend}'; every rank must call new_group() with the same backend")


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
