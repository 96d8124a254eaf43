"""``bagua.torch_api.contrib.sync_batchnorm`` (:mod:`bagua_torch.contrib.sync_batchnorm`)."""

from bagua_torch.contrib.sync_batchnorm import *  # noqa: F403
