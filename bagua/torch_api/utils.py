"""``bagua.torch_api.utils``: the helpers of Bagua 0.9.2's module of that name
that its tests and users' scripts import.

* ``flatten`` / ``unflatten``: torch's dense-tensor flattening.
* ``apply_flattened_call(bucket, call, extra_args=None)``: ``call`` on one
  flat copy of ``bucket`` (tensors of one type), the result copied back; after
  ``torch.distributed.all_reduce`` the sum is divided by the world size (an
  average, as in the original). ``apply_flattened_call_all`` does it per
  tensor type.
* ``check_contiguous``, ``get_flattened_tensor``, ``to_bagua_datatype``.
* ``average_by_removing_extreme_values(scores)``: (mean, std, kept scores)
  after dropping the first third (warm-up) and the values more than one
  standard deviation from the mean, repeated until the std is below the mean
  (at most ten more times).
* ``StatisticalAverage``: the running average the original's autotuning fed
  speeds into, over windows of 1, 2, 4, ... seconds (see the class).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

flatten = torch._utils._flatten_dense_tensors
unflatten = torch._utils._unflatten_dense_tensors

__all__ = [
    "flatten",
    "unflatten",
    "apply_flattened_call",
    "apply_flattened_call_all",
    "check_contiguous",
    "get_flattened_tensor",
    "to_bagua_datatype",
    "average_by_removing_extreme_values",
    "StatisticalAverage",
]


def apply_flattened_call(
    bucket: Sequence[torch.Tensor], call: Callable[..., Any], extra_args: Optional[Sequence[Any]] = None
) -> None:
    flat = flatten(bucket)
    call(flat, *(extra_args or ()))
    if call is dist.all_reduce:
        flat /= dist.get_world_size()
    for t, synced in zip(bucket, unflatten(flat, bucket)):
        t.copy_(synced)


def apply_flattened_call_all(tensors: Sequence[torch.Tensor], call: Callable[..., Any]) -> None:
    by_type: "OrderedDict[str, List[torch.Tensor]]" = OrderedDict()
    for t in tensors:
        by_type.setdefault(t.type(), []).append(t)
    for bucket in by_type.values():
        apply_flattened_call(bucket, call)


def check_contiguous(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether each tensor starts where the one before it ends in memory."""
    return all(b.data_ptr() == a.data_ptr() + a.numel() * a.element_size() for a, b in zip(tensors, tensors[1:]))


def get_flattened_tensor(tensors: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """A new 1-D tensor holding ``tensors`` one after the other (None for none)."""
    if len(tensors) == 0:
        return None
    return torch.cat([t.reshape(-1) for t in tensors]).to(dtype=tensors[0].dtype, device=tensors[0].device)


_BAGUA_DATATYPES = {torch.float32: "f32", torch.float16: "f16", torch.uint8: "u8", torch.long: "i64"}


def to_bagua_datatype(datatype: torch.dtype) -> str:
    try:
        return _BAGUA_DATATYPES[datatype]
    except KeyError:
        raise ValueError(f"unsupported data type {datatype}.") from None


def average_by_removing_extreme_values(raw_score_list: Sequence[float]) -> Tuple[float, float, List[float]]:
    scores = np.asarray(raw_score_list)
    scores = scores[len(scores) // 3 :]

    def within_one_std(x):
        kept = x[abs(x - np.mean(x)) < np.std(x)]
        return kept if len(kept) else x

    scores = within_one_std(scores)
    for _ in range(10):
        if np.std(scores) < np.mean(scores):
            break
        scores = within_one_std(scores)
    return np.mean(scores), np.std(scores), scores.tolist()


class StatisticalAverage:
    """The average of a value recorded over time, kept for windows of 2^i
    seconds: ``records[i]`` is the average over the 2^i seconds before
    ``last_update_time``; ``record_tail = (length, mean)``: the history beyond
    the last full window is ``length`` seconds long and the mean over the
    whole history is ``mean``. ``get_records_mean(n)`` interpolates linearly
    between the windows around ``n`` seconds; ``record(v)`` adds ``v`` as the
    value since the last update. (The original's defaults, a time taken at
    import and shared lists, are replaced by fresh ones per instance.)"""

    def __init__(
        self,
        last_update_time: Optional[float] = None,
        records: Optional[List[float]] = None,
        record_tail: Tuple[float, float] = (0.0, 0.0),
    ) -> None:
        self.last_update_time: float = time.time() if last_update_time is None else last_update_time
        self.records: List[float] = list(records or [])
        self.record_tail: Tuple[float, ...] = tuple(record_tail)

    def record_seconds(self) -> float:
        return 2.0 ** (len(self.records) - 1) if self.records else 0.0

    def total_recording_time(self) -> float:
        return self.record_seconds() + self.record_tail[0]

    def get_records_mean(self, last_n_seconds: float) -> float:
        """The average over the last ``last_n_seconds`` before the last update."""
        if last_n_seconds <= 0.0:
            return 0.0
        tail_seconds, tail_mean = self.record_tail
        if not self.records:
            return tail_mean
        if last_n_seconds < 1.0:
            return self.records[0]
        windows = self.record_seconds()
        if last_n_seconds <= windows:
            i = max(0, math.floor(math.log(last_n_seconds, 2.0)))
            if i + 1 >= len(self.records):
                return self.records[i]
            lo = 2.0**i
            return _between(self.records[i], self.records[i + 1], (last_n_seconds - lo) / lo)
        if last_n_seconds <= windows + tail_seconds:
            return _between(self.records[-1], tail_mean, (last_n_seconds - windows) / tail_seconds)
        return tail_mean

    def record(self, val: float) -> None:
        """``val`` is the value since the last update (until now)."""
        now = time.time()
        since = now - self.last_update_time
        before = self.total_recording_time()
        records: List[float] = []
        tail = (0.0, 0.0)
        for i in range(64):
            window = 2.0**i
            if window <= since:
                records.append(val)
            elif window <= since + before:
                share = since / window
                records.append(val * share + self.get_records_mean(window - since) * (1.0 - share))
            else:
                total = since + before
                share = since / total
                tail = (total - 2.0 ** (len(records) - 1), val * share + self.get_records_mean(before) * (1.0 - share))
                break
        self.last_update_time, self.records, self.record_tail = now, records, tail

    def get(self, last_n_seconds: float) -> float:
        """The average over the last ``last_n_seconds`` until now (the value
        is taken as unchanged since the last update)."""
        since = time.time() - self.last_update_time
        if last_n_seconds <= since:
            return self.records[0] if self.records else self.record_tail[1]
        return self.get_records_mean(last_n_seconds - since)

    def __str__(self) -> str:
        return str(
            {"last_update_time": self.last_update_time, "records": self.records, "record_tail": self.record_tail}
        )


def _between(a: float, b: float, fraction: float) -> float:
    return a + (b - a) * fraction
