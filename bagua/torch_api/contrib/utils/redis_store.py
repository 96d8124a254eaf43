"""``bagua.torch_api.contrib.utils.redis_store`` (:mod:`bagua_torch.contrib.utils.redis_store`)."""

from bagua_torch.contrib.utils.redis_store import *  # noqa: F403
