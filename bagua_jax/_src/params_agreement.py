"""What every transform's ``init`` checks across the ranks, and the helper
that makes the params equal.

``init`` runs host-side collectives on the group, so it first waits for the
collectives jitted steps have queued (``jax.effects_barrier``): every rank
then meets them in the same order, also when ``init`` is called while steps
are in flight (a second optimizer, a rollback). Then, on every rank at once:

* the pytrees must have the same structure, shapes and dtypes (an error);
* their values should be equal, as data-parallel training starts from one
  set of weights (``bagua_torch`` broadcasts rank 0's when it wraps a model):
  a checksum per leaf is compared and a difference is a warning that names
  :func:`broadcast_params`.
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any, Sequence, Tuple

import jax
import numpy as np

from bagua_core import agreement, comm as core_comm


def leaf_signature(path, leaf) -> Tuple[str, str, tuple, str]:
    return ("leaf", jax.tree_util.keystr(path), tuple(np.shape(leaf)), str(np.dtype(leaf.dtype)))


def check_params(flat: Sequence[Tuple[Any, Any]], group, what: str, extra: Sequence[tuple] = ()) -> None:
    """``flat``: ``tree_flatten_with_path(params)[0]``; ``extra``: more
    entries every rank must agree on (e.g. the mesh's shape)."""
    jax.effects_barrier()
    agreement.check_same_everywhere(
        [leaf_signature(p, x) for p, x in flat] + list(extra), group, f"the pytree given to {what}.init"
    )
    if any(isinstance(x, jax.core.Tracer) for _, x in flat):
        return  # init under jit: no values to compare
    sums = [("value", jax.tree_util.keystr(p), zlib.crc32(np.asarray(x).tobytes())) for p, x in flat]
    try:
        agreement.check_same_everywhere(sums, group, f"the params given to {what}.init")
    except ValueError as e:
        warnings.warn(
            f"{e}: data-parallel training starts from the same weights on every rank; "
            "pass them through bagua_jax.broadcast_params(params) first",
            RuntimeWarning,
            stacklevel=3,
        )


def broadcast_params(params: Any, root: int = 0, group=None) -> Any:
    """``params`` as rank ``root`` holds them, on every rank of ``group``
    (default: the default group), each leaf with its own sharding. A global
    array over several processes' devices must be whole in every process
    (replicated across them; a leaf sharded across them is a ValueError).
    Call it on every rank, outside ``jax.jit``, before ``tx.init``: e.g. after
    ``model.init(jax.random.PRNGKey(rank), ...)``, or for Flax
    ``batch_stats`` too."""
    from bagua_jax._src import groups

    group = groups.process_group(group, "bagua_jax.broadcast_params")
    jax.effects_barrier()
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    hosts = [_whole_value(path, leaf) for path, leaf in flat]  # every refusal before any communication
    out = []
    for (_, leaf), host in zip(flat, hosts):
        core_comm.broadcast(host, root, group)
        out.append(_placed_like(leaf, host))
    return jax.tree_util.tree_unflatten(treedef, out)


def _whole_value(path, leaf) -> np.ndarray:
    """A writable host copy of the leaf's whole value, as this process holds it
    (a global array over several processes: from the shards on its devices)."""
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
        return np.array(leaf)
    host = np.empty(leaf.shape, leaf.dtype)
    held = {}
    for shard in leaf.addressable_shards:
        key = tuple(s.indices(n) for s, n in zip(shard.index, leaf.shape))
        if key not in held:
            held[key] = host[shard.index] = np.asarray(shard.data)
    if sum(part.size for part in held.values()) != leaf.size:  # a NamedSharding's shards tile the array
        raise ValueError(
            f"bagua_jax.broadcast_params: {jax.tree_util.keystr(path)} is sharded across processes "
            f"({leaf.sharding}): each holds other parts of it, so there are no rank-0 values to copy. "
            "Bagua's data parallelism keeps the params whole in every process (replicated, or sharded "
            "over each process's own devices)"
        )
    return host


def _placed_like(leaf, host: np.ndarray):
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        return jax.numpy.asarray(host)
    if leaf.is_fully_addressable:
        return jax.device_put(host, sharding)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
