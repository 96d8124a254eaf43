"""A stand-in for the compiled extension ``bagua_core._C``, so that the
documentation builds (and imports every package) without compiling it.

Any attribute is one of autodoc's mock objects, except the few flags that
the packages read at import time: the stand-in says it has XLA FFI handlers
and registers none, so ``bagua_jax`` imports as on a full build. Classes and
enums the bindings define (``py::class_<T>(m, "Name", "doc")``) carry the
docstring written there, read from ``csrc/bindings/*.cc`` (the one source),
enums their members, and exceptions are real exception classes.
"""

import enum
import glob
import os
import re
import sys
import types

from sphinx.ext.autodoc.mock import _make_subclass

NAME = "bagua_core._C"
BINDINGS = os.path.join(os.path.dirname(__file__), "..", "..", "csrc", "bindings")
_DEFINITION = re.compile(r'py::(class_|enum_)<[^>]*>\(\s*m,\s*"(\w+)"')
_EXCEPTION = re.compile(r'py::exception<\w+>\s+(\w+)\(m,\s*"(\w+)",\s*(\w+)')
_VALUE = re.compile(r'\.value\("(\w+)"')
_RAW = re.compile(r'\s*R"doc\((.*?)\)doc"', re.S)
_PLAIN = re.compile(r'"((?:[^"\\]|\\.)*)"\)\s*$')


def bindings() -> dict:
    """{name: (docstring, enum member names or None)} of the classes and
    enums of ``csrc/bindings``: the docstring is the raw string right after
    the name, or a plain string ending the line."""
    found = {}
    for path in sorted(glob.glob(os.path.join(BINDINGS, "*.cc"))):
        text = open(path, encoding="utf-8").read()
        for m in _DEFINITION.finditer(text):
            after = text[m.end() :]
            raw = _RAW.match(after.lstrip(", \n"))
            plain = _PLAIN.search(after.split("\n", 1)[0])
            if not (raw or plain):
                continue
            members = _VALUE.findall(after.split(";", 1)[0]) if m.group(1) == "enum_" else None
            found[m.group(2)] = ((raw or plain).group(1).strip(), members)
    return found


def exceptions() -> dict:
    """{name: exception class} of ``py::exception<T> var(m, "Name", base)``:
    real classes, so that Python code can subclass and set their docstrings."""
    made, by_var = {}, {"PyExc_RuntimeError": RuntimeError}
    for path in sorted(glob.glob(os.path.join(BINDINGS, "*.cc"))):
        for var, name, base in _EXCEPTION.findall(open(path, encoding="utf-8").read()):
            cls = type(name, (by_var.get(base, RuntimeError),), {"__module__": NAME})
            made[name] = by_var[var] = cls
    return made


def _binding(name: str, doc: str, members):
    if members is None:
        return _make_subclass(name, NAME, attributes={"__doc__": doc})
    value = enum.IntEnum(name, members, module=NAME)
    value.__doc__ = doc
    return value


class _Extension(types.ModuleType):
    has_xla_ffi = True
    has_cuda_ffi = False

    @staticmethod
    def ffi_targets() -> dict:
        return {}

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._exceptions:
            value = self._exceptions[name]
        elif name in self._bindings:  # a class or an enum: documented as one
            value = _binding(name, *self._bindings[name])
        else:
            value = _make_subclass(name, NAME)()
        setattr(self, name, value)
        return value


def install() -> None:
    """Puts the stand-in in place of the extension, imported or not."""
    stub = _Extension(NAME)
    stub._bindings = bindings()
    stub._exceptions = exceptions()
    sys.modules[NAME] = stub
