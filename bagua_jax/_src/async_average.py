"""Asynchronous model average as an optax transformation.

``bagua_jax.transform(AsyncModelAverageAlgorithm(...))`` goes *after* the
optimizer and needs ``params``. Its state is not all functional: the weights
the background loop averages live in host buckets owned by the algorithm
object (bound by ``init``), next to the loop itself
(:class:`bagua_core.averager.AsyncAverager`, on its own clone of the group).
The optax state (:class:`BaguaState`) holds only the step counter.

``update(updates, state, params)``, eagerly or inside ``jax.jit``:

* steps ``t < warmup_steps``: the optimizer's updates are averaged over the
  ranks (``GradientAllReduce``, mean; for SGD that is the gradients' mean
  times ``-lr``), so the weights stay equal everywhere;
* afterwards, under the weight lock: the new weights are the loop's current
  weights (``params``, averaged since) plus the optimizer's updates; the
  returned updates take ``params`` there (``optax.apply_updates`` gives
  exactly the weights the loop then holds). The first such step starts the
  loop.

Both are the engine's (``csrc/sched/async_weights.h``), reached through the
``bagua_async_step`` FFI target, ordered with Bagua's other collectives like
every step. The host copies are read and written by the step only; what
reads them from Python (:meth:`abort`, :meth:`resume`, a new ``init``) first
waits for the steps already dispatched (``jax.effects_barrier``).
``algorithm.abort(params)`` (every rank) stops the loop and returns the
averaged weights, the same on every rank; ``algorithm.resume(params)``
restarts it from ``params``.
"""

from __future__ import annotations

import weakref
from typing import Any, List

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from bagua_core import _C, algorithm_steps
from bagua_core.averager import AsyncAverager, weight_buckets
from bagua_jax._src import local_devices, params_agreement
from bagua_jax._src.collective_ops.async_step import async_step


class AsyncBinding:
    """What ``init`` binds to the algorithm: the host buckets holding the
    weights of a pytree, the background loop, and the engine's training step
    on them (``_C.AsyncWeights``, reached by ``handle`` from jitted code)."""

    def __init__(self, group, plan, params, warmup_steps: int, handle: int):
        leaves, self.treedef = jax.tree_util.tree_flatten(params)
        self.dtypes = [np.dtype(x.dtype) for x in leaves]
        self.shapes = [tuple(np.shape(x)) for x in leaves]
        order = list(reversed(range(len(leaves))))  # bagua_torch's bucket order
        self.buckets = weight_buckets([(str(i), tuple(np.shape(leaves[i])), self.dtypes[i]) for i in order])
        views, slots = {}, {}
        for b in self.buckets:
            for name in b.slot_names:
                views[int(name)] = np.asarray(b.view(name)).view(self.dtypes[int(name)])
                slots[int(name)] = (b, name)
        self.views = [views[i] for i in range(len(leaves))]
        self.write(leaves)
        self.averager = AsyncAverager(group, self.buckets, plan)
        self.core = _C.AsyncWeights(self.averager.core, [slots[i] for i in range(len(leaves))], warmup_steps)
        _C.rebind_async_weights(handle, self.core)  # the old binding's buffers go with it
        self.handle = handle

    def leaves_of(self, tree: Any, what: str) -> List[Any]:
        """The leaves of ``tree``, which must match those given to init in
        order and shape; its nodes may differ (``nnx.Optimizer`` gives init
        ``nnx.Param``-wrapped state and update plain arrays)."""
        leaves = jax.tree_util.tree_leaves(tree)
        if [tuple(np.shape(x)) for x in leaves] != self.shapes:
            raise ValueError(f"{what}: the pytree's leaves must have the shapes of those given to init, in order")
        return leaves

    @staticmethod
    def settle() -> None:
        """Waits for the training steps already dispatched."""
        jax.effects_barrier()

    def write(self, leaves: List[Any]) -> None:
        for view, x in zip(self.views, leaves):
            view[...] = np.asarray(x)

    def read(self) -> List[Any]:
        return [jnp.array(np.array(view)) for view in self.views]

    def tree(self):
        return jax.tree_util.tree_unflatten(self.treedef, self.read())

    @property
    def started(self) -> bool:
        """Whether a training step started the loop."""
        return bool(self.core.started)

    def close(self) -> None:
        self.settle()
        self.averager.close()


def _handle_of(algo) -> int:
    """The algorithm's handle for jitted code: one per algorithm object, so a
    step jitted before a new ``init`` reaches the new binding; freed with the
    object."""
    handle = algo.__dict__.get("_async_handle")
    if handle is None:
        handle = int(_C.register_async_weights(None))
        algo.__dict__["_async_handle"] = handle
        weakref.finalize(algo, _C.unregister_async_weights, handle)
    return handle


def async_transform(algo, group, what: str, warmup, state_type, local_axes=()) -> optax.GradientTransformationExtraArgs:
    """The transformation of ``algo`` (an AsyncModelAverageAlgorithm) on
    ``group``; ``warmup`` is the GradientAllReduce transformation of its
    warm-up; ``state_type`` the transform's state class (BaguaState);
    ``local_axes``: the process's device axes, over which the step runs once
    (``local_devices.run_once``; the caller spreads the transform over them)."""
    description = algo.to_core()
    plan = description.plan()
    algorithm_steps.check_plan(plan, group)

    def init_fn(params):
        flat, _ = jax.tree_util.tree_flatten_with_path(params)
        if any(isinstance(x, jax.core.Tracer) for _, x in flat):
            raise TypeError(f"{what}.init cannot run inside jax.jit: it binds host buffers to the weights")
        params_agreement.check_params(flat, group, what)
        warmup.init(params)  # checks the leaves (floating arrays on the group's platform)
        old = algo.__dict__.get("_binding")
        if old is not None:
            old.close()  # after the steps in flight, which still write its buffers
        algo._bind(AsyncBinding(group, plan, params, description.warmup_steps, _handle_of(algo)))
        return state_type(step=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        if not isinstance(state, state_type):
            raise TypeError(f"{what}.update: state must be the BaguaState from init, got {type(state).__name__}")
        if params is None:
            raise ValueError(
                f"{what}.update needs params: it averages the weights. Call "
                "tx.update(grads, state, params) and place the transform after the optimizer, "
                "e.g. optax.chain(optax.sgd(lr), bagua_jax.transform(...))"
            )
        binding = algo._binding_of(what)
        treedef = jax.tree_util.tree_structure(updates)
        param_leaves = binding.leaves_of(params, f"{what}.update (params)")
        update_leaves = binding.leaves_of(updates, f"{what}.update (updates)")
        for i, (p, dtype) in enumerate(zip(param_leaves, binding.dtypes)):
            if np.dtype(p.dtype) != dtype:
                raise TypeError(f"{what}.update: params leaf {i} is {np.dtype(p.dtype)}, init was given {dtype}")
        # the engine's step takes updates in the weights' dtype
        stepped = [jnp.asarray(u).astype(d) for u, d in zip(update_leaves, binding.dtypes)]
        if description.warmup_steps > 0:

            def warm(ups):
                averaged, _ = warmup.update(ups, state_type(step=state.step), params)
                return jax.tree_util.tree_leaves(averaged)

            stepped = lax.cond(state.step < description.warmup_steps, warm, lambda ups: list(ups), stepped)
        new_updates = local_devices.run_once(
            lambda ups: async_step(state.step, param_leaves, ups, handle=binding.handle, per_device=bool(local_axes)),
            stepped,
            tuple(local_axes),
        )
        new_updates = [n.astype(u.dtype) for n, u in zip(new_updates, update_leaves)]
        return (
            jax.tree_util.tree_unflatten(treedef, new_updates),
            state_type(step=state.step + jnp.asarray(1, jnp.int32)),
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
