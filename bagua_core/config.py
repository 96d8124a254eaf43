"""The one place that reads Bagua's environment and settings.

Environment contract (torchrun's): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and optionally
``NODE_RANK`` (or ``GROUP_RANK``). When ``RANK`` is absent, Slurm's variables
(``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ...)
are read instead. With neither, the process runs alone (world size 1).

Settings (all optional):

``BAGUA_TIMEOUT``
    seconds every blocking call may take (default 600: a
    first jitted step can compile for minutes)
``BAGUA_STORE_PORT``
    port of the rendezvous store on ``MASTER_ADDR``
    (default ``MASTER_PORT + 1``, so it never clashes with
    torchrun's own store on ``MASTER_PORT``). Alias:
    ``BAGUA_SERVICE_PORT`` (Bagua 0.9's one extra port on
    the master; values <= 0 mean the default, as there)
``BAGUA_HOSTNAME``
    address this process listens on for its peers (default:
    the local address that routes to ``MASTER_ADDR``)
``BAGUA_DEBUG_CHECKS``
    also check send/recv pairs and collective sequence
    numbers across ranks (default off; Gloo groups
    always check that collectives agree on op, dtype,
    count and root; costs one small allgather per
    collective and a round trip per send/recv)
``BAGUA_SHM``
    when every rank of a group runs on this host (same
    kernel, network/IPC/mount namespaces and user),
    CPU allreduces go through POSIX shared memory
    instead of TCP (default on); 0 keeps them on TCP.
    Every rank must set the same value, or the group
    stays on TCP
``BAGUA_BACKEND``
    communicator of process groups: ``auto`` (default:
    NCCL when this build has CUDA, every rank sees a
    CUDA device for its ``LOCAL_RANK`` and finds an NCCL
    library; Gloo otherwise), ``nccl`` (an error on every
    rank when one of them cannot) or ``gloo``. The
    ``backend`` argument of ``init_process_group()`` /
    ``new_group()`` overrides it. Must be the same on
    every rank
``BAGUA_NCCL_LIBRARY``
    full path of ``libnccl.so.2`` (or its directory);
    used when torch has not loaded an NCCL in this
    process already, before the ``nvidia-nccl`` wheel
    (see :mod:`bagua_core._nccl`); NCCL >= 2.14, major
    version 2
``BAGUA_LOG_LEVEL``
    level of the ``bagua`` logger: DEBUG, INFO, WARNING,
    ERROR or CRITICAL (default: as the application set it;
    see :mod:`bagua_core.log`)
``BAGUA_BUCKET_SIZE``
    bytes of gradients (or weights) per bucket of the
    default bucket plan (default 10 MiB = 10485760);
    smaller buckets start communicating earlier in
    backward, larger ones make fewer, bigger calls.
    Alias: ``BAGUA_DEFAULT_BUCKET_SIZE`` (Bagua 0.9's name)
``BAGUA_STORE_SECRET``
    the job's secret: a rendezvous store client must
    prove it holds it (HMAC-SHA256 challenge) before
    anything else. ``bagua-run`` makes one for
    single-node jobs; multi-node jobs (and torchrun) set
    the same value on every node. Unset: any client that
    reaches the store is accepted (a warning on
    multi-node jobs)
``BAGUA_STORE_MAX_VALUE_BYTES``
    largest value one store SET may hold
    (default 64 MiB)
``BAGUA_STORE_MAX_BYTES``
    total bytes of keys and values the store holds
    (default 256 MiB)
``BAGUA_STORE_IDLE_TIMEOUT``
    seconds an authenticated store connection may stay
    silent outside a blocking request before the store
    closes it (default 60; ranks ping theirs well within it)
``BAGUA_TRACE``
    path of a Chrome trace (Perfetto) of the engine's
    per-bucket timings; each rank writes
    ``<stem>.rank<r><suffix>`` (see :mod:`bagua_core.trace`).
    Unset: no trace, no clock reads
``BAGUA_WIRE_PACKING``
    ``auto``, ``on`` or ``off``: whether large float32
    SUM/AVG allreduces over Gloo may send their bytes
    top-byte packed (lossless, about 12% fewer bytes).
    ``auto`` (default) packs once every rank has measured
    the link under 2 Gbit/s; ``on`` always packs;
    ``off`` keeps Gloo's ring. Must be the same on every
    rank
``BAGUA_ENGINE_LANES``
    comm threads of each wrapped model's engine, each on its
    own clone of the group; consecutive buckets alternate
    between them, so one computes while the other's bytes
    travel (default: 2 on Gloo groups, 1 on NCCL groups:
    NCCL kernels of two communicators launched at once can
    wait for each other on the device; see
    :func:`engine_lanes_for`)
``BAGUA_LIGHTHOUSE``
    ``HOST:PORT`` of torchft's Lighthouse, the quorum
    service of per-step fault tolerance
    (:mod:`bagua_core.live`). Alias: ``TORCHFT_LIGHTHOUSE``
``BAGUA_AUTOTUNE``
    autotune level: >= 1 tunes the bucket size and order
    online (see :mod:`bagua_core.autotune`); default 0
``BAGUA_AUTOTUNE_MAX_SAMPLES``
    plans measured before the best one is kept (default 60)
``BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S``
    seconds each plan is measured (default 5.0)
``BAGUA_AUTOTUNE_WARMUP_TIME_S``
    seconds of training before the first measurement
    (default 30.0)
``BAGUA_AUTOTUNE_INTERVAL_STEPS``
    steps between two autotune decisions, where every
    rank meets rank 0's decision in the store (default
    100, Bagua 0.9's cycle)
``BAGUA_AUTOTUNE_CONFIRM_PAIRS``
    after the search, the best plan and the default are
    measured this many times each, alternately; the
    best replaces the default only if its gain over
    these pairs exceeds their noise (default 5, >= 2)
``BAGUA_IS_OUTPUT_AUTOTUNE_LOG``
    rank 0 writes each measured plan to
    ``$TMPDIR/bagua_autotune_<model>.log`` (CSV; default off)

Settings of ``baguarun`` (the multi-host launcher, :func:`ssh_settings`):

``BAGUA_NODE_DOMAIN_NAMES``
    default of ``--host_list``: ``host[:sshport],...``
``BAGUA_SSH_PORT``
    default of ``--ssh_port``
``BAGUA_SSH_COMMAND``
    the ssh client and its options, split like a shell
    command line (default ``ssh``), e.g. ``ssh -i
    ~/.ssh/cluster_key -o BatchMode=yes``

An alias is read when its new name is absent; both set to different values
raise :class:`ConfigError`.

Booleans accept 1/0, true/false, yes/no, on/off (any case).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from typing import Mapping, Optional

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
DEFAULT_BUCKET_SIZE = 10 * 1024 * 1024
MAX_TIMEOUT_S = 365 * 24 * 3600.0  # a year: "forever", yet finite for deadline arithmetic
STORE_SECRET_ENV = "BAGUA_STORE_SECRET"


class ConfigError(ValueError):
    """A setting or environment variable has a value Bagua cannot use."""


def parse_bool(name: str, value: Optional[str], default: bool) -> bool:
    if value is None:
        return default
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def parse_int(name: str, value: Optional[str], default: Optional[int], minimum: Optional[int] = None) -> Optional[int]:
    if value is None or value.strip() == "":
        return default
    try:
        n = int(value.strip())
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer") from None
    if minimum is not None and n < minimum:
        raise ConfigError(f"{name}={n} must be >= {minimum}")
    return n


def parse_float(
    name: str, value: Optional[str], default: float, minimum: float = 0.0, maximum: Optional[float] = None
) -> float:
    if value is None or value.strip() == "":
        return default
    try:
        x = float(value.strip())
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number") from None
    if not x > minimum:
        raise ConfigError(f"{name}={x} must be > {minimum}")
    if maximum is not None and not x <= maximum:
        raise ConfigError(f"{name}={value.strip()} must be at most {maximum:g}")
    return x


def _optional_float(name: str, value: Optional[str], maximum: float) -> Optional[float]:
    """A positive number of seconds, or None when unset (the engine's default applies)."""
    if value is None or value.strip() == "":
        return None
    return parse_float(name, value, 0.0, maximum=maximum)


# new name -> the Bagua 0.9 name it also accepts
ALIASES = {
    "BAGUA_STORE_PORT": "BAGUA_SERVICE_PORT",
    "BAGUA_BUCKET_SIZE": "BAGUA_DEFAULT_BUCKET_SIZE",
}


def _aliased(env: Mapping[str, str], name: str) -> tuple:
    """(name actually used, its value) for a setting with a Bagua 0.9 alias."""
    old = ALIASES[name]
    new_value, old_value = env.get(name), env.get(old)
    if name == "BAGUA_STORE_PORT" and old_value is not None:
        # Bagua 0.9 launchers set BAGUA_SERVICE_PORT <= 0 for "choose one": our default.
        try:
            if int(old_value.strip()) <= 0:
                old_value = None
        except ValueError:
            pass  # reported by the parser below, under its name
    if new_value is not None and old_value is not None and new_value.strip() != old_value.strip():
        raise ConfigError(f"{name}={new_value!r} and its alias {old}={old_value!r} disagree: set one of them")
    return (name, new_value) if new_value is not None else (old, old_value)


def _slurm_tasks_per_node(value: Optional[str]) -> Optional[int]:
    # "4(x2),3" -> 4 : the count on this job's first node group.
    if not value:
        return None
    m = re.match(r"(\d+)", value)
    return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True)
class Settings:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    store_port: int
    timeout_s: float
    hostname: Optional[str]
    debug_checks: bool
    nccl_library: Optional[str]
    shm: bool = True
    bucket_size: int = DEFAULT_BUCKET_SIZE
    store_secret: str = ""
    store_max_value_bytes: Optional[int] = None  # None: the store's own default
    store_max_bytes: Optional[int] = None
    store_idle_timeout_s: Optional[float] = None
    launched: bool = True  # False: neither a launcher's nor Slurm's variables were found
    log_level: Optional[str] = None
    trace_path: Optional[str] = None
    autotune_level: int = 0
    autotune_max_samples: int = 60
    autotune_sampling_confidence_time_s: float = 5.0
    autotune_warmup_time_s: float = 30.0
    autotune_interval_steps: int = 100
    autotune_confirm_pairs: int = 5
    autotune_log: bool = False
    wire_packing: Optional[str] = None  # None: the engine's default (auto)
    engine_lanes: Optional[int] = None  # None: by device (Engine.for_group)
    backend: str = "auto"  # BACKENDS; resolved per job by bagua_core.backend
    lighthouse: Optional[str] = None  # per-step fault tolerance's quorum service (bagua_core.live)

    @property
    def store_limits(self) -> dict:
        """Keyword arguments of the store server for the limits that are set."""
        out = {}
        if self.store_max_value_bytes is not None:
            out["max_value_bytes"] = self.store_max_value_bytes
        if self.store_max_bytes is not None:
            out["max_total_bytes"] = self.store_max_bytes
        if self.store_idle_timeout_s is not None:
            out["idle_timeout_s"] = self.store_idle_timeout_s
        return out

    @property
    def jax_coordinator_address(self) -> str:
        """Where JAX's coordinator listens when the workers call
        ``jax.distributed.initialize()`` (bagua_jax): ``MASTER_ADDR:MASTER_PORT + 2``,
        beside torchrun's store (``MASTER_PORT``) and Bagua's (``MASTER_PORT + 1``)."""
        return f"{self.master_addr}:{self.master_port + 2}"

    @property
    def num_nodes(self) -> int:
        return (self.world_size + self.local_world_size - 1) // self.local_world_size


def lighthouse_address(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``BAGUA_LIGHTHOUSE`` (or torchft's ``TORCHFT_LIGHTHOUSE``): set when the
    job runs with per-step fault tolerance (:mod:`bagua_core.live`)."""
    env = os.environ if env is None else env
    return (env.get("BAGUA_LIGHTHOUSE") or env.get("TORCHFT_LIGHTHOUSE") or "").strip() or None


def load(env: Optional[Mapping[str, str]] = None) -> Settings:
    """Reads the settings from ``env`` (default ``os.environ``) and validates them."""
    env = os.environ if env is None else env
    g = env.get

    if g("RANK") is not None:
        rank = parse_int("RANK", g("RANK"), 0, minimum=0)
        world_size = parse_int("WORLD_SIZE", g("WORLD_SIZE"), None, minimum=1)
        if world_size is None:
            raise ConfigError("RANK is set but WORLD_SIZE is not")
        local_rank = parse_int("LOCAL_RANK", g("LOCAL_RANK"), rank, minimum=0)
        local_world_size = parse_int("LOCAL_WORLD_SIZE", g("LOCAL_WORLD_SIZE"), world_size, minimum=1)
        node_rank = parse_int("NODE_RANK", g("NODE_RANK") or g("GROUP_RANK"), None, minimum=0)
    elif g("SLURM_PROCID") is not None:
        rank = parse_int("SLURM_PROCID", g("SLURM_PROCID"), 0, minimum=0)
        world_size = parse_int("SLURM_NTASKS", g("SLURM_NTASKS"), 1, minimum=1)
        local_rank = parse_int("SLURM_LOCALID", g("SLURM_LOCALID"), 0, minimum=0)
        local_world_size = _slurm_tasks_per_node(g("SLURM_NTASKS_PER_NODE") or g("SLURM_TASKS_PER_NODE")) or world_size
        node_rank = parse_int("SLURM_NODEID", g("SLURM_NODEID"), None, minimum=0)
    else:
        rank, world_size, local_rank, local_world_size, node_rank = 0, 1, 0, 1, 0
    launched = g("RANK") is not None or g("SLURM_PROCID") is not None

    if rank >= world_size:
        raise ConfigError(f"rank {rank} is out of range for world size {world_size}")
    if local_world_size > world_size:
        raise ConfigError(f"LOCAL_WORLD_SIZE={local_world_size} exceeds WORLD_SIZE={world_size}")
    if local_rank >= local_world_size:
        raise ConfigError(f"LOCAL_RANK={local_rank} is out of range for LOCAL_WORLD_SIZE={local_world_size}")
    if node_rank is None:
        node_rank = rank // local_world_size

    master_addr = g("MASTER_ADDR") or DEFAULT_MASTER_ADDR
    master_port = parse_int("MASTER_PORT", g("MASTER_PORT"), DEFAULT_MASTER_PORT, minimum=1)
    store_port = parse_int(*_aliased(env, "BAGUA_STORE_PORT"), master_port + 1, minimum=1)
    if master_port > 65535 or store_port > 65535:
        raise ConfigError(f"port out of range: MASTER_PORT={master_port}, store port={store_port}")

    return Settings(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        store_port=store_port,
        timeout_s=parse_float("BAGUA_TIMEOUT", g("BAGUA_TIMEOUT"), DEFAULT_TIMEOUT_S, maximum=MAX_TIMEOUT_S),
        hostname=g("BAGUA_HOSTNAME") or None,
        debug_checks=parse_bool("BAGUA_DEBUG_CHECKS", g("BAGUA_DEBUG_CHECKS"), False),
        nccl_library=g("BAGUA_NCCL_LIBRARY") or None,
        shm=parse_bool("BAGUA_SHM", g("BAGUA_SHM"), True),
        bucket_size=parse_int(*_aliased(env, "BAGUA_BUCKET_SIZE"), DEFAULT_BUCKET_SIZE, minimum=1),
        store_secret=g(STORE_SECRET_ENV) or "",
        store_max_value_bytes=parse_int(
            "BAGUA_STORE_MAX_VALUE_BYTES", g("BAGUA_STORE_MAX_VALUE_BYTES"), None, minimum=1
        ),
        store_max_bytes=parse_int("BAGUA_STORE_MAX_BYTES", g("BAGUA_STORE_MAX_BYTES"), None, minimum=1),
        store_idle_timeout_s=_optional_float(
            "BAGUA_STORE_IDLE_TIMEOUT", g("BAGUA_STORE_IDLE_TIMEOUT"), maximum=MAX_TIMEOUT_S
        ),
        launched=launched,
        log_level=_log_level(g("BAGUA_LOG_LEVEL")),
        trace_path=g("BAGUA_TRACE") or None,
        autotune_level=parse_int("BAGUA_AUTOTUNE", g("BAGUA_AUTOTUNE"), 0, minimum=0),
        autotune_max_samples=parse_int("BAGUA_AUTOTUNE_MAX_SAMPLES", g("BAGUA_AUTOTUNE_MAX_SAMPLES"), 60, minimum=1),
        autotune_sampling_confidence_time_s=_seconds(
            "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S", g("BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S"), 5.0
        ),
        autotune_warmup_time_s=_seconds("BAGUA_AUTOTUNE_WARMUP_TIME_S", g("BAGUA_AUTOTUNE_WARMUP_TIME_S"), 30.0),
        autotune_interval_steps=parse_int(
            "BAGUA_AUTOTUNE_INTERVAL_STEPS", g("BAGUA_AUTOTUNE_INTERVAL_STEPS"), 100, minimum=1
        ),
        autotune_confirm_pairs=parse_int(
            "BAGUA_AUTOTUNE_CONFIRM_PAIRS", g("BAGUA_AUTOTUNE_CONFIRM_PAIRS"), 5, minimum=2
        ),
        autotune_log=parse_bool("BAGUA_IS_OUTPUT_AUTOTUNE_LOG", g("BAGUA_IS_OUTPUT_AUTOTUNE_LOG"), False),
        wire_packing=_wire_packing(g("BAGUA_WIRE_PACKING")),
        engine_lanes=parse_int("BAGUA_ENGINE_LANES", g("BAGUA_ENGINE_LANES"), None, minimum=1),
        backend=parse_backend("BAGUA_BACKEND", g("BAGUA_BACKEND")),
        lighthouse=lighthouse_address(env),
    )


BACKENDS = ("auto", "nccl", "gloo")


def parse_backend(name: str, value: Optional[str], default: str = "auto") -> str:
    """``auto``, ``nccl`` or ``gloo`` (any case; unset or empty: ``default``).
    ``name`` says where the value came from, for the error message."""
    if value is None or value.strip() == "":
        return default
    v = value.strip().lower()
    if v not in BACKENDS:
        raise ConfigError(f"{name} must be one of {', '.join(BACKENDS)}, got {value!r}")
    return v


def engine_lanes_for(settings: Settings, backend: str) -> int:
    """Comm lanes of an engine on a group of ``backend`` ("nccl" or "gloo"):
    ``BAGUA_ENGINE_LANES`` when set, else 1 on NCCL (two NCCL communicators
    launched concurrently can deadlock on the device) and 2 on Gloo."""
    if settings.engine_lanes is not None:
        return settings.engine_lanes
    return 1 if backend == "nccl" else 2


WIRE_PACKING_MODES = ("auto", "on", "off")


def _wire_packing(value: Optional[str]) -> Optional[str]:
    if value is None or value.strip() == "":
        return None
    v = value.strip().lower()
    if v not in WIRE_PACKING_MODES:
        raise ConfigError(f"BAGUA_WIRE_PACKING must be one of {', '.join(WIRE_PACKING_MODES)}, got {value!r}")
    return v


def _seconds(name: str, value: Optional[str], default: float) -> float:
    """A duration >= 0 (0: no waiting)."""
    x = parse_float(name, value, default, minimum=float("-inf"), maximum=MAX_TIMEOUT_S)
    if not x >= 0:
        raise ConfigError(f"{name}={x} must be >= 0")
    return x


@dataclasses.dataclass(frozen=True)
class SshSettings:
    host_list: Optional[str]  # "host[:port],..." or None
    ssh_port: Optional[int]
    ssh_command: tuple  # argv of the ssh client


def ssh_settings(env: Optional[Mapping[str, str]] = None) -> SshSettings:
    """``baguarun``'s settings from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    command = tuple(shlex.split(env.get("BAGUA_SSH_COMMAND") or "ssh"))
    if not command:
        raise ConfigError("BAGUA_SSH_COMMAND is empty")
    port = parse_int("BAGUA_SSH_PORT", env.get("BAGUA_SSH_PORT") or None, None, minimum=1)
    if port is not None and port > 65535:
        raise ConfigError(f"BAGUA_SSH_PORT={port} is not a port number")
    return SshSettings(host_list=env.get("BAGUA_NODE_DOMAIN_NAMES") or None, ssh_port=port, ssh_command=command)


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(value: Optional[str]) -> Optional[str]:
    if value is None or not value.strip():
        return None
    level = value.strip().upper()
    if level not in _LOG_LEVELS:
        raise ConfigError(f"BAGUA_LOG_LEVEL={value!r} is not one of {', '.join(_LOG_LEVELS)}")
    return level
