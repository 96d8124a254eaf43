"""Asynchronous model average as an optax transformation (eager only).

``bagua_jax.transform(AsyncModelAverageAlgorithm(...))`` goes *after* the
optimizer and needs ``params``. Its state is not all functional: the weights
the background loop averages live in host buckets owned by the algorithm
object (bound by ``init``), next to the loop itself
(:class:`bagua_core.averager.AsyncAverager`, on its own clone of the group).
The optax state (:class:`BaguaState`) holds only the step counter.

``update(updates, state, params)``:

* steps ``t < warmup_steps``: the optimizer's updates are averaged over the
  ranks (``GradientAllReduce``, mean; for SGD that is the gradients' mean
  times ``-lr``), so the weights stay equal everywhere;
* afterwards, under the weight lock: the new weights are the loop's current
  weights (``params``, averaged since) plus the optimizer's updates; the
  returned updates take ``params`` there (``optax.apply_updates`` gives
  exactly the weights the loop then holds). The first such step starts the
  loop.

It runs on concrete arrays only: the background loop reads and writes host
memory between steps, which a compiled program cannot do. Jit the gradient
computation and call ``tx.update`` / ``optax.apply_updates`` outside ``jit``;
inside ``jit`` it raises ``TypeError``. ``algorithm.abort(params)`` (every
rank) stops the loop and returns the averaged weights, the same on every
rank; ``algorithm.resume(params)`` restarts it from ``params``.
"""

from __future__ import annotations

from typing import Any, List

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bagua_core import algorithm_steps
from bagua_core.averager import AsyncAverager, weight_buckets
from bagua_jax._src import params_agreement

NEW, RUNNING, STOPPED = "new", "running", "stopped"


class AsyncBinding:
    """What ``init`` binds to the algorithm: the host buckets holding the
    weights of a pytree, the background loop, and its status."""

    def __init__(self, group, plan, params):
        leaves, self.treedef = jax.tree_util.tree_flatten(params)
        self.dtypes = [np.dtype(x.dtype) for x in leaves]
        self.shapes = [tuple(np.shape(x)) for x in leaves]
        order = list(reversed(range(len(leaves))))  # bagua_torch's bucket order
        self.buckets = weight_buckets([(str(i), tuple(np.shape(leaves[i])), self.dtypes[i]) for i in order])
        views = {}
        for b in self.buckets:
            for name in b.slot_names:
                views[int(name)] = np.asarray(b.view(name)).view(self.dtypes[int(name)])
        self.views = [views[i] for i in range(len(leaves))]
        self.write(leaves)
        self.averager = AsyncAverager(group, self.buckets, plan)
        self.status = NEW

    def leaves_of(self, tree: Any, what: str) -> List[Any]:
        """The leaves of ``tree``, which must match those given to init in
        order and shape; its nodes may differ (``nnx.Optimizer`` gives init
        ``nnx.Param``-wrapped state and update plain arrays)."""
        leaves = jax.tree_util.tree_leaves(tree)
        if [tuple(np.shape(x)) for x in leaves] != self.shapes:
            raise ValueError(f"{what}: the pytree's leaves must have the shapes of those given to init, in order")
        return leaves

    def write(self, leaves: List[Any]) -> None:
        for view, x in zip(self.views, leaves):
            view[...] = np.asarray(x)

    def read(self) -> List[Any]:
        return [jnp.array(np.array(view)) for view in self.views]

    def tree(self):
        return jax.tree_util.tree_unflatten(self.treedef, self.read())

    def close(self) -> None:
        self.averager.close()


def _is_traced(*trees) -> bool:
    return any(isinstance(x, jax.core.Tracer) for t in trees for x in jax.tree_util.tree_leaves(t))


def async_transform(algo, group, what: str, warmup, state_type) -> optax.GradientTransformationExtraArgs:
    """The transformation of ``algo`` (an AsyncModelAverageAlgorithm) on
    ``group``; ``warmup`` is the GradientAllReduce transformation of its
    warm-up; ``state_type`` the transform's state class (BaguaState)."""
    description = algo.to_core()
    plan = description.plan()
    algorithm_steps.check_plan(plan, group)

    def init_fn(params):
        flat, _ = jax.tree_util.tree_flatten_with_path(params)
        if _is_traced(params):
            raise TypeError(f"{what}.init cannot run inside jax.jit: it binds host buffers to the weights")
        params_agreement.check_params(flat, group, what)
        warmup.init(params)  # checks the leaves (floating arrays on the group's platform)
        algo._bind(AsyncBinding(group, plan, params))
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
        if _is_traced(updates, state, params):
            raise TypeError(
                f"{what} cannot run inside jax.jit (or another JAX transformation): its background loop "
                "averages host copies of the weights between steps. Jit the gradient computation and call "
                "tx.update and optax.apply_updates outside jit"
            )
        binding = algo._binding_of(what)
        treedef = jax.tree_util.tree_structure(updates)
        param_leaves = binding.leaves_of(params, f"{what}.update (params)")
        update_leaves = binding.leaves_of(updates, f"{what}.update (updates)")
        step = int(state.step)
        if step < description.warmup_steps:
            averaged, _ = warmup.update(updates, state_type(step=state.step), params)
            new_updates = jax.tree_util.tree_leaves(averaged)
            binding.write([jnp.asarray(p + u).astype(p.dtype) for p, u in zip(param_leaves, new_updates)])
        else:
            if binding.status == NEW:
                binding.averager.start()
                binding.status = RUNNING
            with binding.averager.weights_locked():
                current = binding.read()  # params, as averaged since the last step
                new_updates = [
                    ((c + u).astype(c.dtype) - p).astype(u.dtype)
                    for c, u, p in zip(current, update_leaves, param_leaves)
                ]
                # exactly what optax.apply_updates will compute
                binding.write([jnp.asarray(p + u).astype(p.dtype) for p, u in zip(param_leaves, new_updates)])
        return (
            jax.tree_util.tree_unflatten(treedef, new_updates),
            state_type(step=state.step + jnp.asarray(1, jnp.int32)),
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
