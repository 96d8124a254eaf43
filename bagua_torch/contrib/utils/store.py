"""The interface every cache backend implements (keys and values are bytes).

``get``/``mget`` return None for a missing key; every method may raise when the
backend fails (a server down, a full disk): the cache loader catches that and
loads from the dataset instead.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence


class Store:
    def set(self, key: bytes, value: bytes) -> None:
        self.mset({key: value})

    def get(self, key: bytes) -> Optional[bytes]:
        return self.mget([key])[0]

    def mset(self, items: Dict[bytes, bytes]) -> None:
        raise NotImplementedError

    def mget(self, keys: Sequence[bytes]) -> List[Optional[bytes]]:
        raise NotImplementedError

    def num_keys(self) -> int:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def status(self) -> bool:
        """True when the backend answers."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Releases what this process opened or started (servers this process started stop)."""
