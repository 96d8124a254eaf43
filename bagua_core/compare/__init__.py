"""``bagua-compare``: the same model, data and algorithm trained with the torch
frontend and with the JAX frontend, side by side.

    bagua-compare --algorithm all --nproc 2 --steps 100
    python -m bagua_core.compare --algorithm bytegrad

For each algorithm it launches ``--nproc`` processes (``bagua-run``) running
``bagua_torch.compare_worker``, then as many running
``bagua_jax.compare_worker``. Both start from identical weights and read
identical batches (:mod:`bagua_core.compare.problem`), train with plain SGD
(QAdam with its own optimizer, its hyperparameters in that module)
and report every step's loss (mean over ranks) and time. The tool prints the
losses side by side, the largest divergence and the time per step of each,
and writes ``compare.json`` and ``compare.png`` (loss curves and step times)
to ``--out``. This package imports neither torch nor jax: the frontends run in
their own processes.
"""
