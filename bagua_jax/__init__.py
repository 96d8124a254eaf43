"""Bagua for JAX: collectives on jax arrays that work eagerly and inside
``jax.jit``, through XLA FFI handlers of the Bagua engine.

    import bagua_jax
    bagua_jax.init()                      # default process group from the environment

    @jax.jit
    def step(grads):
        return bagua_jax.allreduce(grads, op="avg")

Collectives keep program order on every rank (an ordered effect threads a token
through them), so data-independent collectives cannot be swapped by XLA.
"""

from bagua_jax._src.ffi import register_targets as _register_targets
from bagua_jax._src.groups import GroupNotInitializedError, init
from bagua_jax._src.collective_ops.allgather import allgather
from bagua_jax._src.collective_ops.allreduce import allreduce
from bagua_jax._src.collective_ops.broadcast import broadcast

_register_targets()

__all__ = [
    "GroupNotInitializedError",
    "allgather",
    "allreduce",
    "broadcast",
    "init",
]
