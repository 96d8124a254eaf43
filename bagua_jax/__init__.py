"""Bagua for JAX: collectives on jax arrays that work eagerly and inside
``jax.jit``, through XLA FFI handlers of the Bagua engine.

    import bagua_jax
    bagua_jax.init()                      # default process group from the environment

    @jax.jit
    def step(grads):
        return bagua_jax.allreduce(grads, op="avg")

Sharp bits:

- Collectives keep program order on every rank (an ordered effect threads a
  token through them, across jitted calls too), so XLA cannot swap
  data-independent collectives. That order covers bagua_jax calls only: before
  calling ``bagua_core`` collectives directly on the same group, wait for the
  pending JAX work (``jax.effects_barrier()``).
- A failure inside a jitted collective (dead peer, timeout) is raised by JAX as
  ``jax.errors.JaxRuntimeError`` when the result is used; its message starts
  with the XLA status and names the engine error, e.g.
  ``UNAVAILABLE: bagua allreduce: PeerError: ...`` (``DEADLINE_EXCEEDED`` for
  ``CommTimeoutError``).
- The group's communicator is read when a function is traced: after
  ``bagua_core.destroy_process_group()`` and a new ``init()``, functions jitted
  before fail with a clear error; jit them again.
"""

from bagua_core import ReduceOp

from bagua_jax._src.ffi import register_targets as _register_targets
from bagua_jax._src.groups import GroupNotInitializedError, init
from bagua_jax._src.collective_ops.allgather import allgather
from bagua_jax._src.collective_ops.allreduce import allreduce
from bagua_jax._src.collective_ops.broadcast import broadcast

_register_targets()

__all__ = [
    "GroupNotInitializedError",
    "ReduceOp",
    "allgather",
    "allreduce",
    "broadcast",
    "init",
]
