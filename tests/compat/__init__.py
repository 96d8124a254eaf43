"""Bagua 0.9.2 compatibility: bagua.torch_api and baguarun."""
