"""Bagua 0.9.2's communication-primitives example, on CPU and any world size
of at least 2: each primitive of ``bagua.torch_api`` called as the original
example calls it (``comm=`` the default group's global communicator) and
compared with ``torch.distributed`` on the same data. Run it with:

    python -m bagua.distributed.launch --nproc_per_node 3 examples/bagua_0_9/communication_primitives.py

``alltoall_v`` takes the displacements in the original's cumulative form
(one entry per rank plus the end of the last chunk). Prints
"communication primitives: all match" on rank 0.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import bagua.torch_api as bagua


def main():
    assert bagua.get_world_size() >= 2, "world size must be at least 2"
    bagua.init_process_group()
    rank, world = bagua.get_rank(), bagua.get_world_size()
    comm = bagua.communication._get_default_group().get_global_communicator()
    torch.manual_seed(rank)

    # send, recv
    if rank == 0:
        t = torch.rand(4)
        dist.send(t, 1)
        bagua.send(t, 1, comm=comm)
    elif rank == 1:
        a, b = torch.zeros(4), torch.zeros(4)
        dist.recv(a, 0)
        bagua.recv(b, 0, comm=comm)
        assert torch.equal(a, b), (a, b)

    # broadcast
    a = torch.rand(4) if rank == 0 else torch.zeros(4)
    b = a.clone()
    dist.broadcast(a, 0)
    bagua.broadcast(b, 0, comm=comm)
    assert torch.equal(a, b), (a, b)

    # allreduce, allreduce_inplace
    send = torch.rand(4)
    ours, got = send.clone(), torch.zeros(4)
    dist.all_reduce(send)
    bagua.allreduce(ours, got, comm=comm)
    bagua.allreduce_inplace(ours, comm=comm)
    assert torch.allclose(send, got) and torch.allclose(ours, got), (send, got, ours)

    # reduce, reduce_inplace
    dst = 1
    send = torch.rand(4)
    ours, got = send.clone(), torch.zeros(4)
    dist.reduce(send, dst)
    bagua.reduce(ours, got, dst=dst, comm=comm)
    bagua.reduce_inplace(ours, dst=dst, comm=comm)
    if rank == dst:
        assert torch.allclose(send, got) and torch.allclose(ours, got), (send, got, ours)

    # allgather
    send = torch.rand(4)
    theirs = [torch.zeros(4) for _ in range(world)]
    got = torch.zeros(4 * world)
    dist.all_gather(theirs, send)
    bagua.allgather(send, got, comm=comm)
    assert torch.equal(torch.cat(theirs), got)

    # gather, scatter
    send = torch.rand(4)
    theirs = [torch.zeros(4) for _ in range(world)] if rank == 0 else None
    got = torch.zeros(4 * world)
    dist.gather(send, theirs, dst=0)
    bagua.gather(send, got, 0, comm=comm)
    if rank == 0:
        assert torch.equal(torch.cat(theirs), got)
    chunks = torch.rand(4 * world)
    mine = torch.zeros(4)
    dist.scatter(mine, list(chunks.chunk(world)) if rank == 0 else None, src=0)
    ours = torch.zeros(4)
    bagua.scatter(chunks, ours, 0, comm=comm)
    assert torch.equal(mine, ours), (mine, ours)

    # reduce_scatter (torch's Gloo group has none: the reference is an allreduce, then this rank's chunk)
    send = torch.rand(4 * world)
    whole = send.clone()
    dist.all_reduce(whole)
    got = torch.zeros(4)
    bagua.reduce_scatter(send, got, comm=comm)
    assert torch.allclose(whole.chunk(world)[rank], got), (whole, got)

    # alltoall
    send = torch.rand(4 * world)
    theirs, got = torch.zeros(4 * world), torch.zeros(4 * world)
    dist.all_to_all_single(theirs, send)
    bagua.alltoall(send, got, comm=comm)
    assert torch.equal(theirs, got), (theirs, got)

    # alltoall_v: rank r sends r + j + 1 elements to rank j
    send_counts = [rank + j + 1 for j in range(world)]
    recv_counts = [r + rank + 1 for r in range(world)]
    send = torch.arange(sum(send_counts), dtype=torch.float32) + 100 * rank
    theirs = torch.zeros(sum(recv_counts))
    dist.all_to_all_single(theirs, send, recv_counts, send_counts)
    send_displs = [sum(send_counts[:j]) for j in range(world + 1)]  # the original's cumulative form
    recv_displs = [sum(recv_counts[:r]) for r in range(world + 1)]
    got = torch.zeros(sum(recv_counts))
    bagua.alltoall_v(send, send_counts, send_displs, got, recv_counts, recv_displs, comm=comm)
    assert torch.equal(theirs, got), (theirs, got)

    bagua.barrier(comm=comm)
    if rank == 0:
        print("communication primitives: all match", flush=True)


if __name__ == "__main__":
    main()
