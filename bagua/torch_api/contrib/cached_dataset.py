"""``bagua.torch_api.contrib.cached_dataset`` (:mod:`bagua_torch.contrib.cached_dataset`)."""

from bagua_torch.contrib.cached_dataset import *  # noqa: F403
