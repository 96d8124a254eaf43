"""``bagua.torch_api.model_parallel.moe.layer`` (:mod:`bagua_torch.moe.layer`)."""

from bagua_torch.moe.layer import MoE

__all__ = ["MoE"]
