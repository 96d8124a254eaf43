"""The base of a frontend's algorithm classes (``bagua_torch.algorithms``,
``bagua_jax.algorithms``): the original class names over the descriptions of
this package. A frontend class never repeats a description's arguments, their
defaults, their documentation or their checks; it gets them from its
description:

* its constructor's signature is the description's fields, in order, with
  their defaults and types (``inspect.signature`` and ``help()`` show them),
  after the class's own arguments, if it has any (QAdam: its optimizer);
* its docstring's ``Args:`` section lists the description's (see
  :mod:`bagua_core.algorithms._docstrings`) after its own;
* the arguments are checked by building the description.

A frontend defines one base class with its own ``_classes = {}`` (description
type -> its class); each subclass sets ``core_type`` (the description
dataclass). The list of algorithms is the descriptions' registry
(:func:`bagua_core.algorithms.names`): :meth:`FrontendAlgorithm.classes`
gives the frontend's class of each, and refuses a frontend that lacks one.

A class with arguments of its own defines ``__init__(self, <its arguments>,
**fields)`` and calls ``super().__init__(**fields)`` with the fields it sets
itself added; it lists those in ``derived_fields`` (they are not arguments).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Dict, List, Tuple

from bagua_core.algorithms._base import description_type, is_description, names
from bagua_core.algorithms._docstrings import arguments_section, split_arguments

# Bagua 0.9's registered names. One not built here yet raises NotImplementedError
# from init(), so that a script written for Bagua 0.9 learns what is missing.
ORIGINAL_NAMES = ("gradient_allreduce", "bytegrad", "decentralized", "low_precision_decentralized", "qadam", "async")


class FrontendAlgorithm:
    """An algorithm under its original name: its constructor arguments are the
    description's fields, validated by the description."""

    core_type: type = None
    # Fields of the description the class sets itself rather than taking as
    # arguments (QAdam: warmup_steps and beta1, from its optimizer).
    derived_fields: Tuple[str, ...] = ()
    _classes: Dict[type, type] = None  # set by each frontend's base class
    frontend = "bagua"  # module shown in error messages, e.g. "bagua_torch.algorithms"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.core_type is None:
            return
        if cls._classes is None:
            raise TypeError(f"{cls.__name__}: its frontend base class must define _classes = {{}}")
        if cls.core_type in cls._classes:
            raise ValueError(
                f"{cls.__name__}: {cls._classes[cls.core_type].__name__} is already the "
                f"{cls.frontend} class of {cls.core_type.__name__}"
            )
        own_doc, own_arguments = split_arguments(cls.__doc__)
        cls.__init__ = _constructor(cls, own_arguments)
        documented = {**split_arguments(cls.core_type.__doc__)[1], **own_arguments}
        parameters = list(inspect.signature(cls.__init__).parameters)[1:]
        listed = [(p, documented[p]) for p in parameters if p in documented]
        cls.__doc__ = "\n\n".join(part for part in (own_doc, listed and arguments_section(listed)) if part)
        cls._classes[cls.core_type] = cls

    def __init__(self, **fields):
        self._description = self.core_type(**fields)

    def __getattr__(self, name):
        # hyperparameters read through the description (algo.hierarchical, ...)
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return getattr(self.__dict__["_description"], name)
        except (KeyError, AttributeError):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}") from None

    @property
    def name(self) -> str:
        return self.core_type.name

    def to_core(self):
        """The framework-neutral :mod:`bagua_core.algorithms` description."""
        return self._description

    @classmethod
    def classes(cls) -> Dict[str, type]:
        """This frontend's class of every registered description, by class
        name, in the order of :func:`bagua_core.algorithms.names`."""
        missing = [name for name in names() if description_type(name) not in cls._classes]
        if missing:
            raise TypeError(
                f"{cls.frontend} has no class for the registered algorithm(s) {', '.join(missing)}: "
                f"define a subclass of its Algorithm with core_type set to the description"
            )
        found = (cls._classes[description_type(name)] for name in names())
        return {c.__name__: c for c in found}

    @classmethod
    def from_core(cls, description) -> "FrontendAlgorithm":
        """This frontend's algorithm for a :mod:`bagua_core.algorithms` description."""
        algo_cls = cls._classes.get(type(description))
        if algo_cls is None:
            raise TypeError(f"no {cls.frontend} algorithm for {description!r}")
        return algo_cls.from_description(description)

    @classmethod
    def from_description(cls, description) -> "FrontendAlgorithm":
        """This class built from its own description's fields; algorithms that
        need more than the description (QAdam: its optimizer) refuse."""
        return cls(**dataclasses.asdict(description))

    @classmethod
    def init(cls, name: str, **hyperparameters) -> "FrontendAlgorithm":
        """The algorithm registered as ``name`` (see :meth:`registered`)."""
        if name in ORIGINAL_NAMES and name not in names():
            raise NotImplementedError(
                f"algorithm {name!r} of Bagua 0.9 is not built in this Bagua yet; available: {', '.join(names())}"
            )
        return cls._classes[description_type(name)](**hyperparameters)

    @classmethod
    def registered(cls) -> List[str]:
        return list(names())

    @classmethod
    def coerce(cls, algorithm, *, accept_names: bool) -> "FrontendAlgorithm":
        """An instance of this frontend's algorithms from an instance, a
        description or (with ``accept_names``) a registered name."""
        if isinstance(algorithm, cls):
            return algorithm
        if is_description(algorithm):
            return cls.from_core(algorithm)
        if isinstance(algorithm, type):
            raise TypeError(f"algorithm must be an instance: pass {algorithm.__name__}(), not the class")
        if isinstance(algorithm, str):
            if accept_names:
                return cls.init(algorithm)
            raise TypeError(
                f"algorithm must be a {cls.frontend}.Algorithm, got the string {algorithm!r}; "
                f"use Algorithm.init({algorithm!r}, ...) to build one by name"
            )
        accepted = [
            f"a {cls.frontend}.Algorithm (e.g. GradientAllReduceAlgorithm())",
            "a bagua_core.algorithms description",
        ]
        if accept_names:
            accepted.append(f"one of the names {', '.join(cls.registered())}")
        accepted = ", ".join(accepted[:-1]) + " or " + accepted[-1]
        raise TypeError(f"algorithm must be {accepted}; got {type(algorithm).__name__}")

    def __eq__(self, other):
        return type(self) is type(other) and self._description == other._description

    def __hash__(self):
        return hash((type(self), self._description))

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{f.name}={getattr(self._description, f.name)!r}" for f in dataclasses.fields(self._description)
        )
        return f"{type(self).__name__}({fields})"


def _constructor(cls, own_arguments: Dict[str, str]):
    """``cls.__init__`` with the public signature: the class's own arguments,
    then the description's fields (less ``derived_fields``) with their
    defaults; a call is bound to it and handed, by keyword, to the class's
    own ``__init__`` (or the inherited one)."""
    implementation = getattr(cls.__init__, "__wrapped__", cls.__init__)
    try:  # the class's own annotations as types, where they resolve
        own = list(inspect.signature(implementation, eval_str=True).parameters.values())
    except NameError:
        own = list(inspect.signature(implementation).parameters.values())
    if own[-1].kind is not inspect.Parameter.VAR_KEYWORD:
        raise TypeError(
            f"{cls.__name__}.__init__ must end with **fields: the description's fields are its "
            f"arguments, with their defaults, and are not repeated"
        )
    own = own[:-1]
    types = typing.get_type_hints(cls.core_type)
    fields = [f for f in dataclasses.fields(cls.core_type) if f.init and f.name not in cls.derived_fields]
    field_names = {f.name for f in fields}
    repeated = sorted(field_names & ({p.name for p in own} | own_arguments.keys()))
    if repeated:
        raise TypeError(
            f"{cls.__name__} repeats the description's {', '.join(repeated)}: "
            f"declare and document them in {cls.core_type.__name__} only"
        )
    if any(f.default_factory is not dataclasses.MISSING for f in fields):
        raise TypeError(f"{cls.core_type.__name__}: give its fields plain defaults (a signature shows them)")
    signature = inspect.Signature(
        own
        + [
            inspect.Parameter(
                f.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default,
                annotation=types.get(f.name, inspect.Parameter.empty),
            )
            for f in fields
        ]
    )

    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError as e:  # as Python words it, naming the class called
            raise TypeError(f"{cls.__name__}.__init__() {e}") from None
        arguments = dict(bound.arguments)
        del arguments[own[0].name]
        implementation(self, **arguments)

    __init__.__signature__ = signature
    __init__.__wrapped__ = implementation
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    return __init__
