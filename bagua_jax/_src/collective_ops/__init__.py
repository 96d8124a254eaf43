"""One file per collective primitive, each with the same skeleton: public
function -> bind -> abstract eval -> lowering -> batching/JVP/transpose ->
registration (mpi4jax's layout)."""
