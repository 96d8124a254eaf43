"""``bagua.torch_api.checkpoint.checkpointing`` (:mod:`bagua_torch.checkpoint`)."""

from bagua_torch.checkpoint import load_checkpoint, save_checkpoint

__all__ = ["save_checkpoint", "load_checkpoint"]
