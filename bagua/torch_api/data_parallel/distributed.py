"""``bagua.torch_api.data_parallel.distributed``: Bagua 0.9.2's
``DistributedDataParallel(module, device_ids=None, ...)``.

As in the original, ``device_ids``, ``output_device``, ``dim != 0`` or
``check_reduction`` mean a plain ``torch.nn.parallel.DistributedDataParallel``
(with a warning; it needs torch's default group, which
``bagua.torch_api.init_process_group()`` makes). Otherwise the result is a
:class:`DistributedDataParallel_V1_9_0`, i.e. :class:`bagua_torch.DistributedDataParallel`
with the original constructor. Differences from the original: ``bucket_cap_mb``
is honoured when given (default: ``BAGUA_BUCKET_SIZE``), and
``broadcast_buffers=False`` stays Bagua (it is implemented here).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence, Union

import torch

from bagua_core.process_group import ProcessGroup
from bagua_torch import _torch_group
from bagua_torch.algorithms import Algorithm
from bagua_torch.data_parallel import DistributedDataParallel as _BaguaDDP


def _bagua_group(
    process_group: Union[ProcessGroup, torch.distributed.ProcessGroup, None],
) -> Optional[ProcessGroup]:
    if process_group is None or isinstance(process_group, ProcessGroup):
        return process_group
    if isinstance(process_group, torch.distributed.ProcessGroup):
        return _torch_group.from_torch_group(process_group)
    raise TypeError(
        "process_group must be a bagua_core.ProcessGroup, a torch.distributed.ProcessGroup or None, "
        f"got {type(process_group).__name__}"
    )


class DistributedDataParallel_V1_9_0(_BaguaDDP):
    """:class:`bagua_torch.DistributedDataParallel` with Bagua 0.9.2's
    constructor (``module``, ``optimizers``, ``algorithm``, ...); a
    ``torch.distributed`` process group is accepted too."""

    def __init__(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer] = (),
        algorithm: Union[Algorithm, Any, None] = None,
        process_group: Union[ProcessGroup, torch.distributed.ProcessGroup, None] = None,
        bagua_module_name: Optional[str] = None,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = True,
        broadcast_buffers: bool = True,
        bucket_cap_mb: Optional[float] = None,
    ) -> None:
        if not any(p.requires_grad for p in module.parameters()):
            raise RuntimeError(
                "DistributedDataParallel is not needed when a module doesn't have any parameter "
                "that requires a gradient."
            )
        super().__init__(
            module,
            optimizers=list(optimizers),
            algorithm=algorithm,
            process_group=_bagua_group(process_group),
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=broadcast_buffers,
            gradient_as_bucket_view=gradient_as_bucket_view,
            bucket_cap_mb=bucket_cap_mb,
        )
        if bagua_module_name is not None:
            module.bagua_module_name = bagua_module_name  # type: ignore[assignment]  # BaguaModule's property


def DistributedDataParallel(
    module: torch.nn.Module,
    device_ids: Optional[Sequence[Union[int, torch.device]]] = None,
    output_device: Union[int, torch.device, None] = None,
    dim: int = 0,
    broadcast_buffers: bool = True,
    process_group: Union[ProcessGroup, torch.distributed.ProcessGroup, None] = None,
    bucket_cap_mb: Optional[float] = None,
    find_unused_parameters: bool = False,
    check_reduction: bool = False,
    gradient_as_bucket_view: bool = True,
    optimizers: Sequence[torch.optim.Optimizer] = (),
    algorithm: Union[Algorithm, Any, None] = None,
) -> Union[DistributedDataParallel_V1_9_0, torch.nn.parallel.DistributedDataParallel]:
    """Bagua 0.9.2's drop-in for ``torch.nn.parallel.DistributedDataParallel``
    (see the module docstring for when it returns torch's own)."""
    if device_ids is not None or output_device is not None or dim != 0 or check_reduction:
        warnings.warn(
            "device_ids, output_device, dim or check_reduction given: this is "
            "torch.nn.parallel.DistributedDataParallel, not Bagua",
            stacklevel=2,
        )
        return torch.nn.parallel.DistributedDataParallel(
            module,
            device_ids=device_ids,
            output_device=output_device,
            dim=dim,
            broadcast_buffers=broadcast_buffers,
            process_group=process_group,
            bucket_cap_mb=25 if bucket_cap_mb is None else bucket_cap_mb,
            find_unused_parameters=find_unused_parameters,
            check_reduction=check_reduction,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
    return DistributedDataParallel_V1_9_0(
        module,
        optimizers=optimizers,
        algorithm=algorithm,
        process_group=process_group,
        find_unused_parameters=find_unused_parameters,
        gradient_as_bucket_view=gradient_as_bucket_view,
        broadcast_buffers=broadcast_buffers,
        bucket_cap_mb=bucket_cap_mb,
    )


__all__ = ["DistributedDataParallel", "DistributedDataParallel_V1_9_0"]
