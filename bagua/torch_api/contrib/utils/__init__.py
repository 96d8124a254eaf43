"""``bagua.torch_api.contrib.utils`` (:mod:`bagua_torch.contrib.utils`)."""
