"""``bagua.torch_api.contrib.load_balancing_data_loader`` (:mod:`bagua_torch.contrib.load_balancing_data_loader`)."""

from bagua_torch.contrib.load_balancing_data_loader import *  # noqa: F403
