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
    """A collective was called before bagua_jax.init() (or with no group)."""


def init(**kwargs: Any) -> Any:
    """Initialises Bagua's default process group from the environment.

    Same contract as torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...);
    see ``bagua_core.config``. Keyword arguments go to
    ``bagua_core.init_process_group``. Returns the default group.
    """
    return bagua_core.init_process_group(**kwargs)


def _default_group() -> Any:
    getter = getattr(bagua_core, "get_default_group", None)
    group = getter() if getter is not None else None
    if group is None:
        raise GroupNotInitializedError(
            "bagua_jax: no process group; call bagua_jax.init() first "
            "(or pass group=...)")
    return group


def _platform_of(group: Any) -> str:
    device = str(getattr(group, "device_type", "cpu")).lower()
    return "cuda" if "cuda" in device else "cpu"


def resolve(group: Optional[Any]) -> GroupInfo:
    if group is None:
        group = _default_group()
    if isinstance(group, GroupInfo):
        return group
    try:
        handle, size, rank = int(group.handle), int(group.size), int(group.rank)
    except AttributeError:
        raise TypeError(
            f"bagua_jax: group must be a bagua_core process group, got {type(group).__name__}"
        ) from None
    return GroupInfo(handle, size, rank, _platform_of(group))
