"""The PyTorch frontend (bagua_torch) and its Lightning strategy."""
