"""Which communicator a collective uses: the process group, seen from JAX.

A collective needs, at trace time, the engine handle of the group's
communicator (a static attribute of the FFI call), the group's size (output
shapes), this process's rank in it (autodiff rules) and the platform its
memory lives on (to reject arrays on another device with a clear error).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import bagua_core


class GroupInfo(NamedTuple):
    handle: int
    size: int
    rank: int
    platform: str  # "cpu" or "cuda", as JAX names lowering platforms


class GroupNotInitializedError(RuntimeError):
    """A collective was called before bagua_jax.init_process_group() (or with no group)."""


def init_process_group(settings: Optional[Any] = None) -> Any:
    """Initialises Bagua's default process group and returns it.

    Reads torchrun's environment contract (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, ...; see ``bagua_core.config``), as ``bagua_torch`` does,
    unless ``settings`` (a ``bagua_core.config.Settings``) is given.
    Idempotent: a second call returns the existing default group.
    """
    if bagua_core.is_initialized():
        return bagua_core.get_default_group()
    return bagua_core.init_process_group(settings)


init = init_process_group  # the earlier name


def process_group(group: Optional[Any], what: str = "bagua_jax") -> Any:
    """The ``bagua_core`` process group to use: ``group``, or the default one."""
    if group is None:
        if not bagua_core.is_initialized():
            raise GroupNotInitializedError(
                f"{what}: no process group; call bagua_jax.init_process_group() first "
                "(or pass a group)")
        group = bagua_core.get_default_group()
    if not isinstance(group, bagua_core.ProcessGroup):
        raise TypeError(f"{what}: the group must be a bagua_core process group, got {type(group).__name__}")
    if not group.is_member:
        raise ValueError(f"{what}: this process (rank {bagua_core.get_rank()}) is not a "
                         f"member of {group!r}")
    return group


def _platform_of(group: Any) -> str:
    return "cuda" if str(group.device_type).lower() == "cuda" else "cpu"


def resolve(group: Optional[Any]) -> GroupInfo:
    if isinstance(group, GroupInfo):
        return group
    group = process_group(group)
    # The handle is read when tracing: a jitted function keeps using this
    # communicator; after destroy_process_group() it fails with a clear error.
    return GroupInfo(int(group.handle), group.size, group.rank, _platform_of(group))
