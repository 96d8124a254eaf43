"""``bagua.torch_api.model_parallel``: Bagua 0.9.2's model-parallel layers (``moe``)."""

from bagua.torch_api.model_parallel import moe

__all__ = ["moe"]
