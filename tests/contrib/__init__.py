"""bagua_torch.contrib: cached datasets, fused optimizers, load balancing, sync batchnorm."""
