"""``bagua.torch_api.contrib.utils.store`` (:mod:`bagua_torch.contrib.utils.store`)."""

from bagua_torch.contrib.utils.store import *  # noqa: F403
