"""Bagua in processes that drive several devices (a Mesh over the host's
devices, global arrays, shard_map).

Inside a process, XLA's own collectives over the process's devices (the
mesh axes); between processes, Bagua's algorithm through the engine, called
once per process. Under shard_map every device runs the program, so the
engine call is guarded: the device at index 0 of every local axis (the
leader) runs it, the others pass their operands through, and the leader's
results reach every device by ``collective_ops.leader_broadcast`` (on CPU a
copy from the leader's buffers, on GPUs XLA's collective-broadcast).

Two ways in, both through :func:`bagua_jax.transform`:

* ``mesh=``: ``tx.update`` takes global arrays (under ``jax.jit`` or
  eagerly); it runs as a ``shard_map`` over the mesh with every input
  replicated (XLA gathers sharded ones), so the algorithm sees each
  process's whole value, e.g. the gradient XLA has already averaged over the
  host's batch shards;
* ``axis_name=``: ``tx.update`` is called inside the user's ``shard_map``;
  gradient algorithms first average the per-device updates over the axes
  with ``lax.pmean``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import jax
import optax
from jax import lax
from jax.sharding import Mesh, PartitionSpec

from bagua_jax import _compat
from bagua_jax._src import validation
from bagua_jax._src.collective_ops.leader_broadcast import leader_broadcast
from bagua_jax._src.groups import GroupInfo


def axes_of(
    mesh: Optional[Mesh], axis_name: Union[str, Sequence[str], None], group: GroupInfo, what: str
) -> Tuple[str, ...]:
    """The local axes ``transform`` spreads over: the mesh's, the given
    names, or none (one device per process)."""
    if mesh is not None and axis_name is not None:
        raise ValueError(
            f"{what}: pass mesh= (tx.update on global arrays) or axis_name= (tx.update inside shard_map), not both"
        )
    if mesh is not None:
        check_mesh(mesh, group, what)
        return tuple(mesh.axis_names)
    if axis_name is None:
        return ()
    names = (axis_name,) if isinstance(axis_name, str) else axis_name
    if not isinstance(names, (tuple, list)) or not names or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"{what}: axis_name must be a mesh axis name or a sequence of them, got {axis_name!r}")
    return tuple(names)


def check_mesh(mesh: Any, group: GroupInfo, what: str) -> None:
    """A Mesh over all of this process's devices and no other's, on the group's platform."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{what}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    me = jax.process_index()
    others = sorted({d.process_index for d in mesh.devices.flat} - {me})
    if others:
        raise ValueError(
            f"{what}: the mesh holds devices of processes {others}; Bagua's algorithm runs between "
            "processes and XLA inside one, so build the mesh over this process's devices: "
            "Mesh(np.array(jax.local_devices()), ('data',))"
        )
    if mesh.devices.size != jax.local_device_count():
        raise ValueError(
            f"{what}: the mesh holds {mesh.devices.size} of this process's {jax.local_device_count()} "
            "devices; Bagua runs once per process over all of them: build the mesh over "
            "jax.local_devices() (or start one process per group of devices)"
        )
    validation.check_platform(f"transform (mesh {dict(mesh.shape)})", {d.platform for d in mesh.devices.flat}, group)


def signature(axes: Tuple[str, ...]) -> list:
    """What ``init`` checks every process agrees on: how many devices each
    drives (unequal counts would weigh the processes' batches unequally)."""
    return [("devices per process", jax.local_device_count())] if axes else []


def _check_bound(axes: Tuple[str, ...], what: str) -> None:
    for name in axes:
        try:
            lax.axis_index(name)
        except NameError:
            raise ValueError(
                f"{what}: axis {name!r} is not bound here; with axis_name=, call tx.update inside "
                f"jax.shard_map over a mesh with axis {name!r} (or pass mesh= and call it on global arrays)"
            ) from None
    others = [a for a in _compat.manual_axes() if a not in axes]
    if others:  # one leader per index of those axes: several devices of the process would call the engine
        raise ValueError(
            f"{what}: the shard_map also splits the devices along {others}, which axis_name={axes} does not "
            "name; Bagua runs once per process, so name every axis of the process's devices (model-parallel "
            "axes are not supported)"
        )
    size = math.prod(lax.axis_size(a) for a in axes)
    if size != jax.local_device_count():
        raise ValueError(
            f"{what}: the shard_map's axes {axes} span {size} devices, this process has "
            f"{jax.local_device_count()}; Bagua runs once per process over all of its devices "
            "(init checked every process has as many): shard_map over a mesh of jax.local_devices()"
        )


def _check_on_mesh(trees: dict, mesh: Mesh, what: str) -> None:
    """Concrete arrays committed to devices other than the mesh's (e.g. a
    process-local array on one device): an error that names the fix."""
    devices = set(mesh.devices.flat)
    leaves = [
        (name + jax.tree_util.keystr(p), x)
        for name, t in trees.items()
        for p, x in jax.tree_util.tree_leaves_with_path(t)
    ]
    for name, leaf in leaves:
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer) and leaf.committed:
            if leaf.sharding.device_set != devices:
                raise ValueError(
                    f"{what}.update: {name} lives on "
                    f"{sorted(d.id for d in leaf.sharding.device_set)}, not on the mesh's devices "
                    f"{sorted(d.id for d in devices)}: give transform(mesh=) global arrays on its mesh, "
                    "e.g. jax.device_put(x, NamedSharding(mesh, P()))"
                )


def run_once(call: Callable[[list], list], operands: Sequence[Any], axes: Tuple[str, ...]) -> list:
    """``call(operands)``, which returns arrays shaped as ``operands``, run
    by the leader device only; every device gets the leader's results."""
    if not axes:
        return list(call(list(operands)))
    out = lax.cond(lax.axis_index(axes) == 0, lambda ops: list(call(ops)), lambda ops: list(ops), list(operands))
    return leader_broadcast(out, axes)


def spread(
    tx: optax.GradientTransformationExtraArgs,
    mesh: Optional[Mesh],
    axes: Tuple[str, ...],
    *,
    average_updates: bool,
    what: str,
) -> optax.GradientTransformationExtraArgs:
    """``tx`` (whose engine steps run through :func:`run_once` over ``axes``)
    as the user calls it: on global arrays over ``mesh``, or inside shard_map."""
    if not axes:
        return tx
    if mesh is not None:
        replicated = PartitionSpec()

        def update_on_mesh(updates, state, params=None, **extra_args):
            _check_on_mesh({"updates": updates, "state": state, "params": params}, mesh, what)
            # every input replicated over the mesh: the engine sees the process's whole value
            run = jax.shard_map(
                lambda u, s, p, e: tx.update(u, s, p, **e),
                mesh=mesh,
                in_specs=(replicated,) * 4,
                out_specs=(replicated, replicated),
                check_vma=False,
            )
            return run(updates, state, params, extra_args)

        return optax.GradientTransformationExtraArgs(tx.init, update_on_mesh)

    def update_in_shard_map(updates, state, params=None, **extra_args):
        _check_bound(axes, what)
        if average_updates:  # XLA averages the devices' gradients; the engine, the processes'
            updates = jax.tree_util.tree_map(lambda g: lax.pmean(g, axes), updates)
        return tx.update(updates, state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(tx.init, update_in_shard_map)
