"""Bagua's collectives on numpy, torch and JAX arrays.

    bagua-run --nproc-per-node 2 examples/collectives_demo.py

(or torchrun, or Slurm: only the environment contract matters). Each rank
prints what it holds after each collective.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

import bagua_core as bc  # noqa: E402


def show(what, x):
    values = np.asarray(x).tolist() if not hasattr(x, "numpy") else x.numpy().tolist()
    print(f"[rank {bc.get_rank()}] {what:<38} {values}", flush=True)


def main():
    bc.init_process_group()
    rank, world = bc.get_rank(), bc.get_world_size()
    if rank == 0:
        print(f"{world} processes, Gloo over TCP\n", flush=True)

    # numpy: in place, and out of place into a new core-owned Buffer
    x = np.full(3, rank + 1, dtype=np.float32)
    bc.allreduce_inplace(x, op=bc.ReduceOp.SUM)
    show("numpy allreduce_inplace(SUM)", x)
    show("numpy allgather -> Buffer", bc.allgather(np.array([rank, 10 * rank], dtype=np.int64)))
    b = np.arange(4, dtype=np.float64) * (rank + 1)
    bc.broadcast(b, src=world - 1)
    show(f"numpy broadcast from rank {world - 1}", b)

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        t = torch.tensor([float(rank), 1.0], dtype=torch.bfloat16)
        bc.allreduce_inplace(t, op="max")
        show("torch bfloat16 allreduce_inplace(MAX)", t.float())
        g = torch.zeros(world, dtype=torch.int32)
        bc.allgather(torch.tensor([rank * rank], dtype=torch.int32), g)
        show("torch allgather (rank^2)", g)
        t = torch.full((2,), float(rank))
        bc.broadcast(t, src=0)
        show("torch broadcast from rank 0", t)

    try:
        import jax.numpy as jnp
    except ImportError:
        jnp = None
    if jnp is not None:
        # JAX arrays are immutable: results come back as a Buffer, viewed zero-copy
        j = jnp.arange(3, dtype=jnp.float32) + rank
        mean = jnp.from_dlpack(bc.allreduce(j, op="avg"))
        show("jax allreduce(AVG)", mean)
        show("jax allgather", jnp.from_dlpack(bc.allgather(jnp.array([rank], dtype=jnp.int32))))
        buf = bc.from_array(j)  # a writable copy to broadcast into
        bc.broadcast(buf, src=0)
        show("jax broadcast from rank 0", jnp.from_dlpack(buf))

    bc.barrier()
    bc.destroy_process_group()


if __name__ == "__main__":
    main()
