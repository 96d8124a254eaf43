"""``bagua_torch.DistributedDataParallel``: the torch DDP-style way to use Bagua."""

from __future__ import annotations

import contextlib
import numbers
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import torch

from bagua_core.process_group import ProcessGroup
from bagua_torch.algorithms.base import Algorithm, AlgorithmImpl
from bagua_torch.algorithms.gradient_allreduce import GradientAllReduceAlgorithm
from bagua_torch.bucket import BaguaBucket
from bagua_torch.distributed import wrap

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(torch.nn.Module):
    """Wraps ``module`` like ``torch.nn.parallel.DistributedDataParallel``,
    communicating with a Bagua algorithm (default: GradientAllReduce).

    Args:
        module: the model (same on every rank; rank 0's state is broadcast).
        optimizers: the optimizers stepping its parameters (their state is
            broadcast, and their ``step`` ends an open communication step).
        algorithm: a :mod:`bagua_torch.algorithms` algorithm or a
            :mod:`bagua_core.algorithms` description.
        process_group: a ``bagua_core.ProcessGroup`` (default: the world group).
        find_unused_parameters: parameters that get no gradient in a backward
            pass are communicated as zeros instead of raising.
        broadcast_buffers: broadcast rank 0's buffers (e.g. BatchNorm running
            statistics) before each training forward.
        gradient_as_bucket_view: gradients (or weights) live in the
            communication buckets (no copies); ``do_flatten`` of ``with_bagua``.
        bucket_cap_mb: bucket size (default: ``BAGUA_BUCKET_SIZE``, 10 MiB).
        overlap_optimizer: ``optimizer.step()`` updates each bucket's
            parameters as its exchange finishes, instead of backward waiting
            for every bucket; nothing may read the gradients between backward
            and the step (see :func:`bagua_torch.distributed.with_bagua`).

    Parameters and buffers named in ``module._bagua_params_and_buffers_to_ignore``
    or ``module._ddp_params_and_buffers_to_ignore`` (names as in
    ``module.named_parameters()``) are neither broadcast nor communicated.

    ``state_dict()`` holds ``module.*`` (as torch's DDP) and, tensors only,
    the algorithm's state under the prefix ``bagua.``:

    * ``bagua.algorithm``: the algorithm's name (its ``.name``, e.g.
      ``"decentralized"``) as a 1-D uint8 CPU tensor of its UTF-8 bytes
      (``bytes(t.tolist()).decode()`` reads it);
    * ``bagua.step``: the step counter, a 0-d int64 CPU tensor (algorithms
      that count steps: Decentralized, LowPrecisionDecentralized, QAdam, Async);
    * ``bagua.step_state.<i>``: the engine step's state of bucket ``i``, a
      ``(num_state, bucket numel)`` tensor on the model's device
      (LowPrecisionDecentralized: the replicas; QAdam: the momentum), or of
      the step's own layout (LowRank: one row holding the error memory, then
      each compressed matrix's Q, float32, float64 for float64 gradients).

    So code written for torch's state dicts (``{k: v.clone() for k, v in
    sd.items()}``, averaging helpers, converters) works on it; the entries
    are copies. ``load_state_dict()`` restores them, strict or not, so a run
    resumed from a checkpoint continues exactly; a state saved with another
    algorithm raises. A state dict without ``bagua.*`` entries (from
    ``torch.nn.parallel.DistributedDataParallel`` or Bagua 0.9.2) loads too,
    leaving the algorithm's state as it is. ``module.state_dict()`` is the
    plain model; ``bagua_ddp.state_dict()`` the same algorithm state as a
    dict (``{"algorithm": name, "state": {...}}``).
    """

    STATE_PREFIX = "bagua."

    def __init__(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer] = (),
        algorithm: Union[Algorithm, Any, None] = None,
        process_group: Optional[ProcessGroup] = None,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool = True,
        gradient_as_bucket_view: bool = True,
        bucket_cap_mb: Optional[float] = None,
        overlap_optimizer: bool = False,
    ) -> None:
        super().__init__()
        self.module = module
        bucket_bytes = None if bucket_cap_mb is None else max(1, int(bucket_cap_mb * 1024 * 1024))
        self.inner = wrap(
            module,
            optimizers,
            GradientAllReduceAlgorithm() if algorithm is None else algorithm,
            process_group,
            module_name=f"DistributedDataParallel_{id(module)}",
            do_flatten=gradient_as_bucket_view,
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=broadcast_buffers,
            bucket_bytes=bucket_bytes,
            overlap_optimizer=overlap_optimizer,
        )

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients accumulate locally inside; the first backward after it
        communicates their sum (mean over ranks)."""
        with self.inner.no_sync():
            yield

    @property
    def require_backward_grad_sync(self) -> bool:
        return self.inner.require_backward_grad_sync

    @property
    def bagua_algorithm(self) -> AlgorithmImpl:
        return self.inner.impl

    @property
    def bagua_optimizers(self) -> List[torch.optim.Optimizer]:
        return self.inner.optimizers

    @property
    def bagua_buckets(self) -> List[BaguaBucket]:
        return self.inner.bagua_buckets

    @property
    def parameters_to_ignore(self) -> List[str]:
        return sorted(self.inner.ignored)

    def close(self) -> None:
        """Removes the hooks and stops the engine; the module trains locally again."""
        self.inner.close()

    # The algorithm's state travels in the module's state dict (see the class docstring).
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for key, t in _state_to_tensors(self.inner.state_dict()).items():
            destination[prefix + self.STATE_PREFIX + key] = t

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        start = prefix + self.STATE_PREFIX
        # torch passes its own copy of the dict: the entries are taken out of it
        entries = {k[len(start) :]: state_dict.pop(k) for k in [k for k in state_dict if k.startswith(start)]}
        legacy = state_dict.pop(prefix + "bagua", None)  # the nested dict earlier versions saved
        if entries or legacy is not None:
            try:
                self.inner.load_state_dict(legacy if not entries else _state_from_tensors(entries))
            except ValueError as e:  # torch raises them all at the end
                error_msgs.append(
                    f"{start + '*'!r}: {e} (remove the {start + '*'!r} entries to start the algorithm's state afresh)"
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


# The one translation between BaguaDistributedDataParallel.state_dict()
# ({"algorithm": name, "state": {key: int or list of tensors}}) and the
# tensor entries of DistributedDataParallel's state dict (keys without prefix).


def _state_to_tensors(state: dict) -> Dict[str, torch.Tensor]:
    out = {"algorithm": torch.tensor(list(state["algorithm"].encode("utf-8")), dtype=torch.uint8)}
    for key, value in state["state"].items():
        if isinstance(value, (list, tuple)):
            out.update((f"{key}.{i}", t) for i, t in enumerate(value))
        elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
            out[key] = torch.tensor(int(value), dtype=torch.int64)
        else:
            raise TypeError(f"algorithm state {key!r}: expected an int or a list of tensors, got {value!r:.80}")
    return out


def _state_from_tensors(entries: Dict[str, torch.Tensor]) -> dict:
    """Inverse of :func:`_state_to_tensors`; ValueError for entries it did not write."""
    name = entries.pop("algorithm", None)
    if not (isinstance(name, torch.Tensor) and name.dtype == torch.uint8 and name.dim() == 1):
        raise ValueError(
            f"'algorithm' must be a 1-D uint8 tensor of the algorithm name's UTF-8 bytes, got {name!r:.80}"
        )
    state: dict = {}
    lists: Dict[str, Dict[int, torch.Tensor]] = {}
    for key, t in entries.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{key!r} must be a tensor, got {type(t).__name__}")
        head, _, index = key.rpartition(".")
        if head and index.isdigit():
            lists.setdefault(head, {})[int(index)] = t
        elif t.dim() == 0 and t.dtype == torch.int64:
            state[key] = int(t)
        else:
            raise ValueError(f"{key!r} must be a 0-d int64 tensor, got {t.dtype} of shape {tuple(t.shape)}")
    for head, items in lists.items():
        if sorted(items) != list(range(len(items))):
            raise ValueError(f"the {head!r} entries must be numbered 0 to {len(items) - 1}, got {sorted(items)}")
        state[head] = [items[i] for i in range(len(items))]
    return {"algorithm": bytes(name.tolist()).decode("utf-8", errors="replace"), "state": state}
