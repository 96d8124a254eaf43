"""Horovod beside Bagua in the same worker processes, started without ``horovodrun``: the benchmark's
launcher (bagua-run, one per emulated host) has set torchrun's variables, so this module maps them onto
Horovod's (``HOROVOD_RANK``, ``_SIZE``, ``_LOCAL_*``, ``_CROSS_*``, ``_HOSTNAME``: host ``h<node>``) and
rank 0 serves Horovod's Gloo rendezvous (``horovod.runner.http.http_server.RendezvousServer``, what
``horovodrun --gloo`` starts) at ``MASTER_ADDR`` on a port it broadcasts over torch.distributed.
``HOROVOD_GLOO_IFACE`` is set from ``GLOO_SOCKET_IFNAME`` (loopback without one), but Horovod's Gloo
publishes the address its host name resolves to: between network namespaces that must be the host's
own address, which benchmarks/_hosts.py arranges (a hosts file per namespace); with 127.0.0.1 every
rank connects to its own loopback and aborts ("connect [127.0.0.1]:<port>: Connection refused").

Horovod 0.28.1 builds against torch >= 2.1 only with benchmarks/horovod-0.28.1-torch2.13.patch
(``make bench-seed`` applies it); docs/benchmarks-seed.md says why.
"""

from __future__ import annotations

import os
import time

_started = {}


def init() -> None:
    """``hvd.init()`` once per process, every rank calling it together."""
    if _started:
        return
    import torch.distributed as dist
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = world // local
    plan = get_host_assignments(parse_hosts(",".join(f"h{n}:{local}" for n in range(nodes))), world)
    box = [None]
    if rank == 0:
        from horovod.runner.http.http_server import RendezvousServer

        server = RendezvousServer(verbose=0)
        box = [server.start()]
        server.init(plan)
        _started["server"] = server  # serves in a daemon thread for the life of the process
    dist.broadcast_object_list(box, src=0)
    slot = plan[rank]
    os.environ.update(
        HOROVOD_HOSTNAME=slot.hostname,
        HOROVOD_RANK=str(slot.rank),
        HOROVOD_SIZE=str(slot.size),
        HOROVOD_LOCAL_RANK=str(slot.local_rank),
        HOROVOD_LOCAL_SIZE=str(slot.local_size),
        HOROVOD_CROSS_RANK=str(slot.cross_rank),
        HOROVOD_CROSS_SIZE=str(slot.cross_size),
        HOROVOD_GLOO_RENDEZVOUS_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        HOROVOD_GLOO_RENDEZVOUS_PORT=str(box[0]),
        HOROVOD_CONTROLLER="gloo",
        HOROVOD_CPU_OPERATIONS="gloo",
        HOROVOD_GLOO_IFACE=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        HOROVOD_GLOO_TIMEOUT_SECONDS=os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "600"),
    )
    import horovod.torch as hvd

    hvd.init()
    _started["hvd"] = hvd


def wrap(config: str, model, optimizer, gpu_step_seconds=None):
    """``config`` "Horovod" or "Horovod+fp16": Horovod's DistributedOptimizer over ``optimizer`` (its
    allreduces start from backward's gradient hooks), rank 0's weights broadcast first. With
    ``gpu_step_seconds`` its step synchronises, then waits that long instead of updating (the replay's
    GPU-timed step). Returns (the optimizer to step, close)."""
    init()
    hvd = _started["hvd"]
    compression = hvd.Compression.fp16 if config == "Horovod+fp16" else hvd.Compression.none
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)
    if gpu_step_seconds is not None:

        def step(*_args, **_kwargs):
            opt.synchronize()  # the allreduces' results written into the gradients, as Horovod's step
            deadline = time.perf_counter() + gpu_step_seconds
            while (left := deadline - time.perf_counter()) > 0:
                time.sleep(left)

        opt.step = step

    def close():
        opt._handles.clear()  # nothing in flight: every step synchronised

    return opt, close
