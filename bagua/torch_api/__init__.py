"""``bagua.torch_api``: Bagua 0.9.2's PyTorch API, as a thin package over :mod:`bagua_torch`.

Scripts written for Bagua 0.9.2 (``import bagua.torch_api as bagua``) run
unchanged: ``bagua.init_process_group()`` (which, as there, also initialises
torch's default process group), the communication primitives,
``model.with_bagua([optimizer], algorithm)``, and the submodules
``communication``, ``algorithms``, ``data_parallel``, ``env``, ``checkpoint``,
``contrib`` and ``model_parallel`` (its ``moe`` also as ``bagua.torch_api.moe``). ``BaguaTensor`` (not built yet) imports, and raises
``NotImplementedError`` naming itself when used.
"""

from bagua.torch_api import algorithms, checkpoint, communication, contrib, data_parallel, env, model_parallel
from bagua.torch_api._not_built import not_built
from bagua.torch_api.communication import (
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
    gather,
    gather_inplace,
    get_backend,
    init_process_group,
    recv,
    reduce,
    reduce_inplace,
    reduce_scatter,
    reduce_scatter_inplace,
    scatter,
    scatter_inplace,
    send,
)
from bagua.torch_api.env import get_local_rank, get_local_size, get_rank, get_world_size
from bagua.torch_api.model_parallel import moe
from bagua_torch import BaguaModule

BaguaTensor = not_built("BaguaTensor", __name__)

__all__ = [
    "get_backend",
    "init_process_group",
    "send",
    "recv",
    "allgather",
    "allgather_inplace",
    "allreduce",
    "allreduce_inplace",
    "alltoall",
    "alltoall_inplace",
    "alltoall_v",
    "alltoall_v_inplace",
    "barrier",
    "broadcast",
    "gather",
    "gather_inplace",
    "reduce",
    "reduce_inplace",
    "reduce_scatter",
    "reduce_scatter_inplace",
    "scatter",
    "scatter_inplace",
    "ReduceOp",
    "BaguaModule",
    "BaguaTensor",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "communication",
    "algorithms",
    "checkpoint",
    "contrib",
    "data_parallel",
    "env",
    "model_parallel",
    "moe",
]
