"""``bagua-run``: starts the local workers of one node with torchrun's environment contract.

Standard library only: it imports neither torch, jax nor the extension module,
so it is as light as a launcher should be. ``python -m bagua_core.run`` runs
fixed jobs; ``bagua-run`` (``bagua.run:main``) adds elastic jobs, which run on
torch elastic (:mod:`bagua.distributed.elastic`, outside ``bagua_core``).
The parts are:

- ``cli``: command-line arguments and their validation,
- ``ports``: choosing a free ``MASTER_PORT`` (with ``MASTER_PORT + 1`` free for the store),
- ``contract``: each worker's environment and command line,
- ``output``: rank-prefixed, line-buffered copying of the workers' output,
- ``supervisor``: starting, watching, signalling and stopping the workers.
"""
