"""``CachedDataset``: a dataset whose samples are served from a cache after their first load.

Contract: ``CachedDataset(dataset, backend="lmdb", dataset_name="",
writer_buffer_size=20, allow_pickle=False, **store_kwargs)``;
``ds[i]`` = ``dataset[i]``, read from the cache when present (see
:class:`CacheLoader` for the backends, the format and the fallback on
failure). ``DataLoader`` fetches a batch of indices in one round trip
(``__getitems__``). Give datasets sharing a backend distinct ``dataset_name``s.
"""

from __future__ import annotations

from typing import Any, List, Sequence

from torch.utils.data import Dataset

from bagua_torch.contrib.cache_loader import CacheLoader

__all__ = ["CachedDataset"]


class CachedDataset(Dataset):
    def __init__(
        self,
        dataset: Dataset,
        backend: str = "lmdb",
        dataset_name: str = "",
        writer_buffer_size: int = 20,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.dataset = dataset
        self.cache_loader = CacheLoader(backend, dataset_name, writer_buffer_size, **kwargs)

    def __getitem__(self, item: Any) -> Any:
        return self.cache_loader.get(item, lambda x: self.dataset[x])

    def __getitems__(self, items: Sequence[Any]) -> List[Any]:
        return self.cache_loader.get_many(list(items), lambda xs: [self.dataset[x] for x in xs])

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # a map-style dataset has a length
