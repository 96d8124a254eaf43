"""What the tests share: starting and checking worker processes (``mp``, ``worker``, the
framework workers ``torch_worker`` and ``jax_worker``), running the benchmark scripts
(``benchmark_scripts``), fake device arrays (``dlpack_structs``), numpy references
(``reference``) and where things are (``paths``). Imported as ``tests.harness.*``: the
repository root is on ``sys.path`` (pytest's ``pythonpath`` setting in pyproject.toml; the
PYTHONPATH that ``mp`` gives the workers it starts)."""
