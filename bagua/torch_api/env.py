"""``bagua.torch_api.env``: Bagua 0.9.2's getters of the job layout and
settings, read through :mod:`bagua_core.config` (the one reader of the
environment; usable before ``init_process_group``), and its
``find_free_network_port``."""

from __future__ import annotations

from bagua_core import config
from bagua_core.launcher.ports import free_master_ports


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


def get_autotune_max_samples() -> int:
    """``BAGUA_AUTOTUNE_MAX_SAMPLES``: plans measured before the best is kept."""
    return config.load().autotune_max_samples


def get_autotune_sampling_confidence_time_s() -> float:
    """``BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S``: seconds each plan is measured."""
    return config.load().autotune_sampling_confidence_time_s


def get_autotune_warmup_time_s() -> float:
    """``BAGUA_AUTOTUNE_WARMUP_TIME_S``: seconds of training before the first measurement."""
    return config.load().autotune_warmup_time_s


def get_is_output_autotune_log() -> bool:
    """``BAGUA_IS_OUTPUT_AUTOTUNE_LOG``: whether rank 0 writes the autotune log."""
    return config.load().autotune_log


def get_autotune_server_wait_time() -> int:
    """Seconds a rank waits for rank 0's autotune decision. There is no
    autotune HTTP service here (decisions travel through the job's store),
    so this is the job's timeout, ``BAGUA_TIMEOUT``."""
    return int(config.load().timeout_s)


def is_report_metrics_switch_on() -> bool:
    """Always False: ``BAGUA_REPORT_METRICS`` had no effect in Bagua 0.9.2,
    and no metrics are reported here either."""
    return False


def find_free_network_port() -> int:
    """A port free on this machine right now, outside the kernel's range for
    outgoing connections (so Gloo's connections cannot take it before it is
    used), and whose successor is free too: as ``MASTER_PORT`` it leaves
    ``MASTER_PORT + 1`` for Bagua's store (its default)."""
    return free_master_ports()


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
    "get_autotune_max_samples",
    "get_autotune_sampling_confidence_time_s",
    "get_autotune_warmup_time_s",
    "get_is_output_autotune_log",
    "get_autotune_server_wait_time",
    "is_report_metrics_switch_on",
    "find_free_network_port",
]
