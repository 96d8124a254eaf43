"""``bagua.torch_api.model_parallel.moe.experts`` (:mod:`bagua_torch.moe.experts`)."""

from bagua_torch.moe.experts import Experts

__all__ = ["Experts"]
