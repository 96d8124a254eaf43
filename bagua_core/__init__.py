"""Bagua engine: process groups, communicators and collectives on any DLPack array.

This package imports neither torch nor jax; the frontends ``bagua_torch`` and
``bagua_jax`` build on it. Typical use (launched by ``bagua-run`` or torchrun)::

    import numpy as np, bagua_core as bc
    bc.init_process_group()
    x = np.full(4, bc.get_rank(), np.float32)
    bc.allreduce_inplace(x, op=bc.ReduceOp.SUM)
"""

import importlib
from typing import TYPE_CHECKING

# The communication primitives (defined in bagua_core.comm), in the order the
# packages list them: the one list of their names. The __all__ of bagua_core,
# bagua_torch, bagua_torch.communication and bagua.torch_api.communication
# are built from it, so a new primitive is named here once.
PRIMITIVES = (
    "send",
    "recv",
    "broadcast",
    "broadcast_object",
    "reduce",
    "reduce_inplace",
    "allreduce",
    "allreduce_inplace",
    "allgather",
    "allgather_inplace",
    "gather",
    "gather_inplace",
    "scatter",
    "scatter_inplace",
    "reduce_scatter",
    "reduce_scatter_inplace",
    "alltoall",
    "alltoall_inplace",
    "alltoall_v",
    "alltoall_v_inplace",
    "barrier",
)

# Public names and the submodule that defines each. They load on first use, so
# that light entry points (the launcher `bagua-run`, settings) import neither
# the extension nor numpy.
_EXPORTS = {
    "process_group": [
        "ProcessGroup",
        "destroy_process_group",
        "get_default_group",
        "get_local_rank",
        "get_local_world_size",
        "get_node_rank",
        "get_rank",
        "get_world_size",
        "init_process_group",
        "is_initialized",
        "new_group",
    ],
    "comm": ["ReduceOp", *PRIMITIVES],
    "buffer": ["Buffer", "empty", "from_array", "zeros"],
    "dlpack": ["DLPackView", "import_array"],
    "dtypes": ["DType", "as_dtype"],
    "errors": ["BaguaError", "CommTimeoutError", "ConcurrentUseError", "MismatchError", "PeerError"],
    "_loader": ["_C"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

if TYPE_CHECKING:  # what type checkers see of _EXPORTS (test_type_checkers_see_every_lazy_name)
    from bagua_core._loader import _C
    from bagua_core.buffer import Buffer, empty, from_array, zeros
    from bagua_core.comm import (
        ReduceOp,
        allgather,
        allgather_inplace,
        allreduce,
        allreduce_inplace,
        alltoall,
        alltoall_inplace,
        alltoall_v,
        alltoall_v_inplace,
        barrier,
        broadcast,
        broadcast_object,
        gather,
        gather_inplace,
        recv,
        reduce,
        reduce_inplace,
        reduce_scatter,
        reduce_scatter_inplace,
        scatter,
        scatter_inplace,
        send,
    )
    from bagua_core.dlpack import DLPackView, import_array
    from bagua_core.dtypes import DType, as_dtype
    from bagua_core.errors import BaguaError, CommTimeoutError, ConcurrentUseError, MismatchError, PeerError
    from bagua_core.process_group import (
        ProcessGroup,
        destroy_process_group,
        get_default_group,
        get_local_rank,
        get_local_world_size,
        get_node_rank,
        get_rank,
        get_world_size,
        init_process_group,
        is_initialized,
        new_group,
    )


def __getattr__(name):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'bagua_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"bagua_core.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_MODULE_OF))


__version__ = "0.1.0"

__all__ = [
    # process groups
    "init_process_group",
    "is_initialized",
    "destroy_process_group",
    "new_group",
    "get_default_group",
    "ProcessGroup",
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    # primitives
    "ReduceOp",
    *PRIMITIVES,
    # arrays
    "Buffer",
    "empty",
    "zeros",
    "from_array",
    "DType",
    "as_dtype",
    "DLPackView",
    "import_array",
    # errors
    "BaguaError",
    "CommTimeoutError",
    "PeerError",
    "MismatchError",
    "ConcurrentUseError",
]
