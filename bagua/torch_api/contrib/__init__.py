"""``bagua.torch_api.contrib``: :mod:`bagua_torch.contrib` under Bagua 0.9.2's
module paths (``cache_loader``, ``cached_dataset``, ``load_balancing_data_loader``,
``sync_batchnorm``, ``fuse.optimizer``, ``utils.*_store``)."""

from bagua_torch.contrib import *  # noqa: F403
from bagua_torch.contrib import __all__
