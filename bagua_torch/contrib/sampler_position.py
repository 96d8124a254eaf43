"""Where an epoch stands, for samplers that resume and re-shard.

Contract: a sampler with a position counts the samples the whole job has
trained on in the current epoch (``advance(batch_size)`` after each step
adds ``batch_size * num_replicas``). ``state_dict()`` holds the epoch and
that count; ``load_state_dict(state)`` on a sampler built for any number of
ranks makes the epoch go on with exactly the samples the saved job had not
reached, dealt out among the new ranks: no sample of the epoch is lost or
seen twice (besides the padding that evens out the ranks' counts, as torch's
DistributedSampler pads, unless ``drop_last``). With the same number of
ranks the rest of the epoch is, index for index, the uninterrupted run's.
``set_epoch`` with a new epoch starts it from the beginning.

A subclass gives ``_epoch_order(indices, num_replicas)``: the epoch's order
of ``indices`` (padded or cut to a multiple of ``num_replicas``) for that
many ranks, rank r taking every ``num_replicas``-th from r. A change of the
number of ranks is kept as a segment (samples consumed, ranks), so the
samples reached before it are known again from the seed alone.
"""

from __future__ import annotations

from typing import Dict, List, Tuple


class SamplerPosition:
    num_replicas: int
    rank: int
    epoch: int

    def _start_position(self) -> None:
        self.consumed_samples = 0  # in the current segment: since the last change of the number of ranks
        self._segments: List[Tuple[int, int]] = []  # (consumed, ranks) of earlier segments of the epoch

    def _epoch_order(self, indices: List[int], num_replicas: int) -> List[int]:
        raise NotImplementedError

    def _all_indices(self) -> List[int]:
        raise NotImplementedError

    def _order_now(self) -> List[int]:
        """This epoch's order of the samples not reached before the current segment."""
        remaining = self._all_indices()
        for consumed, ranks in self._segments:
            reached = set(self._epoch_order(remaining, ranks)[:consumed])
            remaining = [i for i in remaining if i not in reached]  # a tail drop_last cut is not lost here
        return self._epoch_order(remaining, self.num_replicas)

    def _my_indices(self) -> List[int]:
        return self._order_now()[self.consumed_samples :][self.rank :: self.num_replicas]

    def advance(self, batch_size: int) -> None:
        """One training step of ``batch_size`` samples on every rank is done."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size must be an int >= 0, got {batch_size!r}")
        self.consumed_samples += batch_size * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """The order of ``epoch`` (the same on every rank); a new epoch starts from its beginning."""
        if epoch != self.epoch:
            self._start_position()
        self.epoch = epoch

    def state_dict(self) -> Dict:
        return {
            "epoch": self.epoch,
            "consumed_samples": self.consumed_samples,
            "num_replicas": self.num_replicas,
            "segments": [list(s) for s in self._segments],
        }

    def load_state_dict(self, state: Dict) -> None:
        for key in ("epoch", "consumed_samples", "num_replicas"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "num_replicas" else 0):
                raise ValueError(f"a sampler state needs an int {key!r}, got {value!r}")
        segments = [(int(c), int(r)) for c, r in state.get("segments", [])]
        self.epoch = state["epoch"]
        if state["num_replicas"] == self.num_replicas:
            self._segments, self.consumed_samples = segments, state["consumed_samples"]
        else:  # re-shard: what the saved ranks reached becomes a segment of its own
            self._segments = segments + [(state["consumed_samples"], state["num_replicas"])]
            self.consumed_samples = 0
