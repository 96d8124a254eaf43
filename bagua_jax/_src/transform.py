"""bagua_jax.transform: any Bagua algorithm as an optax gradient transformation.

The algorithm's plan (:mod:`bagua_core.algorithms`) says what travels:

* gradient algorithms (GradientAllReduce, ByteGrad) transform the updates they
  receive: put them *before* the optimizer, ``optax.chain(transform(algo),
  optax.adam(lr))``;
* weight algorithms (Decentralized) average the weights with peers and fold
  the average into the updates, ``updates + (average(params) - params)``, so
  ``optax.apply_updates`` gives ``average(x_t) - lr * g(x_t)`` exactly as the
  torch frontend does: put them *after* the optimizer, ``optax.chain(
  optax.sgd(lr), transform(algo))``, and pass ``params`` to ``update``;
* AsyncModelAverage goes after the optimizer too, with a background loop
  averaging host copies of the weights (``bagua_jax._src.async_average``);
* weight algorithms of the after-optimizer-step phase (LowPrecisionDecentralized)
  run on the weights the optimizer's updates give, ``params + updates``, and
  return ``new - params``; they also go after the optimizer. Their step's state
  (the replicas) lives in :class:`BaguaState`, initialised by ``init`` from the
  params it is given, which must be equal on every rank (as after a broadcast).

The leaves are grouped into buckets exactly as ``bagua_torch`` lays out its
engine buckets for the same tensors (reverse leaf order, ``BAGUA_BUCKET_SIZE``
bytes, one dtype per bucket, zero padding to the step's alignment), and each
bucket's leaves go to the engine's step through the ``bagua_step`` FFI target,
which gathers them into that layout on its own thread: the same C++ code,
hence the same numbers, as the torch frontend.
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bagua_core import algorithm_steps, state_relayout, trace as core_trace
from bagua_core.algorithms._base import AFTER_OPTIMIZER_STEP, GRADIENTS, WEIGHTS, check_tensors
from bagua_core.engine import default_bucket_bytes, plan_buckets
from bagua_core.log import logger
from bagua_jax import algorithms
from bagua_jax._src import groups, local_devices, params_agreement, validation
from bagua_jax._src.collective_ops.algorithm_step import BoundStep, algorithm_step

if TYPE_CHECKING:
    from bagua_core.process_group import ProcessGroup

# dtypes the steps average (every algorithm so far works on floating data)
FLOAT_DTYPES = tuple(np.dtype(t) for t in (jnp.float32, jnp.float64, jnp.float16, jnp.bfloat16))


class BaguaState(NamedTuple):
    """The transform's state: ``step``, the number of updates so far (int32
    scalar). It decides which steps communicate (``communication_interval``)
    and ``shift_one``'s partner, so it is checkpointed with the optimizer state.
    ``step_state``: per bucket, the state of stateful steps (low-precision
    decentralized's replicas W, L, R: one 1-D array of 3 x the bucket's padded
    size; ByteGrad with error feedback: its quantisation residual, one array
    of the bucket's padded size, zeros after ``init``; low rank: its error
    memory and Q matrices, one 1-D float32 array, float64 for float64
    gradients), empty otherwise. Saved under another ``BAGUA_BUCKET_SIZE``,
    a state laid out as the buckets are (all but low rank's) is moved into
    the current buckets at the first ``update``."""

    step: jax.Array
    step_state: Tuple[jax.Array, ...] = ()


class _Layout(NamedTuple):
    """Buckets of a list of leaves: leaf indices per bucket and padded sizes."""

    buckets: Tuple[Tuple[int, ...], ...]
    padded: Tuple[int, ...]


def _check_leaves(what: str, flat: Sequence[Tuple[Any, Any]], group_info) -> None:
    for path, leaf in flat:
        name = jax.tree_util.keystr(path) or "<root>"
        if not isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
            raise TypeError(f"bagua_jax.transform: {what} leaf {name} is a {type(leaf).__name__}, not an array")
        dtype = np.dtype(leaf.dtype)
        if dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"bagua_jax.transform: {what} leaf {name} has dtype {dtype}; the algorithms "
                f"average floating data ({', '.join(str(t) for t in FLOAT_DTYPES)})"
            )
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
            validation.check_platform(
                f"transform ({what} leaf {name})", {d.platform for d in leaf.devices()}, group_info
            )


@functools.lru_cache(maxsize=64)
def _layout(
    shapes: Tuple[tuple, ...], dtypes: Tuple[str, ...], one_per_dtype: bool, bucket_bytes: int, alignment: int
) -> _Layout:
    """bagua_torch's bucket layout for tensors in registration (leaf) order:
    buckets take them in reverse order, the order backward produces them."""
    order = list(reversed(range(len(shapes))))
    if one_per_dtype:
        by_dtype: dict = {}
        for i in order:
            by_dtype.setdefault(dtypes[i], []).append(i)
        buckets = [tuple(v) for v in by_dtype.values()]
    else:
        decls = [(str(i), int(np.prod(shapes[i], dtype=np.int64)), dtypes[i]) for i in order]
        buckets = [tuple(int(n) for n in names) for names in plan_buckets(decls, bucket_bytes)]
    padded = []
    for b in buckets:
        n = sum(int(np.prod(shapes[i], dtype=np.int64)) for i in b)
        padded.append(-(-n // alignment) * alignment)
    return _Layout(tuple(buckets), tuple(padded))


def _with_optimizer(algo, what: str, bound: BoundStep, layout_of, check_buckets, group, group_info, mesh_signature):
    """The transformation of an algorithm that shares its optimizer's state
    (QAdam): the engine step runs on the gradients with the optimizer's
    momentum as its state, then the optimizer updates. Its state is the
    optimizer's (the step number is the optimizer's count)."""
    from bagua_jax._src import qadam

    tx = algo.optimizer
    qadam.hyperparameters_of(tx)

    def init_fn(params):
        flat, _ = jax.tree_util.tree_flatten_with_path(params)
        _check_leaves("params", flat, group_info)
        params_agreement.check_params(flat, group, what, mesh_signature)
        check_buckets([jnp.asarray(x) for _, x in flat])
        return tx.init(params)

    def update_fn(updates, state, params=None, **extra_args):
        if not isinstance(state, qadam.QAdamState):
            raise TypeError(f"{what}.update: state must be the QAdamState from init, got {type(state).__name__}")
        flat_updates, treedef = jax.tree_util.tree_flatten_with_path(updates)
        _check_leaves("updates", flat_updates, group_info)
        grads = [x for _, x in flat_updates]
        mu, mu_def = jax.tree_util.tree_flatten(state.mu)
        if mu_def != treedef:
            raise ValueError(f"{what}.update: the optimizer state and the updates have different tree structures")
        new_grads: List[Any] = [None] * len(grads)
        new_mu: List[Any] = [None] * len(grads)
        for k, bucket in enumerate(layout_of(grads).buckets):
            g_out, m_out = algorithm_step(
                [grads[i] for i in bucket], state.count, bound, state=[mu[i] for i in bucket], bucket=k
            )
            for i, g, m in zip(bucket, g_out, m_out):
                new_grads[i], new_mu[i] = g, m
        state = state._replace(mu=jax.tree_util.tree_unflatten(treedef, new_mu))
        return tx.update(jax.tree_util.tree_unflatten(treedef, new_grads), state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


_made = itertools.count()  # transforms made by this process: their default names


def transform(
    algorithm: Union[algorithms.Algorithm, str, Any],
    *,
    process_group: Optional[ProcessGroup] = None,
    name: Optional[str] = None,
    mesh: Optional[jax.sharding.Mesh] = None,
    axis_name: Union[str, Sequence[str], None] = None,
) -> optax.GradientTransformationExtraArgs:
    """Runs ``algorithm`` as an optax gradient transformation.

    Args:
      algorithm: a ``bagua_jax.algorithms`` algorithm (e.g. ``ByteGradAlgorithm()``),
        a ``bagua_core.algorithms`` description or a registered name ("bytegrad", ...).
      process_group: a ``bagua_core`` process group; default: the one
        :func:`bagua_jax.init_process_group` made.
      name: the transform's name in a ``BAGUA_TRACE`` trace (its rows); default
        ``transform<k>_<algorithm>``, k counting this process's transforms.
        With ``BAGUA_TRACE`` set, every bucket's step of every update is
        traced (:mod:`bagua_core.trace`); AsyncModelAverage's background
        averaging is not.
      mesh: for processes that drive several devices: a ``jax.sharding.Mesh``
        over this process's devices. ``update`` then takes global arrays on it
        (e.g. gradients of a batch sharded over the mesh, which XLA has
        averaged over the devices) and runs the algorithm once per process
        between processes; its results are replicated over the mesh.
      axis_name: instead of ``mesh``, for ``update`` called inside
        ``jax.shard_map``: the mesh axes of this process's devices. Gradient
        algorithms average the per-device updates over them with
        ``lax.pmean`` (XLA) before the algorithm runs between processes;
        weight algorithms expect the same params and updates on every device
        (average the gradients before the optimizer).

    Returns:
      An ``optax.GradientTransformationExtraArgs``. ``init(params)`` checks,
      on every rank at once, that all ranks hold pytrees of the same
      structure, shapes and dtypes; ``update(updates, state, params)`` works
      eagerly and inside ``jax.jit`` (``params`` is required by weight
      algorithms). Every rank must call ``transform`` and ``init`` in the same
      order: binding a hierarchical algorithm creates the intra- and
      inter-node groups collectively.

    Raises:
      GroupNotInitializedError: before ``init_process_group``.
      TypeError / KeyError: a wrong algorithm argument or unknown name.
      ValueError: the algorithm cannot run on this group (e.g. ``shift_one``
        with an odd number of peers).
    """
    algo = algorithms.as_algorithm(algorithm)
    name = name or f"transform{next(_made)}_{algo.name}"
    plan = algo.to_core().plan()
    if plan.communicates not in (GRADIENTS, WEIGHTS):
        raise NotImplementedError(f"bagua_jax.transform: {algo!r} communicates {plan.communicates}")
    what = f"bagua_jax.transform({algo!r})"
    group = groups.process_group(process_group, what)
    local_axes = local_devices.axes_of(mesh, axis_name, groups.resolve(group), what)
    if isinstance(algo, algorithms.AsyncModelAverageAlgorithm):
        from bagua_jax._src.async_average import async_transform

        warm = transform(
            algorithms.GradientAllReduceAlgorithm(hierarchical=False),
            process_group=group,
            name=f"{name} warm-up",
            axis_name=local_axes or None,  # inside the shard_map spread() below, when there is one
        )
        return local_devices.spread(
            async_transform(algo, group, what, warm, BaguaState, local_axes),
            mesh,
            local_axes,
            average_updates=False,
            what=what,
        )

    if plan.params.get("overlap_steps", 0) > 0:
        # exchanges that outlive an update run on a private clone, so later collectives on the
        # group never meet one still in flight
        group = group.clone()
    flat_group, intra, inter = algorithm_steps.step_groups(group, bool(plan.params.get("hierarchical", False)))
    comms = tuple(None if g is None else g.comm for g in (flat_group, intra, inter))
    info = algorithm_steps.check_plan(plan, group, comms=comms)
    group_info = groups.resolve(group)
    bound = BoundStep(
        plan.step,
        plan.params_text(),
        group_info,
        -1 if intra is None else groups.handle_of(intra),
        -1 if inter is None else groups.handle_of(inter),
        info.has_result,
        info.num_state,
        name,
        local_axes,
    )
    core_trace.follow_ffi_steps()
    # processes on meshes of different shapes would weigh their batches differently
    mesh_signature = local_devices.signature(local_axes)
    if mesh is not None:
        mesh_signature.append(("mesh", tuple(mesh.shape.items())))
    weights = plan.communicates == WEIGHTS
    after_step = plan.phase == AFTER_OPTIMIZER_STEP
    bucket_bytes = default_bucket_bytes()

    def init_fn(params):
        flat, _ = jax.tree_util.tree_flatten_with_path(params)
        _check_leaves("params", flat, group_info)
        params_agreement.check_params(flat, group, what, mesh_signature)
        check_tensors(algo.to_core(), [np.shape(x) for _, x in flat])
        arrays = [jnp.asarray(x) for _, x in flat]
        layout = layout_of(arrays)
        step_state = ()
        if info.num_state:
            buckets = []
            for bucket, padded, sl in zip(layout.buckets, layout.padded, check_buckets(arrays)):
                if sl.init == "copy_of_data":  # each span starts as a copy of the padded weights
                    flat_data = jnp.concatenate([jnp.ravel(arrays[i]) for i in bucket])
                    buckets.append(jnp.tile(jnp.pad(flat_data, (0, padded - flat_data.size)), sl.spans))
                else:  # zeros at first (ByteGrad's residual; low rank's error memory and Q)
                    buckets.append(jnp.zeros((sl.count,), np.dtype(sl.dtype.name)))
            step_state = tuple(buckets)
        else:
            check_buckets(arrays)
        return BaguaState(step=jnp.zeros([], jnp.int32), step_state=step_state)

    state_layouts: dict = {}

    def state_layout_of(bucket_leaves: List[Any], padded: int) -> algorithm_steps.StateLayout:
        """The step's state block on a bucket of these leaves (once per bucket layout)."""
        key = (str(np.dtype(bucket_leaves[0].dtype)), tuple(tuple(np.shape(x)) for x in bucket_leaves), padded)
        if key not in state_layouts:
            state_layouts[key] = algorithm_steps.state_layout(plan, comms, key[0], key[1], padded)
        return state_layouts[key]

    def check_buckets(arrays: List[Any]) -> List[algorithm_steps.StateLayout]:
        """The step's state layout on each bucket of these leaves; the engine
        checks each bucket (dtype, size) here, at init, not at the first step."""
        layout = layout_of(arrays)
        return [state_layout_of([arrays[i] for i in b], padded) for b, padded in zip(layout.buckets, layout.padded)]

    def layout_of(leaves: List[Any]) -> _Layout:
        return _layout(
            tuple(tuple(x.shape) for x in leaves),
            tuple(str(np.dtype(x.dtype)) for x in leaves),
            plan.one_bucket_per_dtype,
            bucket_bytes,
            info.alignment,
        )

    def fit_state(leaves: List[Any], step_state: Tuple[Any, ...]) -> Tuple[Any, ...]:
        """``step_state`` in these leaves' buckets: a data-shaped state saved
        under another BAGUA_BUCKET_SIZE is moved tensor by tensor."""
        layouts = check_buckets(leaves)
        expected = [(sl.count,) for sl in layouts]
        held = [tuple(np.shape(x)) for x in step_state]
        if held == expected:
            return step_state
        try:
            relaid = relayout(leaves, step_state, layouts)
        except ValueError as e:
            raise ValueError(
                f"{what}.update: the state does not fit these leaves: it holds per-bucket states of "
                f"shapes {held}, these leaves make buckets needing {expected} under "
                f"BAGUA_BUCKET_SIZE={bucket_bytes}, and it is not theirs under another bucket size ({e}). "
                "A state made for other params, or on another number of ranks, does not restore: "
                "init a new state"
            ) from None
        logger.info("%s: a state of %d buckets laid out for these %d buckets", what, len(held), len(expected))
        return relaid

    def relayout(leaves: List[Any], step_state: Tuple[Any, ...], layouts) -> Tuple[Any, ...]:
        if not all(sl.data_shaped for sl in layouts):
            raise ValueError(f"{algo.name}'s state is laid out its own way, not tensor by tensor")
        spans = layouts[0].spans
        if any(np.ndim(x) != 1 or np.shape(x)[0] % spans for x in step_state):
            raise ValueError(f"each bucket's state is {spans} spans of its padded size")
        numel_of = {i: int(np.prod(np.shape(x), dtype=np.int64)) for i, x in enumerate(leaves)}
        registration = reversed(range(len(leaves)))  # as _layout declares them
        decls = [(i, numel_of[i], str(np.dtype(leaves[i].dtype))) for i in registration]
        sizes = [(str(np.dtype(x.dtype)), np.shape(x)[0] // spans) for x in step_state]
        saved = state_relayout.saved_buckets(decls, sizes, info.alignment)
        out = []
        for bucket_moves, padded, sl in zip(
            state_relayout.moves(saved, layout_of(leaves).buckets, numel_of), layout_of(leaves).padded, layouts
        ):
            used = sum(m.count for m in bucket_moves)
            parts = []
            for s in range(spans):
                for m in bucket_moves:
                    start = s * sizes[m.source][1] + m.source_offset
                    parts.append(step_state[m.source][start : start + m.count])
                parts.append(jnp.zeros((padded - used,), np.dtype(sl.dtype.name)))
            out.append(jnp.concatenate(parts))
        return tuple(out)

    def communicate(leaves: List[Any], step, step_state) -> Tuple[List[Any], Tuple[Any, ...]]:
        out: List[Any] = [None] * len(leaves)
        new_state: List[Any] = []
        layout = layout_of(leaves)
        if info.num_state:
            step_state = fit_state(leaves, tuple(step_state))
        for k, bucket in enumerate(layout.buckets):
            state: Tuple[Any, ...] = (step_state[k],) if info.num_state else ()
            results, state = algorithm_step([leaves[i] for i in bucket], step, bound, state=state, bucket=k)
            new_state.extend(state)
            for i, r in zip(bucket, results):
                out[i] = r
        return out, tuple(new_state)

    if plan.optimizer_state:
        return local_devices.spread(
            _with_optimizer(algo, what, bound, layout_of, check_buckets, group, group_info, mesh_signature),
            mesh,
            local_axes,
            average_updates=True,
            what=what,
        )

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        if not isinstance(state, BaguaState):
            raise TypeError(f"{what}.update: state must be the BaguaState from init, got {type(state).__name__}")
        if weights and params is None:
            raise ValueError(
                f"{what}.update needs params: {algo.name} averages the weights. Call "
                "tx.update(grads, state, params) and place the transform after the optimizer, "
                "e.g. optax.chain(optax.sgd(lr), bagua_jax.transform(...))"
            )
        flat_updates, treedef = jax.tree_util.tree_flatten_with_path(updates)
        _check_leaves("updates", flat_updates, group_info)
        update_leaves = [x for _, x in flat_updates]
        if weights:
            flat_params, params_def = jax.tree_util.tree_flatten_with_path(params)
            if params_def != treedef:
                raise ValueError(f"{what}.update: params and updates have different tree structures")
            _check_leaves("params", flat_params, group_info)
            param_leaves = [x for _, x in flat_params]
            if after_step:
                # the step runs on the weights the optimizer made, x + u, in the weights' dtype
                stepped = [jnp.asarray(p + u).astype(p.dtype) for u, p in zip(update_leaves, param_leaves)]
                new, step_state = communicate(stepped, state.step, state.step_state)
                new_leaves = [(n - p).astype(u.dtype) for u, n, p in zip(update_leaves, new, param_leaves)]
            else:
                averaged, step_state = communicate(param_leaves, state.step, state.step_state)
                # x + (u + (avg - x)) == avg + u: the optimizer's update applied to the average
                new_leaves = [(u + (a - p).astype(u.dtype)) for u, a, p in zip(update_leaves, averaged, param_leaves)]
        else:
            new_leaves, step_state = communicate(update_leaves, state.step, state.step_state)
        return (
            jax.tree_util.tree_unflatten(treedef, new_leaves),
            BaguaState(step=state.step + jnp.asarray(1, jnp.int32), step_state=step_state),
        )

    return local_devices.spread(
        optax.GradientTransformationExtraArgs(init_fn, update_fn),
        mesh,
        local_axes,
        average_updates=not weights,
        what=what,
    )
