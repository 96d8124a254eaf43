"""``bagua.torch_api.data_parallel``: Bagua 0.9.2's DDP-style API over
:class:`bagua_torch.DistributedDataParallel`."""

from bagua.torch_api.data_parallel.bagua_distributed import BaguaDistributedDataParallel
from bagua.torch_api.data_parallel.distributed import DistributedDataParallel, DistributedDataParallel_V1_9_0

__all__ = ["DistributedDataParallel", "DistributedDataParallel_V1_9_0", "BaguaDistributedDataParallel"]
