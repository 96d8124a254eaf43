"""``jax.distributed`` together with Bagua: one launch line starts both.

* Under ``bagua-run`` or torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ...), once ``bagua_jax`` is imported, ``jax.distributed.initialize()``
  needs no arguments: :class:`BaguaLaunchCluster` hands JAX the same rank and
  world size, and JAX's coordinator listens on ``MASTER_ADDR:MASTER_PORT + 2``
  (``Settings.jax_coordinator_address``; ``JAX_COORDINATOR_PORT`` or
  ``JAX_COORDINATOR_ADDRESS`` override it), next to torchrun's store
  (``MASTER_PORT``) and Bagua's (``MASTER_PORT + 1``).
* After ``jax.distributed.initialize()``, :func:`settings_from_jax` gives
  ``bagua_jax.init_process_group()`` JAX's process index and count; with no
  launcher's variables, Bagua's store listens on the coordinator's host, on
  the coordinator's port + 1. Where both are set and disagree: an error.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

import jax

from bagua_core import config
from bagua_jax import _compat

if TYPE_CHECKING:
    from bagua_core.config import Settings


class BaguaLaunchCluster(_compat.ClusterEnv):
    """The launch contract Bagua reads (bagua_core.config), for ``jax.distributed``."""

    name = "bagua"

    @classmethod
    def is_env_present(cls) -> bool:
        return "RANK" in os.environ and "WORLD_SIZE" in os.environ

    @classmethod
    def get_coordinator_address(cls, timeout_secs: Optional[int], override_coordinator_port: Optional[str]) -> str:
        settings = config.load()
        if override_coordinator_port:
            return f"{settings.master_addr}:{override_coordinator_port}"
        return settings.jax_coordinator_address

    @classmethod
    def get_process_count(cls) -> int:
        return config.load().world_size

    @classmethod
    def get_process_id(cls) -> int:
        return config.load().rank

    @classmethod
    def get_local_process_id(cls) -> Optional[int]:
        # several processes on a host: one device each (JAX then shows each its
        # LOCAL_RANK-th GPU); one process per host: all of the host's devices
        settings = config.load()
        return settings.local_rank if settings.local_world_size > 1 else None


def settings_from_jax() -> Optional[Settings]:
    """Bagua's settings for a program that has called
    ``jax.distributed.initialize()``; None when it has not."""
    coordinator = _compat.jax_coordinator_address()
    if coordinator is None:
        return None
    rank, world = jax.process_index(), jax.process_count()
    env = dict(os.environ)
    if "RANK" in env or "WORLD_SIZE" in env:
        launched = config.load(env)
        if (launched.rank, launched.world_size) != (rank, world):
            raise ValueError(
                f"bagua_jax.init_process_group: jax.distributed was initialised as process {rank} of {world}, "
                f"but the launcher's environment says RANK={launched.rank} of WORLD_SIZE={launched.world_size}; "
                "call jax.distributed.initialize() without arguments under the launcher, or unset RANK/WORLD_SIZE"
            )
        return launched
    host, _, port = coordinator.rpartition(":")
    env.pop("GROUP_RANK", None)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        # JAX's layout: one process per host, driving all of its devices
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        NODE_RANK=str(rank),
        MASTER_ADDR=host.strip("[]"),
        MASTER_PORT=port,  # the coordinator's; Bagua's store takes the next one
    )
    return config.load(env)
