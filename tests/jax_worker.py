"""Shared setup of JAX test workers: single-threaded XLA, the rank and world
size, and the torch frontend on the same group (made on first use, for
parity checks), torn down at the end."""

from __future__ import annotations

import os
import sys


class JaxWorker:
    def __init__(self):
        os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
        import jax
        import jax.numpy as jnp
        import optax

        self.jax, self.jnp, self.optax = jax, jnp, optax
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self._torch = None

    @property
    def torch(self):
        """The torch frontend on the same group, with torch.distributed beside it."""
        if self._torch is None:
            from tests.torch_worker import TorchWorker

            self._torch = TorchWorker()
        return self._torch


def worker_main(worker_class, case_names) -> None:
    """Runs the cases of the session named in argv[1] and exits non-zero on a failure."""
    from tests.worker import run_cases

    w = worker_class()
    failures = run_cases([(c, getattr(w, c)) for c in case_names(sys.argv[1])])
    if w._torch is not None:
        w._torch.dist.destroy_process_group()
    sys.exit(1 if failures else 0)
