"""Settings and marks for every test.

JAX runs on the CPU unless the environment says otherwise.

Two marks are given here, so that test files need not carry them:

* ``multiprocess``: the test starts other processes (workers through
  ``tests.harness.mp``, a benchmark script, ``bagua-run``, any ``subprocess``),
  found by what the test, its fixtures and the module's functions they call
  refer to;
* ``slow``: measured: the test (or, for a multi-process test, all of its
  module's multi-process tests, which share processes) took more than
  ``SLOW_SECONDS`` in ``tests/durations.json``
  (``tests/harness/durations.py``; ``make durations`` measures them again), or
  it starts processes and has not been measured yet. The few short
  multi-process tests per layer in ``FAST_MULTIPROCESS`` are never slow, so
  that ``make test-fast`` (``-m "not slow"``) still runs every layer across
  real processes; ``make test`` runs everything.
"""

import inspect
import os
import re
import subprocess
import sys
import types

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from tests.harness import benchmark_scripts, durations, mp

# Multi-process tests fast enough for `make test-fast`, a few per layer: node ids relative to
# tests/, where * matches anything (a session's tests share its processes: keep them together).
FAST_MULTIPROCESS = (
    "core/test_store.py::*",  # 3 ranks: exchange, atomic add, a SIGKILLed rank
    "core/test_process_group.py::test_process_group[*",  # 3 ranks: init, handles, reinit, clones
    "core/test_process_group.py::test_main_session_exits_cleanly",
    "core/test_process_group.py::test_killed_peer_fails_every_survivor[3-2]",
    "core/test_dlpack.py::test_core_imports_neither_torch_nor_jax",
    "torch/test_torch_api.py::test_single_process[*",  # a training worker
    "torch/test_torch_frontend.py::test_*[w2*",  # 2 ranks: primitives on torch tensors, training
    "jax/test_jax_ffi.py::test_*2]",  # 2 ranks: the XLA FFI collectives
    "compat/test_bagua_compat.py::test_*[w2*",  # 2 ranks: bagua.torch_api's communication
    "contrib/test_contrib_cache.py::test_lmdb_shared_by_the_ranks_of_a_node",  # 2 ranks, one LMDB
    "benchmarks/test_benchmarks_agreement.py::*",  # a benchmark script through bagua-run
)

# A test (or a module's multi-process tests together) measured above this is slow.
SLOW_SECONDS = 2.0

# What starts processes: these modules, and these functions wherever they are imported.
_STARTER_MODULES = {"subprocess", "multiprocessing"}
_STARTER_IMPORTS = {"tests.harness.mp": {"launch"}, "tests.harness.benchmark_scripts": {"run_script", "start_script"}}
_STARTER_FUNCTIONS = {
    mp.launch,
    benchmark_scripts.run_script,
    benchmark_scripts.start_script,
    subprocess.run,
    subprocess.Popen,
    subprocess.check_output,
    subprocess.check_call,
}


def _names(code: types.CodeType):
    """The global and attribute names ``code`` and the functions nested in it refer to."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _starts_processes(fn, namespace: dict, seen: set) -> bool:
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    names = set(_names(code))
    if names & _STARTER_MODULES:  # imported inside the function too
        return True
    for module, functions in _STARTER_IMPORTS.items():
        if (
            module in names or namespace.get(module.rpartition(".")[2]) is sys.modules.get(module)
        ) and names & functions:
            return True  # mp.launch(...), or `from tests.harness.mp import launch` inside the function
    for name in names:
        obj = namespace.get(name)
        if isinstance(obj, types.ModuleType):
            found = obj.__name__ in _STARTER_MODULES
        elif _hashable(obj) and obj in _STARTER_FUNCTIONS:
            found = True
        else:  # a helper of the module (lru_cache'd ones too)
            found = (
                callable(obj)
                and getattr(obj, "__module__", None) == namespace.get("__name__")
                and _starts_processes(obj, namespace, seen)
            )
        if found:
            return True
    return False


def _hashable(obj) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def _item_starts_processes(item) -> bool:
    if item.get_closest_marker("multiprocess"):
        return True  # marked where it is defined (tests.harness.mp.session_tests)
    namespace = vars(item.module)
    seen: set = set()
    if _starts_processes(item.function, namespace, seen):
        return True
    for defs in item._fixtureinfo.name2fixturedefs.values():
        for fixturedef in defs:
            if _starts_processes(fixturedef.func, getattr(inspect.getmodule(fixturedef.func), "__dict__", {}), seen):
                return True
    return False


def _node_id(item) -> str:
    """The node id relative to tests/, whatever directory pytest runs from."""
    path = os.path.relpath(str(item.path), os.path.dirname(os.path.abspath(__file__)))
    return path + item.nodeid[item.nodeid.index("::") :] if "::" in item.nodeid else path


def _matcher(patterns):
    """A match of a whole node id against ``patterns``, * being the only wildcard (node ids hold
    brackets, which fnmatch would read as character sets)."""
    if not patterns:
        return lambda node: False
    regex = re.compile("|".join(re.escape(p).replace(r"\*", ".*") for p in patterns))
    return lambda node: regex.fullmatch(node) is not None


def pytest_collection_modifyitems(config, items):
    fast_multiprocess = _matcher(FAST_MULTIPROCESS)
    nodes = [(item, _node_id(item), _item_starts_processes(item)) for item in items]
    seconds = durations.group_seconds([(node, starts) for _, node, starts in nodes], durations.load())
    for item, node, starts in nodes:
        if starts:
            item.add_marker(pytest.mark.multiprocess)
        measured = seconds[durations.group_of(node, starts)]
        slow = (measured is None and starts) or (measured is not None and measured > SLOW_SECONDS)
        if slow and not fast_multiprocess(node):
            item.add_marker(pytest.mark.slow)
    if os.environ.get(durations.RECORD_ENV):
        config.pluginmanager.register(durations.Recorder({item.nodeid: node for item, node, _ in nodes}))
