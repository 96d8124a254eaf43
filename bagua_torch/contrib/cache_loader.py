"""``CacheLoader``: a key-value cache in front of an expensive load function.

Contract: ``CacheLoader(backend="lmdb", dataset_name="", writer_buffer_size=1,
allow_pickle=False, **store_kwargs)``; ``get(key, load_fn)`` returns the value
cached under ``f"{dataset_name}_{key}"`` or ``load_fn(key)``, which is then
written to the cache. Writes are batched (``writer_buffer_size`` values per
write; pending writes are also flushed every 1000 reads, by ``flush()`` and
when the process exits, DataLoader workers included).
Backends: ``"lmdb"`` (default: embedded, on local disk, shared by the ranks of
a node; kwargs ``path``, ``capacity_per_node``) and ``"redis"`` (kwargs
``hosts``, ``cluster_mode``, ``capacity_per_node``).

Values are stored in a safe format (see ``utils.serialization``): arrays,
tensors, numbers, strings, bytes and containers of them; anything else raises
``TypeError`` unless ``allow_pickle=True``.

A failing backend never loses a sample: reads fall back to ``load_fn`` with a
warning (once), the cache is skipped for ``retry_after_s`` seconds and then
tried again, and pending writes are kept for a later try (at most
``4 * writer_buffer_size``, the oldest dropped first). A record that cannot be
decoded is reloaded and rewritten. ``stats()`` / ``hit_rate`` report how the
cache serves.
"""

from __future__ import annotations

import multiprocessing.util
import os
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

from bagua_torch.contrib.utils import serialization
from bagua_torch.contrib.utils.store import Store

__all__ = ["CacheLoader"]

_FLUSH_EVERY_READS = 1000


def make_store(backend: str, **kwargs: Any) -> Store:
    if backend == "lmdb":
        from bagua_torch.contrib.utils.lmdb_store import LmdbStore

        return LmdbStore(**kwargs)
    if backend == "redis":
        from bagua_torch.contrib.utils.redis_store import RedisStore

        return RedisStore(**kwargs)
    raise ValueError(f'invalid backend {backend!r}: use "lmdb" (embedded, the default) or "redis"')


class CacheLoader:
    def __init__(
        self,
        backend: str = "lmdb",
        dataset_name: str = "",
        writer_buffer_size: int = 1,
        allow_pickle: bool = False,
        retry_after_s: float = 10.0,
        **kwargs: Any,
    ) -> None:
        if not isinstance(writer_buffer_size, int) or writer_buffer_size < 1:
            raise ValueError(f"writer_buffer_size must be a positive integer, got {writer_buffer_size!r}")
        self.backend = backend
        self.dataset_name = dataset_name
        self.writer_buffer_size = writer_buffer_size
        self.allow_pickle = bool(allow_pickle)
        self.retry_after_s = float(retry_after_s)
        self.store = make_store(backend, **kwargs)
        self._pending: Dict[bytes, bytes] = {}
        self._down_until = 0.0
        self._warned = False
        self._reads = 0
        self.hits = self.misses = self.errors = 0
        self._finalizer_pid: Optional[int] = None

    def _flush_at_exit(self) -> None:
        """Pending writes are flushed when this process exits, once registered
        in it: multiprocessing's exit hook also runs in DataLoader workers
        (which skip atexit) but forgets what the parent registered."""
        if self._finalizer_pid != os.getpid():
            self._finalizer_pid = os.getpid()
            multiprocessing.util.Finalize(self, CacheLoader._flush_quietly, args=(self.__dict__,), exitpriority=10)

    @staticmethod
    def _flush_quietly(state: dict) -> None:
        if state["_pending"]:
            try:
                state["store"].mset(state["_pending"])
                state["_pending"].clear()
            except Exception:  # noqa: BLE001 - at exit a failing cache only loses cached copies
                pass

    # ------------------------------------------------------------ reading

    def _key(self, key) -> bytes:
        return f"{self.dataset_name}_{key}".encode()

    def get(self, key: Any, load_fn: Callable[[Any], Any]) -> Any:
        """The cached value of ``key``, else ``load_fn(key)`` (then cached)."""
        return self.get_many([key], lambda keys: [load_fn(k) for k in keys])[0]

    def get_many(self, keys: Sequence[Any], load_many: Callable[[List[Any]], List[Any]]) -> List[Any]:
        """Values of ``keys`` in one round trip; ``load_many(missing keys)`` loads the misses."""
        skeys = [self._key(k) for k in keys]
        raw = self._read(skeys)
        out: List[Any] = [None] * len(keys)
        missing = []
        for i, data in enumerate(raw):
            if data is None:
                missing.append(i)
                continue
            try:
                out[i] = serialization.loads(data, self.allow_pickle)
                self.hits += 1
            except Exception as e:  # noqa: BLE001 - corrupt or refused record: load it again
                self._warn(f"a cached record of {skeys[i]!r} cannot be read ({e}); loading it again")
                missing.append(i)
        if missing:
            self.misses += len(missing)
            loaded = load_many([keys[i] for i in missing])
            if len(loaded) != len(missing):
                raise ValueError(f"load_many returned {len(loaded)} values for {len(missing)} keys")
            for i, value in zip(missing, loaded):
                out[i] = value
                self._pending[skeys[i]] = serialization.dumps(value, self.allow_pickle)
            self._flush_at_exit()
            if len(self._pending) >= self.writer_buffer_size:
                self.flush()
        self._reads += len(keys)
        if self._reads >= _FLUSH_EVERY_READS:
            self._reads = 0
            if self._pending:
                self.flush()
        return out

    def _read(self, skeys: List[bytes]) -> List:
        if time.monotonic() < self._down_until:
            return [None] * len(skeys)
        try:
            return self.store.mget(skeys)
        except Exception as e:  # noqa: BLE001 - any backend failure: load instead
            self._failed("read", e)
            return [None] * len(skeys)

    # ------------------------------------------------------------ writing

    def flush(self) -> None:
        """Writes the pending values now (kept for later when the backend fails)."""
        if not self._pending or time.monotonic() < self._down_until:
            self._bound_pending()
            return
        try:
            self.store.mset(self._pending)
            self._pending = {}
        except Exception as e:  # noqa: BLE001 - any backend failure: keep the data for a retry
            self._failed("write", e)
            self._bound_pending()

    def _bound_pending(self) -> None:
        limit = 4 * self.writer_buffer_size
        while len(self._pending) > limit:
            self._pending.pop(next(iter(self._pending)))

    def _failed(self, what: str, e: Exception) -> None:
        self.errors += 1
        self._down_until = time.monotonic() + self.retry_after_s
        self._warn(
            f"the {self.backend} cache failed to {what} ({type(e).__name__}: {e}); loading from the "
            f"dataset instead, retrying the cache in {self.retry_after_s:g} s"
        )

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    # ------------------------------------------------------------ reporting

    def num_keys(self) -> int:
        """Entries in the backend (every dataset sharing it)."""
        return self.store.num_keys()

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def stats(self) -> Dict[str, float]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "hit_rate": self.hit_rate,
            "pending_writes": len(self._pending),
        }

    def __getstate__(self):  # DataLoader workers get their own counters and buffer
        state = dict(self.__dict__)
        state["_pending"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
