"""Bagua for PyTorch.

Two lines turn a model data-parallel (launched by ``bagua-run`` or torchrun)::

    import bagua_torch
    from bagua_torch.algorithms import GradientAllReduceAlgorithm

    bagua_torch.init_process_group()
    model = model.with_bagua([optimizer], GradientAllReduceAlgorithm())

then train as usual (``loss.backward(); optimizer.step()``). Or wrap like
torch's DDP: ``bagua_torch.DistributedDataParallel(model, optimizers=[opt],
algorithm=ByteGradAlgorithm())`` (with ``no_sync()``). Communication
primitives on torch tensors are here and in :mod:`bagua_torch.communication`.
"""

from bagua_core import PRIMITIVES
from bagua_torch import algorithms, live

# "name as name": an explicit re-export, which type checkers see without
# reading __all__ (they cannot expand the names it takes from PRIMITIVES).
from bagua_torch.communication import (
    ReduceOp as ReduceOp,
    allgather as allgather,
    allgather_inplace as allgather_inplace,
    allreduce as allreduce,
    allreduce_inplace as allreduce_inplace,
    alltoall as alltoall,
    alltoall_inplace as alltoall_inplace,
    alltoall_v as alltoall_v,
    alltoall_v_inplace as alltoall_v_inplace,
    barrier as barrier,
    broadcast as broadcast,
    broadcast_object as broadcast_object,
    gather as gather,
    gather_inplace as gather_inplace,
    get_local_rank as get_local_rank,
    get_local_size as get_local_size,
    get_rank as get_rank,
    get_world_size as get_world_size,
    init_process_group as init_process_group,
    is_initialized as is_initialized,
    new_group as new_group,
    recv as recv,
    reduce as reduce,
    reduce_inplace as reduce_inplace,
    reduce_scatter as reduce_scatter,
    reduce_scatter_inplace as reduce_scatter_inplace,
    scatter as scatter,
    scatter_inplace as scatter_inplace,
    send as send,
)
from bagua_torch.data_parallel import DistributedDataParallel
from bagua_torch.distributed import BaguaDistributedDataParallel, BaguaModule, _patch_torch_module

_patch_torch_module()

__all__ = [
    "init_process_group",
    "is_initialized",
    "new_group",
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_local_size",
    "ReduceOp",
    *PRIMITIVES,
    "BaguaModule",
    "BaguaDistributedDataParallel",
    "DistributedDataParallel",
    "algorithms",
    "live",
]
