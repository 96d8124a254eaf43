"""The default cache backend: an LMDB database on local disk, shared by the ranks of a node.

Contract: ``LmdbStore(path=None, capacity_per_node=100 GiB)``. LMDB serves
concurrent readers in many processes from a memory map (no server, no copy
through a socket) and serialises writers with a lock, so every rank of a node
and every DataLoader worker opens the same database. With ``path=None`` the
database lives in the temporary directory under a name unique to the job
(the master address and port, or the process id when alone) and the node's
local rank 0 deletes it at exit; a given ``path`` is kept (a cache that
outlives the job). When the database is full, random entries are evicted
(the original's ``allkeys-random`` policy) to make room.

Commits are not synced to disk: a cache needs no durability (an OS crash may
lose the latest writes, which are reloaded). The environment is opened lazily
in each process and closed just before this process forks (an LMDB handle
must not cross ``fork``, and py-lmdb refuses a second open of an environment
the parent held, so DataLoader workers could not open it otherwise); the
parent reopens it on next use.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import tempfile
import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence

from bagua_torch.contrib.utils.store import Store

__all__ = ["LmdbStore", "DEFAULT_CAPACITY"]

DEFAULT_CAPACITY = 107_374_182_400  # 100 GiB, the original's capacity_per_node
_EVICT_FRACTION = 0.25

_envs: Dict[tuple, Any] = {}  # (pid, path) -> lmdb.Environment: one per process, as LMDB requires
_lock = threading.Lock()


def _close_before_fork() -> None:
    with _lock:
        for env in _envs.values():
            env.close()
        _envs.clear()


os.register_at_fork(before=_close_before_fork)


def _require_lmdb():
    try:
        import lmdb
    except ImportError as e:
        raise ImportError(
            "the default cache backend needs the 'lmdb' package: pip install 'bagua[contrib]' (or pip install lmdb)"
        ) from e
    return lmdb


def default_path() -> str:
    from bagua_core import config

    s = config.load()
    job = f"{s.master_addr}-{s.master_port}" if s.world_size > 1 else f"pid{os.getpid()}"
    return os.path.join(tempfile.gettempdir(), f"bagua-cache-{os.getuid()}-{job}")


class LmdbStore(Store):
    def __init__(self, path: Optional[str] = None, capacity_per_node: int = DEFAULT_CAPACITY):
        self.lmdb = _require_lmdb()
        if not isinstance(capacity_per_node, int) or capacity_per_node < 1 << 20:
            raise ValueError(f"capacity_per_node must be an integer of at least 1 MiB, got {capacity_per_node!r}")
        self.capacity = capacity_per_node
        self.owned = path is None
        self.path = os.path.abspath(path or default_path())
        if self.owned:
            from bagua_core import config

            if config.load().local_rank == 0:
                atexit.register(shutil.rmtree, self.path, True)
        self._env()  # fail early (bad path, no space) rather than at the first sample

    def _env(self):
        key = (os.getpid(), self.path)
        env = _envs.get(key)
        if env is None:
            with _lock:
                env = _envs.get(key)
                if env is None:
                    os.makedirs(self.path, exist_ok=True)
                    env = self.lmdb.open(
                        self.path,
                        map_size=self.capacity,
                        subdir=True,
                        readahead=False,
                        meminit=False,
                        max_readers=1024,
                        lock=True,
                        sync=False,
                        metasync=False,
                    )
                    _envs[key] = env
        return env

    def mget(self, keys: Sequence[bytes]) -> List[Optional[bytes]]:
        with self._env().begin(buffers=False) as txn:
            return [txn.get(k) for k in keys]

    def mset(self, items: Dict[bytes, bytes]) -> None:
        if not items:
            return
        try:
            self._put(items)
        except self.lmdb.MapFullError:
            self._evict()
            try:
                self._put(items)
            except self.lmdb.MapFullError:
                warnings.warn(
                    f"the LMDB cache at {self.path} is full even after eviction: {len(items)} samples "
                    "not cached (raise capacity_per_node)",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def _put(self, items: Dict[bytes, bytes]) -> None:
        with self._env().begin(write=True) as txn:
            for k, v in items.items():
                txn.put(k, v)

    def _evict(self) -> None:
        """Deletes a random quarter of the entries (allkeys-random); everything
        when even the deletion needs more room than is left."""
        env = self._env()
        try:
            with env.begin(write=True) as txn:
                keys = [k for k, _ in txn.cursor()]
                for k in random.sample(keys, max(1, int(len(keys) * _EVICT_FRACTION))) if keys else []:
                    txn.delete(k)
        except self.lmdb.MapFullError:
            self.clear()

    def num_keys(self) -> int:
        return self._env().stat()["entries"]

    def clear(self) -> None:
        env = self._env()
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(), delete=False)

    def status(self) -> bool:
        try:
            self._env().stat()
            return True
        except Exception:  # noqa: BLE001 - any failure means "not usable"
            return False

    def shutdown(self) -> None:
        env = _envs.pop((os.getpid(), self.path), None)
        if env is not None:
            env.close()
