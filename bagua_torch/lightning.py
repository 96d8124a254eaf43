"""``BaguaStrategy``: Bagua's algorithms in a Lightning 2.x ``Trainer``.

``Trainer(strategy=BaguaStrategy(algorithm="bytegrad"), accelerator="cpu", devices=2)``,
or ``strategy="bagua"`` once this module is imported (it registers the name).
``algorithm`` is a registered name (``bagua_torch.algorithms.Algorithm.registered()``;
keyword arguments of the strategy go to the algorithm) or an algorithm instance.
The model is wrapped in :class:`bagua_torch.DistributedDataParallel` when
fitting, with the optimizers Lightning built (so they are set up first);
``barrier``, ``broadcast`` and ``reduce`` use Bagua's primitives over the
world group. torch's default process group is made too (gloo on CPU), for
Lightning's own utilities. As in Bagua 0.9: ``algorithm="qadam"`` takes its
optimizer from ``configure_optimizers``, which must return exactly one
``QAdamOptimizer``; ``"async"`` stops its background averaging when the
strategy tears down (every rank then holds the same weights). Launch as for Lightning's DDP (Lightning starts the
processes, or ``bagua-run`` / torchrun does). Manual optimization and
``sync_batchnorm`` are not supported yet.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Optional, Union

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn

import bagua_torch
from bagua_core.comm import ReduceOp
from bagua_torch.algorithms import Algorithm, QAdamAlgorithm, QAdamOptimizer

_REDUCE_OPS = {"mean": ReduceOp.AVG, "avg": ReduceOp.AVG, "sum": ReduceOp.SUM}
_TORCH_REDUCE_OPS = {
    "SUM": ReduceOp.SUM,
    "PRODUCT": ReduceOp.PROD,
    "MIN": ReduceOp.MIN,
    "MAX": ReduceOp.MAX,
    "BAND": ReduceOp.BAND,
    "BOR": ReduceOp.BOR,
    "BXOR": ReduceOp.BXOR,
    "AVG": ReduceOp.AVG,
}


class BaguaStrategy(DDPStrategy):
    strategy_name = "bagua"

    def __init__(
        self,
        algorithm: Union[str, Algorithm] = "gradient_allreduce",
        flatten: bool = True,
        accelerator=None,
        parallel_devices=None,
        cluster_environment=None,
        checkpoint_io=None,
        precision_plugin=None,
        **bagua_kwargs: Any,
    ):
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._qadam_kwargs = None  # "qadam" by name: made once the optimizer exists
        if algorithm == "qadam" and "q_adam_optimizer" not in bagua_kwargs:
            unknown = set(bagua_kwargs) - set(inspect.signature(QAdamAlgorithm).parameters)
            if unknown:
                raise TypeError(f"unknown keyword arguments for qadam: {sorted(unknown)}")
            self._qadam_kwargs = bagua_kwargs
            self._bagua_algorithm = None
        else:
            if isinstance(algorithm, str):
                algorithm = Algorithm.init(algorithm, **bagua_kwargs)  # checked now, not in the workers
            elif bagua_kwargs:
                raise TypeError(f"keyword arguments {sorted(bagua_kwargs)} go with an algorithm name, not an instance")
            self._bagua_algorithm = Algorithm.coerce(algorithm, accept_names=False)
        self._bagua_flatten = flatten

    @property
    def bagua_algorithm(self) -> Optional[Algorithm]:
        """The algorithm (None for ``"qadam"`` by name until fitting begins)."""
        return self._bagua_algorithm

    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        env = self.cluster_environment
        os.environ.update(
            MASTER_ADDR=env.main_address,
            MASTER_PORT=str(env.main_port),
            RANK=str(self.global_rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(self.local_rank),
            LOCAL_WORLD_SIZE=str(self.num_processes),
            NODE_RANK=str(self.node_rank),
        )
        bagua_torch.init_process_group(torch_distributed=True)

    def setup(self, trainer) -> None:
        self.accelerator.setup(trainer)
        if self._layer_sync:
            raise NotImplementedError("BaguaStrategy does not support sync_batchnorm yet")
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            if not self.lightning_module.automatic_optimization:
                raise NotImplementedError("BaguaStrategy supports automatic optimization only, for now")
            self.setup_optimizers(trainer)  # before wrapping: Bagua steps and broadcasts them
            self.model = self._setup_model(self.model)
        self.setup_precision_plugin()

    def _setup_model(self, model: torch.nn.Module) -> bagua_torch.DistributedDataParallel:
        if self._qadam_kwargs is not None:
            if len(self.optimizers) != 1 or not isinstance(self.optimizers[0], QAdamOptimizer):
                raise ValueError(
                    "BaguaStrategy(algorithm='qadam') needs configure_optimizers to return exactly one "
                    f"QAdamOptimizer, got {[type(o).__name__ for o in self.optimizers]}"
                )
            self._bagua_algorithm = QAdamAlgorithm(self.optimizers[0], **self._qadam_kwargs)
        return bagua_torch.DistributedDataParallel(
            model,
            optimizers=self.optimizers,
            algorithm=self._bagua_algorithm,
            gradient_as_bucket_view=self._bagua_flatten,
        )

    def teardown(self) -> None:
        if isinstance(self.model, bagua_torch.DistributedDataParallel):
            if hasattr(self._bagua_algorithm, "abort"):  # async: a last average, then the loop stops
                self._bagua_algorithm.abort(self.model)
            self.model.close()
            self.model = self.lightning_module
        super().teardown()

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if bagua_torch.is_initialized():
            bagua_torch.barrier()

    def broadcast(self, obj, src: int = 0):
        return bagua_torch.broadcast_object(obj, src) if bagua_torch.is_initialized() else obj

    def reduce(self, tensor, group: Optional[Any] = None, reduce_op: Optional[Union[Any, str]] = "mean"):
        """``tensor`` reduced over every rank (a new tensor; ``reduce_op``: "mean"/"avg",
        "sum", or a ``torch.distributed.ReduceOp``)."""
        if not isinstance(tensor, torch.Tensor) or not bagua_torch.is_initialized():
            return tensor
        if group is not None:
            raise ValueError("BaguaStrategy.reduce reduces over every rank: pass group=None")
        op = _op(reduce_op)
        out = tensor.detach().clone().contiguous()
        if op == ReduceOp.AVG and not out.is_floating_point():
            out = out.float()  # the mean of integers as Lightning expects it
        bagua_torch.allreduce_inplace(out, op=op)
        return out

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register("bagua", cls, description="Bagua's communication algorithms", override=True)


def _op(reduce_op) -> ReduceOp:
    if reduce_op is None:
        return ReduceOp.AVG
    if isinstance(reduce_op, str):
        try:
            return _REDUCE_OPS[reduce_op.lower()]
        except KeyError:
            raise ValueError(f"unknown reduce_op {reduce_op!r} (use 'mean', 'avg', 'sum' or a ReduceOp)") from None
    name = getattr(reduce_op, "name", None) or str(reduce_op).split(".")[-1]
    if name.upper() in _TORCH_REDUCE_OPS:
        return _TORCH_REDUCE_OPS[name.upper()]
    raise ValueError(f"unsupported reduce_op {reduce_op!r}")


BaguaStrategy.register_strategies(StrategyRegistry)

__all__ = ["BaguaStrategy"]
