"""Which communicator a collective uses: the process group, seen from JAX.

A collective needs, at trace time, the engine handle of the group's
communicator (a static attribute of the FFI call), the group's size (output
shapes), this process's rank in it (autodiff rules) and the platform its
memory lives on (to reject arrays on another device with a clear error).

CUDA arrays on a Gloo group travel through host memory: their lowering passes
the handle of the group's communicator staged on this process's GPU
(``bagua_core.devices``; a warning once), made on first use.
"""

from __future__ import annotations

import atexit
from typing import TYPE_CHECKING, Any, Dict, NamedTuple, Optional, Sequence, Tuple, Union

import jax

import bagua_core
from bagua_core import devices
from bagua_core._loader import _C
from bagua_core.log import logger
from bagua_jax import _compat
from bagua_jax._src.distributed import settings_from_jax

if TYPE_CHECKING:
    from bagua_core.config import Settings
    from bagua_core.process_group import ProcessGroup

_groups: Dict[int, Any] = {}  # communicator handle -> its ProcessGroup (for staging)
_staged: Dict[Tuple[int, int], int] = {}  # (handle, CUDA index) -> the staged communicator's handle


class GroupInfo(NamedTuple):
    handle: int
    size: int
    rank: int
    platform: str  # "cpu" or "cuda", as JAX names lowering platforms


class GroupNotInitializedError(RuntimeError):
    """A collective was called before bagua_jax.init_process_group() (or with no group)."""


def init_process_group(settings: Optional[Settings] = None) -> ProcessGroup:
    """Initialises Bagua's default process group and returns it.

    Reads torchrun's environment contract (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, ...; see ``bagua_core.config``), as ``bagua_torch`` does,
    unless ``settings`` (a ``bagua_core.config.Settings``) is given. After
    ``jax.distributed.initialize()``, the rank and world size are JAX's
    process index and count (see ``bagua_jax._src.distributed``).
    Idempotent: a second call returns the existing default group.
    """
    if bagua_core.is_initialized():
        return bagua_core.get_default_group()
    if settings is None:
        settings = settings_from_jax()
    return bagua_core.init_process_group(settings)


init = init_process_group  # the earlier name


def _drain_pending_collectives() -> None:
    """At exit, lets the collectives still queued in XLA finish before the
    group closes: registered after bagua_core's teardown, it runs before it."""
    if not bagua_core.is_initialized():
        return
    try:
        jax.effects_barrier()
    except jax.errors.JaxRuntimeError as e:  # a collective failed and nobody read its result
        logger.warning("bagua_jax: a collective still pending at exit failed: %s", e)


atexit.register(_drain_pending_collectives)


def process_group(group: Optional[ProcessGroup], what: str = "bagua_jax") -> ProcessGroup:
    """The ``bagua_core`` process group to use: ``group``, or the default one."""
    if group is None:
        if not bagua_core.is_initialized():
            raise GroupNotInitializedError(
                f"{what}: no process group; call bagua_jax.init_process_group() first (or pass a group)"
            )
        group = bagua_core.get_default_group()
    if not isinstance(group, bagua_core.ProcessGroup):
        raise TypeError(f"{what}: the group must be a bagua_core process group, got {type(group).__name__}")
    if not group.is_member:
        raise ValueError(f"{what}: this process (rank {bagua_core.get_rank()}) is not a member of {group!r}")
    return group


def _platform_of(group: Any) -> str:
    return "cuda" if str(group.device_type).lower() == "cuda" else "cpu"


def resolve(group: Union[ProcessGroup, GroupInfo, None]) -> GroupInfo:
    if isinstance(group, GroupInfo):
        return group
    group = process_group(group)
    # The handle is read when tracing: a jitted function keeps using this
    # communicator; after destroy_process_group() it fails with a clear error.
    return GroupInfo(handle_of(group), group.size, group.rank, _platform_of(group))


def handle_of(group: Any) -> int:
    """The engine handle of ``group``'s communicator (remembered for staging)."""
    handle = int(group.handle)
    _groups[handle] = group
    return handle


def _is_cuda(platform: str) -> bool:
    return platform in ("cuda", "gpu")


def handle_for(handle: int, platforms: Sequence[str], group_platform: str) -> int:
    """The communicator handle a lowering for ``platforms`` passes: ``handle``
    itself, or for CUDA arrays on a Gloo group (``group_platform`` "cpu") its
    staged communicator."""
    if handle < 0 or group_platform != "cpu" or not any(_is_cuda(p) for p in platforms):
        return handle
    return staged_handle(handle)


def staged_handle(handle: int, what: str = "bagua_jax") -> int:
    """The handle of the Gloo communicator ``handle`` staged on this process's
    first GPU (made on first use). ValueError when it cannot be: a group this
    process did not make, no visible GPU."""
    group = _groups.get(handle)
    if group is None:
        raise ValueError(
            f"{what}: the array is on cuda but the process group communicates cpu memory, and "
            "this process did not make that group: use a group of bagua_core"
        )
    try:
        index = _compat.cuda_device_index()
        devices.check_group_serves(group, "cuda", f"{what}: the array", index)
    except (RuntimeError, ValueError) as e:
        raise ValueError(
            f"{what}: the array is on cuda but the process group communicates cpu memory, and it cannot be staged: {e}"
        ) from None
    key = (handle, index)
    if key not in _staged:
        _staged[key] = int(_C.register_communicator(devices.staged(group.comm, devices.cuda(index))))
    return _staged[key]
