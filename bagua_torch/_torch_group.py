"""Bagua beside ``torch.distributed``: the job layout given as arguments, a
torch store as the meeting point, torch's default group over the same
rendezvous, and Bagua groups made from torch groups.

Only the layout the original ``init_process_group`` accepted travels through
``os.environ`` (as it did there), so that ``bagua_core.config`` stays the one
reader of settings.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

import bagua_core
from bagua_core import config
from bagua_core.process_group import ProcessGroup

_MEETING_KEY = "bagua/store_address"


def apply_layout(store, rank: int, world_size: int, local_world_size: int) -> None:
    """Writes an explicit layout (and, from ``store``, the meeting point) to ``os.environ``."""
    given = [x != -1 for x in (rank, world_size, local_world_size)]
    if any(given):
        if not all(given):
            raise ValueError("pass rank, world_size and local_world_size together (or none of them)")
        for name, value, minimum in (
            ("rank", rank, 0),
            ("world_size", world_size, 1),
            ("local_world_size", local_world_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
        if rank >= world_size:
            raise ValueError(f"rank {rank} is out of range for world_size {world_size}")
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank % local_world_size),
            LOCAL_WORLD_SIZE=str(local_world_size),
            NODE_RANK=str(rank // local_world_size),
        )
    if store is not None:
        if not isinstance(store, dist.Store):
            raise TypeError(f"store must be a torch.distributed.Store, got {type(store).__name__}")
        if "MASTER_ADDR" not in os.environ:
            _meet_through(store)


def _meet_through(store) -> None:
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if host and port:  # a TCPStore: Bagua's store goes next to it (MASTER_PORT + 1)
        os.environ.setdefault("MASTER_ADDR", str(host))
        os.environ.setdefault("MASTER_PORT", str(port))
        return
    s = config.load()
    if s.world_size == 1:
        return
    if s.rank == 0:
        with socket.socket() as sock:  # a free port for Bagua's store
            sock.bind(("", 0))
            free = sock.getsockname()[1]
        addr = "127.0.0.1" if s.num_nodes == 1 else socket.gethostbyname(socket.gethostname())
        store.set(_MEETING_KEY, f"{addr} {free}")
    addr, port = store.get(_MEETING_KEY).decode().split()
    os.environ["MASTER_ADDR"] = addr
    os.environ["BAGUA_STORE_PORT"] = port


def _backend() -> str:
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init_torch_default_group(store, group: ProcessGroup) -> None:
    """torch's default group over the same job as ``group`` (the world), unless one exists."""
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (group.rank, group.size):
            raise RuntimeError(
                f"torch.distributed was initialised as rank {dist.get_rank()} of {dist.get_world_size()} "
                f"but Bagua's environment says rank {group.rank} of {group.size}"
            )
        return
    s = config.load()
    timeout = datetime.timedelta(seconds=s.timeout_s)
    if store is None and s.world_size == 1:
        store = dist.HashStore()  # alone: nobody to meet, no port
    if store is not None:
        dist.init_process_group(_backend(), store=store, rank=s.rank, world_size=s.world_size, timeout=timeout)
        return
    # env:// (not tcp://): under torchrun it reuses the agent's store on MASTER_PORT
    os.environ.setdefault("MASTER_ADDR", s.master_addr)
    os.environ.setdefault("MASTER_PORT", str(s.master_port))
    dist.init_process_group(_backend(), init_method="env://", rank=s.rank, world_size=s.world_size, timeout=timeout)


def from_torch_group(group, stream=None) -> ProcessGroup:
    """The Bagua group of the same ranks as the torch ``group`` (every rank of
    the job calls it, in the same order, as ``new_group``). ``stream`` is
    accepted for Bagua 0.9 compatibility and unused (CPU groups)."""
    if group is None or group is dist.GroupMember.WORLD:
        return bagua_core.get_default_group()
    try:
        ranks = dist.get_process_group_ranks(group)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"{group!r} is not a torch.distributed process group of this job: {e}") from None
    return bagua_core.new_group(sorted(ranks))


__all__ = ["apply_layout", "init_torch_default_group", "from_torch_group"]
