"""``bagua.torch_api.model_parallel.moe`` (:mod:`bagua_torch.moe`): ``MoE`` and ``is_moe_param``."""

from bagua.torch_api.model_parallel.moe import experts, layer, sharded_moe, utils
from bagua_torch.moe import MoE, is_moe_param

__all__ = ["MoE", "is_moe_param", "experts", "layer", "sharded_moe", "utils"]
