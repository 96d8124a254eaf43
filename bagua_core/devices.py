"""Where the engine keeps a frontend's tensors: the one place that maps an
array's device to an engine ``_C.Device`` and a group to the communicator
that serves it.

* CPU arrays: plain host memory (``None``), no device path.
* CUDA arrays: one ``_C.Device.cuda(index)`` per index and process (its
  streams, events and allocations are shared by every engine of the process).
  On an NCCL group the communicator serves device memory itself; on a Gloo
  group (``BAGUA_BACKEND=gloo``, no NCCL, or two ranks sharing one GPU) the
  buffers are staged through page-locked host memory, which costs two copies
  per call: a warning says so once per process.
* :func:`host_stand_in` makes CPU arrays take the device path on the host
  implementation of a device (an ordered queue on its own thread standing in
  for a stream), so the suite runs the frontends' device glue without a GPU.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import TYPE_CHECKING, Dict, Iterator, Optional

from bagua_core._loader import _C

if TYPE_CHECKING:
    from bagua_core.process_group import ProcessGroup

_lock = threading.Lock()
_cuda: Dict[int, object] = {}
_staged: Dict[tuple, object] = {}
_warned_staging = False
_stand_in = None  # host_stand_in(): the host Device CPU arrays use


def cuda(index: int) -> _C.Device:
    """The process's ``_C.Device`` for CUDA device ``index`` (made on first
    use). ValueError when this process does not see that device."""
    index = int(index)
    visible = _C.cuda_device_count()
    if not 0 <= index < visible:
        why = f": {_C.cuda_unavailable_reason()}" if visible == 0 else ""
        raise ValueError(f"cuda:{index} is not visible to this process ({visible} CUDA device(s){why})")
    with _lock:
        if index not in _cuda:
            _cuda[index] = _C.Device.cuda(index)
        return _cuda[index]


def for_arrays(device_type: str, index: int = 0) -> Optional[_C.Device]:
    """The engine device for arrays on ``device_type`` (``"cpu"`` or ``"cuda"``)
    device ``index``: None for plain host memory."""
    if device_type == "cuda":
        return cuda(index)
    if device_type == "cpu":
        return _stand_in
    raise ValueError(f"unsupported device type {device_type!r}: Bagua communicates CPU and CUDA arrays")


def check_group_serves(group: ProcessGroup, device_type: str, what: str, index: int = 0) -> None:
    """Raises ValueError when ``group`` cannot communicate arrays on
    ``device_type`` device ``index``; warns once when it stages them through
    the host."""
    if group.device_type == device_type:
        return
    if group.device_type == "cuda":
        raise ValueError(
            f"{what} is on {device_type} but group '{group.name}' communicates on cuda (NCCL): "
            "move it to the group's device, or make the group with BAGUA_BACKEND=gloo"
        )
    if device_type == "cuda":
        try:
            cuda(index)
        except ValueError as e:
            raise ValueError(
                f"{what} is a cuda array on group '{group.name}' (Gloo, staged through host memory): {e}"
            ) from None
        _warn_staging_once(group)
        return
    raise ValueError(f"{what} is on {device_type} but group '{group.name}' communicates on {group.device_type}")


def staged(comm: _C.Communicator, device: _C.Device) -> _C.Communicator:
    """``comm`` (a host communicator) serving buffers on ``device`` in the
    order of the caller's stream: see ``_C.stage_through_host``. Cached per
    (communicator, device) so staging memory is reused."""
    key = (id(comm), id(device))
    with _lock:
        hit = _staged.get(key)
        if hit is None:  # the entry holds both: their ids stay theirs
            hit = (comm, device, _C.stage_through_host(comm, device))
            _staged[key] = hit
        return hit[2]


def forget(comm: _C.Communicator) -> None:
    """Drops the staged wrappers of ``comm`` (its group closed)."""
    with _lock:
        for key in [k for k, v in _staged.items() if v[0] is comm]:
            del _staged[key]


def _warn_staging_once(group) -> None:
    global _warned_staging
    with _lock:
        if _warned_staging:
            return
        _warned_staging = True
    warnings.warn(
        f"CUDA arrays on the Gloo group '{group.name}': each call copies them to page-locked host memory "
        "and back (use an NCCL group for GPU speed: BAGUA_BACKEND=auto with an NCCL library)",
        RuntimeWarning,
        stacklevel=3,
    )


@contextlib.contextmanager
def host_stand_in(delay_us: int = 0) -> Iterator[object]:
    """Within the block, CPU arrays take the engine's device path on a host
    ``_C.Device`` (each enqueued task delayed by ``delay_us``, to widen
    ordering races): for tests of the frontends' device glue."""
    global _stand_in
    previous = _stand_in
    _stand_in = _C.Device.host(int(delay_us))
    try:
        yield _stand_in
    finally:
        _stand_in = previous


def stand_in() -> Optional[object]:
    """The host device of an active :func:`host_stand_in`, else None."""
    return _stand_in
