"""Shared setup of JAX test workers: single-threaded XLA, the rank and world
size, per-rank gradients, the loss-goes-down check, and the torch frontend on
the same group (made on first use, for parity checks), torn down at the end."""

from __future__ import annotations

import os
import sys

import numpy as np


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

    def rank_grads(self, shapes, step):
        """float32 numpy gradients of ``shapes``, different on every rank and step."""
        rng = np.random.default_rng(977 * step + self.rank)
        return [rng.standard_normal(s).astype(np.float32) for s in shapes]

    def assert_training_reduces_loss(self, tx, steps=60, factor=0.6, eager=False, finish=None):
        """Trains a linear classifier with ``tx`` on a separable task, each
        rank its own batches; the held-out loss of ``finish(params)`` (default:
        the params) must fall below ``factor`` times its start. The step runs
        under jax.jit, or with ``eager`` only the gradient does (transforms that
        cannot be jitted)."""
        jax, jnp, optax = self.jax, self.jnp, self.optax
        rng = np.random.default_rng(0)
        true_w = rng.standard_normal((4, 3)).astype(np.float32)
        params = {"w": jnp.asarray(rng.standard_normal((4, 3)) * 0.1, jnp.float32), "b": jnp.zeros(3, jnp.float32)}

        def loss(p, x, y):
            return optax.softmax_cross_entropy_with_integer_labels(x @ p["w"] + p["b"], y).mean()

        def batch(step, n=32):
            g = np.random.default_rng(1000 * step + self.rank)
            x = g.standard_normal((n, 4)).astype(np.float32)
            return x, (x @ true_w).argmax(1)

        grad = jax.jit(jax.grad(loss)) if eager else jax.grad(loss)

        def step(p, s, x, y):
            u, s = tx.update(grad(p, x, y), s, p)
            return optax.apply_updates(p, u), s

        if not eager:
            step = jax.jit(step)
        ex, ey = batch(10**6, 512)
        before = float(loss(params, ex, ey))
        p, s = params, tx.init(params)
        for t in range(steps):
            p, s = step(p, s, *batch(t))
        if finish is not None:
            p = finish(p)
        after = float(loss(p, ex, ey))
        assert after < factor * before, f"loss {before:.4f} -> {after:.4f}"

    @property
    def torch(self):
        """The torch frontend on the same group, with torch.distributed beside it."""
        if self._torch is None:
            from tests.harness.torch_worker import TorchWorker

            self._torch = TorchWorker()
        return self._torch


def worker_main(worker_class, case_names) -> None:
    """Runs the cases of the session named in argv[1] and exits non-zero on a failure."""
    from tests.harness.worker import run_cases

    w = worker_class()
    failures = run_cases([(c, getattr(w, c)) for c in case_names(sys.argv[1])])
    if w._torch is not None:
        w._torch.dist.destroy_process_group()
    sys.exit(1 if failures else 0)
