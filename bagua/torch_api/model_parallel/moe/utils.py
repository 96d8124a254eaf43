"""``bagua.torch_api.model_parallel.moe.utils`` (:mod:`bagua_torch.moe.experts`)."""

from bagua_torch.moe.experts import is_moe_param

__all__ = ["is_moe_param"]
