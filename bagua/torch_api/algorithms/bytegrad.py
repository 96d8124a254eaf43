"""``bagua.torch_api.algorithms.bytegrad`` (:mod:`bagua_torch.algorithms.bytegrad`)."""

from bagua_torch.algorithms.bytegrad import ByteGradAlgorithm

__all__ = ["ByteGradAlgorithm"]
