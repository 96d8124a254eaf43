"""torchft's DiLoCo and Streaming DiLoCo beside Bagua in the same worker processes: each rank is a
replica group of its own (torchft's Manager with rank 0 of 1, its ProcessGroupGloo between the
groups), and rank 0 starts torchft's Lighthouse in its host, at ``MASTER_ADDR`` on a port it
broadcasts over torch.distributed. A replica's store and its Gloo pairs use the address its host
name resolves to: between network namespaces that is the host's own (benchmarks/_hosts.py writes a
hosts file per namespace).

torchft's fragments are modules: the model's leaf modules cut into equal shares of its parameters
(``_seed_models.fragments``), each with its own outer optimizer (DiLoCo's Nesterov SGD).
torchft 0.2.0 quantises its pseudo-gradients only on CUDA (Triton kernels), so on this CPU they
travel in float32 over Gloo's ring allreduce.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

_started = {}


def _die_with_parent() -> None:
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a killed worker leaves no Lighthouse


def _lighthouse(world: int) -> str:
    """Rank 0 starts the Lighthouse once per process (every rank calls this together); its address."""
    import torch.distributed as dist

    if "address" in _started:
        return _started["address"]
    box = [None]
    if dist.get_rank() == 0:
        from bagua_core.launcher.ports import free_master_ports

        port = free_master_ports()
        binary = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
        proc = subprocess.Popen(
            [binary, "--min_replicas", str(world), "--join_timeout_ms", "60000", "--bind", f"[::]:{port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        _started["proc"] = proc
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        deadline = time.monotonic() + 30
        while True:  # serving once it accepts
            try:
                socket.create_connection((addr, port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"torchft_lighthouse did not start (exit code {proc.poll()})") from None
                time.sleep(0.1)
        box = [f"http://{addr}:{port}"]
    dist.broadcast_object_list(box, src=0)
    _started["address"] = box[0]
    return box[0]


def stop() -> None:
    """Stops the Lighthouse this process started, if any."""
    proc = _started.pop("proc", None)
    if proc is not None:
        proc.kill()
        proc.wait()
    _started.pop("address", None)


def wrap(config, model, inner, sync_every, fragments, delay, alpha, timeout_s):
    """Enters torchft's DiLoCo around ``inner`` (its step hooks run the outer exchanges) for the
    parameters of ``model``. ``config``: "torchft DiLoCo" (one fragment, blocking) or
    "torchft Streaming DiLoCo" (``fragments``, ``delay`` steps of overlap, mixing ``alpha``).
    Returns close()."""
    import _seed_models
    import torch
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    streaming = config == "torchft Streaming DiLoCo"
    parts = _seed_models.fragments(model, fragments) if streaming else [model]
    outers = [torch.optim.SGD(p.parameters(), lr=0.7, momentum=0.9, nesterov=True) for p in parts]
    lighthouse = _lighthouse(dist.get_world_size())
    own = socket.gethostbyname(socket.gethostname())
    timeout = timedelta(seconds=timeout_s)
    # the replica group's store, which torchrun would host (the Manager connects to it as a client)
    store = dist.TCPStore(own, 0, is_master=True, wait_for_workers=False, timeout=timeout)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=dist.get_world_size(),
        use_async_quorum=False,  # DiLoCo requires it
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timeout,
        rank=0,
        world_size=1,
        store_addr=own,
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"seed_{dist.get_rank()}",
        hostname=own,
        init_sync=False,  # every replica starts from the same weights: no heal at the first quorum
    )
    diloco = DiLoCo(
        manager,
        parts,
        inner,
        outers if streaming else outers[0],
        sync_every=sync_every,
        pin_memory=False,
        fragment_sync_delay=delay if streaming else 0,
        fragment_update_alpha=alpha if streaming else 0.0,
    )
    diloco.__enter__()

    def close():
        diloco.__exit__(None, None, None)
        manager.shutdown(wait=False)

    close.store = store  # served for as long as the manager lives
    return close
