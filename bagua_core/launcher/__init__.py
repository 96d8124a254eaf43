"""``bagua-run``: starts the local workers of one node with torchrun's environment contract.

A fixed job needs the standard library only: it imports neither torch, jax
nor the extension module, so it is as light as a launcher should be; an
elastic job runs on torch elastic. The entry point is ``bagua_core.run:main``;
the parts are:

- ``cli``: command-line arguments and their validation,
- ``ports``: choosing a free ``MASTER_PORT`` (with ``MASTER_PORT + 1`` free for the store),
- ``contract``: each worker's environment and command line,
- ``output``: rank-prefixed, line-buffered copying of the workers' output,
- ``supervisor``: starting, watching, signalling and stopping the workers,
- ``elastic``: the elastic job, under torch elastic's agent and rendezvous.
"""
