"""``bagua.torch_api.contrib.fuse``: the fused optimizer (:mod:`bagua_torch.contrib.fused_optimizer`)."""
