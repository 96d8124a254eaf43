"""``bagua.torch_api.contrib.fuse.optimizer`` (:mod:`bagua_torch.contrib.fused_optimizer`)."""

from bagua_torch.contrib.fused_optimizer import *  # noqa: F403
