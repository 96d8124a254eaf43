"""``bagua.torch_api.data_parallel.bagua_distributed`` (:class:`bagua_torch.distributed.BaguaDistributedDataParallel`)."""

from bagua_torch.distributed import BaguaDistributedDataParallel

__all__ = ["BaguaDistributedDataParallel"]
