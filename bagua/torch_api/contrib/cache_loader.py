"""``bagua.torch_api.contrib.cache_loader`` (:mod:`bagua_torch.contrib.cache_loader`)."""

from bagua_torch.contrib.cache_loader import *  # noqa: F403
