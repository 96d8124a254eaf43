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

from bagua_torch import algorithms
from bagua_torch.communication import (
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
    get_local_rank,
    get_local_size,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
    new_group,
    recv,
    reduce,
    reduce_inplace,
    reduce_scatter,
    reduce_scatter_inplace,
    scatter,
    scatter_inplace,
    send,
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
    "BaguaModule",
    "BaguaDistributedDataParallel",
    "DistributedDataParallel",
    "algorithms",
]
