"""``bagua.torch_api.env``: Bagua 0.9.2's getters of the job layout and
settings, read through :mod:`bagua_core.config` (the one reader of the
environment; usable before ``init_process_group``)."""

from __future__ import annotations

from bagua_core import config


def get_world_size() -> int:
    """Number of processes in the job, from the environment."""
    return config.load().world_size


def get_rank() -> int:
    """Global rank of this process, from the environment."""
    return config.load().rank


def get_local_rank() -> int:
    """Rank of this process on its node, from the environment."""
    return config.load().local_rank


def get_local_size() -> int:
    """Number of processes on this node, from the environment."""
    return config.load().local_world_size


def get_node_rank() -> int:
    return config.load().node_rank


def get_master_addr() -> str:
    return config.load().master_addr


def get_default_bucket_size() -> int:
    """Bytes per bucket (``BAGUA_BUCKET_SIZE``, alias ``BAGUA_DEFAULT_BUCKET_SIZE``)."""
    return config.load().bucket_size


def get_bagua_service_port() -> int:
    """The one extra port Bagua uses on the master: its store
    (``BAGUA_STORE_PORT``, alias ``BAGUA_SERVICE_PORT``)."""
    return config.load().store_port


def get_autotune_level() -> int:
    """``BAGUA_AUTOTUNE`` (>= 1: bucket plans are tuned online; see bagua_core.autotune)."""
    return config.load().autotune_level


__all__ = [
    "get_world_size",
    "get_rank",
    "get_local_rank",
    "get_local_size",
    "get_node_rank",
    "get_master_addr",
    "get_default_bucket_size",
    "get_bagua_service_port",
    "get_autotune_level",
]
