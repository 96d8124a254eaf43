"""Bagua for JAX: Bagua's algorithms as an optax transformation, and
collectives on jax arrays; both work eagerly and inside ``jax.jit``, through
XLA FFI handlers of the Bagua engine::

    import bagua_jax, optax
    bagua_jax.init_process_group()        # default process group from the environment
    tx = optax.chain(bagua_jax.transform(bagua_jax.ByteGradAlgorithm()), optax.adam(1e-3))
    state = tx.init(params)

    @jax.jit
    def train_step(params, state, batch):
        grads = jax.grad(loss)(params, batch)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

Gradient algorithms go before the optimizer in the chain; weight algorithms
(``DecentralizedAlgorithm``) go after it and need ``params``.
``AsyncModelAverageAlgorithm`` goes after it too (a background loop averages
host copies of the weights, which its update reads and writes, also inside
``jax.jit``; see ``bagua_jax._src.async_average``).

On GPUs: collectives and transform steps on arrays on a CUDA device run
through the CUDA handlers (built when bagua_core was built with CUDA;
``bagua_core._C.has_cuda_ffi``), which enqueue their work on XLA's stream
inside the jitted program, on an NCCL group or on a Gloo group, whose
communicator is then staged through pinned host memory on this process's
first GPU (it first waits for XLA's stream; a warning once). CPU arrays on an
NCCL group are refused with a ValueError. The step number of a transform is counted
on the host per bucket (read from the device once, then checked against it
asynchronously; see csrc/ffi/cuda_handlers.cc), so the step never waits for
XLA's stream.

GPU memory: XLA preallocates 75% of the GPU's memory when JAX first uses it,
but NCCL (its communicators' buffers) and Bagua (step scratch, gathered
buckets, pinned staging of Gloo groups) allocate outside XLA's pool. Leave them
room: set ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (allocate on demand) or
lower ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (e.g. ``.6``) before JAX initialises
the GPU, or NCCL and Bagua fail with CUDA out-of-memory errors.

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
  ``bagua_core.destroy_process_group()`` and a new ``init_process_group()``, functions jitted
  before fail with a clear error; jit them again.
"""

from typing import TYPE_CHECKING

from bagua_core import ReduceOp
from bagua_jax import algorithms, checkpoint, live
from bagua_jax._src.collective_ops.allgather import allgather
from bagua_jax._src.collective_ops.allreduce import allreduce
from bagua_jax._src.collective_ops.broadcast import broadcast
from bagua_jax._src.distributed import BaguaLaunchCluster as _BaguaLaunchCluster
from bagua_jax._src.ffi import register_targets as _register_targets
from bagua_jax._src.groups import GroupNotInitializedError, init, init_process_group
from bagua_jax._src.params_agreement import broadcast_params
from bagua_jax._src.qadam import QAdamState, qadam
from bagua_jax._src.transform import BaguaState, transform

_register_targets()

# Every algorithm class (GradientAllReduceAlgorithm, ...), one per registered description.
_ALGORITHM_CLASSES = algorithms.Algorithm.classes()
globals().update(_ALGORITHM_CLASSES)
if TYPE_CHECKING:  # what type checkers see of the line above (its names are computed)
    from bagua_jax.algorithms import *  # noqa: F403

__all__ = [
    *_ALGORITHM_CLASSES,
    "BaguaState",
    "GroupNotInitializedError",
    "QAdamState",
    "ReduceOp",
    "algorithms",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_params",
    "checkpoint",
    "init",
    "live",
    "qadam",
    "init_process_group",
    "transform",
]
