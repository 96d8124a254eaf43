"""Bagua's collectives on numpy, torch and JAX arrays.

    bagua-run --nproc-per-node 2 examples/collectives_demo.py

(or torchrun, or Slurm: only the environment contract matters). Each rank
prints what it held before and after each collective.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

import bagua_core as bc


def values(x):
    if type(x).__module__.startswith("torch"):
        x = x.float() if x.is_floating_point() else x  # numpy has no bfloat16
    if hasattr(x, "numpy"):  # torch tensors, bagua_core.Buffer
        x = x.numpy()
    return np.asarray(x).tolist()


def show(what, before, after):
    print(f"{what:<34} {str(values(before)):<22} -> {values(after)}", flush=True)


def main():
    bc.init_process_group()
    rank, world = bc.get_rank(), bc.get_world_size()
    if rank == 0:
        print(f"{world} processes, Gloo over TCP; each line: what this rank held -> what it holds", flush=True)

    # numpy: in place, and out of place into a new core-owned Buffer
    x = np.full(3, rank + 1, dtype=np.float32)
    before = x.copy()
    bc.allreduce_inplace(x, op=bc.ReduceOp.SUM)
    show("numpy allreduce_inplace(SUM)", before, x)
    a = np.array([rank, 10 * rank], dtype=np.int64)
    show("numpy allgather -> Buffer", a, bc.allgather(a))
    b = np.arange(4, dtype=np.float64) * (rank + 1)
    before = b.copy()
    bc.broadcast(b, src=world - 1)
    show(f"numpy broadcast from rank {world - 1}", before, b)

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        t = torch.tensor([float(rank), 1.0], dtype=torch.bfloat16)
        before = t.clone()
        bc.allreduce_inplace(t, op="max")
        show("torch bf16 allreduce_inplace(MAX)", before, t)
        mine, g = torch.tensor([rank * rank], dtype=torch.int32), torch.zeros(world, dtype=torch.int32)
        bc.allgather(mine, g)
        show("torch allgather", mine, g)
        t = torch.full((2,), float(rank))
        before = t.clone()
        bc.broadcast(t, src=0)
        show("torch broadcast from rank 0", before, t)

    try:
        import jax.numpy as jnp
    except ImportError:
        jnp = None
    if jnp is not None:
        # JAX arrays are immutable: results come back as a Buffer, viewed zero-copy
        j = jnp.arange(3, dtype=jnp.float32) + rank
        show("jax allreduce(AVG)", j, jnp.from_dlpack(bc.allreduce(j, op="avg")))
        mine = jnp.array([rank], dtype=jnp.int32)
        show("jax allgather", mine, jnp.from_dlpack(bc.allgather(mine)))
        buf = bc.from_array(j)  # a writable copy to broadcast into
        bc.broadcast(buf, src=0)
        show("jax broadcast from rank 0", j, jnp.from_dlpack(buf))

    bc.barrier()
    bc.destroy_process_group()


if __name__ == "__main__":
    main()
