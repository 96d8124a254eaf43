"""``bagua.torch_api.checkpoint`` (:mod:`bagua_torch.checkpoint`)."""

from bagua.torch_api.checkpoint.checkpointing import load_checkpoint, save_checkpoint

__all__ = ["save_checkpoint", "load_checkpoint"]
