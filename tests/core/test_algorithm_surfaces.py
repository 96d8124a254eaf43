"""Each algorithm's arguments are defined once, by its bagua_core description,
and three surfaces are built from it: bagua_torch's class, bagua_jax's, and
bagua.torch_api's (torch's class under Bagua 0.9.2's package path). For every
registered algorithm this proves they agree with the description:

* every surface lists it, under the same class name, from the registry
  (``__all__``, ``Algorithm.registered()``, ``Algorithm.init(name)``);
* the classes' parameters (names, order, defaults, types) are the
  description's fields, after the frontend's own arguments (QAdam: its
  optimizer, whose hyperparameters give two of the fields);
* built with non-default arguments, by keyword and by position, every
  surface gives the description built with them;
* bad arguments raise the same error from every surface: the description's
  (same type, same message) for a bad value or type, and the same TypeError
  from every frontend for a call that does not fit the signature;
* ``help()`` lists every argument with the description's text of it, which
  documents every field.
"""

from __future__ import annotations

import dataclasses
import inspect
import pydoc
import typing

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("optax")

import bagua.torch_api.algorithms as api  # noqa: E402
import bagua_jax  # noqa: E402
import bagua_jax.algorithms as ja  # noqa: E402
import bagua_torch.algorithms as ta  # noqa: E402
from bagua_core import algorithms as core  # noqa: E402
from bagua_core.algorithms._docstrings import split_arguments  # noqa: E402

NAMES = core.names()
SURFACES = {"torch": ta, "jax": ja, "torch_api": api}

# A frontend's own arguments (before the description's fields), and the fields
# they set: QAdam takes its optimizer, whose warm-up and first beta are its own.
QADAM_WARMUP, QADAM_BETA1 = 7, 0.5
OWN_ARGUMENTS = {"qadam": (["q_adam_optimizer"], {"warmup_steps": QADAM_WARMUP, "beta1": QADAM_BETA1})}

# Non-default values the test cannot make up from a field's type (str fields,
# fields that need another's value); the others: see non_default().
NON_DEFAULT = {
    "decentralized": {"peer_selection_mode": "shift_one"},
    "halfgrad": {"wire": "bfloat16"},
    # error_feedback=True and topk_density need a top-k compression; hierarchical=True refuses an overlap
    "local_steps": {"compression": "topk_uint2", "overlap_steps": 0},
    "async": {"peer_selection_mode": "all"},  # the only mode
}


def own_arguments(surface: str, name: str) -> list:
    """The values of the frontend's own arguments of algorithm ``name``."""
    if name != "qadam" or surface == "core":
        return []
    if surface == "jax":
        return [bagua_jax.qadam(0.1, warmup_steps=QADAM_WARMUP, b1=QADAM_BETA1)]
    params = [torch.nn.Parameter(torch.ones(3))]
    return [ta.QAdamOptimizer(params, warmup_steps=QADAM_WARMUP, betas=(QADAM_BETA1, 0.999))]


def frontend_class(surface: str, name: str) -> type:
    """The class of algorithm ``name`` among those ``surface`` lists."""
    found = [c for c in SURFACES[surface].Algorithm.classes().values() if c.core_type is core.description_type(name)]
    assert len(found) == 1, (surface, name, found)
    return found[0]


def public_fields(name: str) -> list:
    derived = OWN_ARGUMENTS.get(name, ([], {}))[1]
    return [f for f in dataclasses.fields(core.description_type(name)) if f.name not in derived]


def build(surface: str, name: str, *args, **kwargs):
    """The description that ``surface`` builds from arguments meant for the
    frontends' signature (core: the same, as keywords, plus the derived fields)."""
    if surface == "core":
        derived = OWN_ARGUMENTS.get(name, ([], {}))[1]
        if len(args) > len(public_fields(name)):  # the dataclass refuses them itself
            return core.description_type(name)(*args, **kwargs, **derived)
        return core.description_type(name)(
            **dict(zip([f.name for f in public_fields(name)], args)), **kwargs, **derived
        )
    return frontend_class(surface, name)(*own_arguments(surface, name), *args, **kwargs).to_core()


def outcome(surface: str, name: str, *args, **kwargs):
    """The description built, or (the error's type, its message)."""
    try:
        return build(surface, name, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the errors are what is compared
        return type(e), str(e)


def field_type(name: str, field: dataclasses.Field) -> type:
    return typing.get_type_hints(core.description_type(name))[field.name]


def non_default(name: str, field: dataclasses.Field):
    if field.name in NON_DEFAULT.get(name, {}):
        return NON_DEFAULT[name][field.name]
    kind = field_type(name, field)
    if kind is bool:
        return not field.default
    if kind is int:
        return field.default + 1
    if kind is float:
        return field.default / 2 if field.default else 0.5
    pytest.fail(f"{name}: give its field {field.name} a non-default value in NON_DEFAULT")


# Values of the wrong type for a field of each type (the description refuses
# them), and values at or past the edges (every surface must do as it does).
WRONG_TYPE = {
    bool: [1, 0, None, "yes"],
    int: [1.5, True, "1", None],
    float: ["0.5", True, None],
    str: [8, None, b"all"],
}
EDGES = {bool: [], int: [-1, 0, 1], float: [-1.0, 0.0, 1.0, float("nan"), float("inf")], str: ["", "nope"]}


# ---------------------------------------------------------------- listings


def test_every_surface_lists_the_registered_algorithms_under_one_class_name():
    assert NAMES
    for surface, module in SURFACES.items():
        assert module.Algorithm.registered() == list(NAMES), surface
        listed = [
            n
            for n in module.__all__
            if isinstance(getattr(module, n), type)
            and issubclass(getattr(module, n), module.Algorithm)
            and getattr(module, n) is not module.Algorithm
        ]
        assert sorted(listed) == sorted(c.__name__ for c in module.Algorithm.classes().values()), surface
        assert len(listed) == len(NAMES), surface
    assert [n for n in bagua_jax.__all__ if n.endswith("Algorithm")] == list(ja.Algorithm.classes())
    for name in NAMES:
        torch_cls, jax_cls, api_cls = (frontend_class(s, name) for s in SURFACES)
        assert api_cls is torch_cls, name
        assert jax_cls.__name__ == torch_cls.__name__, name
        assert getattr(ta, torch_cls.__name__) is torch_cls and getattr(api, torch_cls.__name__) is torch_cls
        assert getattr(ja, jax_cls.__name__) is jax_cls and getattr(bagua_jax, jax_cls.__name__) is jax_cls
        for cls in (torch_cls, jax_cls):
            assert cls.core_type is core.description_type(name)
            if name not in OWN_ARGUMENTS:
                assert type(cls.init(name)) is cls and cls.from_core(core.by_name(name)) == cls()


def test_the_original_public_names_are_there():
    for name in (
        "GradientAllReduceAlgorithm",
        "ByteGradAlgorithm",
        "DecentralizedAlgorithm",
        "LowPrecisionDecentralizedAlgorithm",
        "QAdamAlgorithm",
        "AsyncModelAverageAlgorithm",
        "LocalStepsAlgorithm",
        "LowRankAlgorithm",
    ):
        for module in (ta, ja, api, bagua_jax):
            assert isinstance(getattr(module, name), type), (module.__name__, name)
    assert api.QAdamOptimizer is ta.QAdamOptimizer


# ---------------------------------------------------------------- signatures


@pytest.mark.parametrize("name", NAMES)
def test_signatures_are_the_description_fields(name):
    own = OWN_ARGUMENTS.get(name, ([], {}))[0]
    types = typing.get_type_hints(core.description_type(name))
    want = [(f.name, f.default, types[f.name]) for f in public_fields(name)]
    for surface in SURFACES:
        cls = frontend_class(surface, name)
        params = list(inspect.signature(cls).parameters.values())
        assert [p.name for p in params[: len(own)]] == own, (surface, name)
        assert all(p.default is inspect.Parameter.empty for p in params[: len(own)])
        got = [(p.name, p.default, p.annotation) for p in params[len(own) :]]
        assert got == want, (surface, name)
        assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params), (surface, name)
        init = list(inspect.signature(cls.__init__).parameters.values())
        assert init[0].name == "self" and init[1:] == params, (surface, name)


# ---------------------------------------------------------------- building


@pytest.mark.parametrize("name", NAMES)
def test_non_default_arguments_give_the_equal_description(name):
    fields = public_fields(name)
    values = {f.name: non_default(name, f) for f in fields}
    want = build("core", name, **values)
    for f in fields:
        assert getattr(want, f.name) == values[f.name]
    assert want != build("core", name), name
    for surface in SURFACES:
        assert build(surface, name, **values) == want, (surface, name, "keywords")
        assert build(surface, name, *values.values()) == want, (surface, name, "positions")
        assert build(surface, name) == build("core", name), (surface, name, "defaults")
        for f in fields:  # one at a time, the others by default: each surface does as the description does
            one = {f.name: values[f.name]}
            assert outcome(surface, name, **one) == outcome("core", name, **one), (surface, name, one)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name", NAMES)
def test_bad_values_raise_the_description_error_from_every_surface(name):
    prefix = f"{core.description_type(name).__name__}: "
    for f in public_fields(name):
        for bad in WRONG_TYPE[field_type(name, f)]:
            want = outcome("core", name, **{f.name: bad})
            assert isinstance(want, tuple) and want[0] is TypeError and want[1].startswith(prefix), (f.name, bad, want)
            for surface in SURFACES:
                assert outcome(surface, name, **{f.name: bad}) == want, (surface, name, f.name, bad)
        for edge in EDGES[field_type(name, f)]:
            want = outcome("core", name, **{f.name: edge})
            assert not isinstance(want, tuple) or want[1].startswith(prefix), (f.name, edge, want)
            for surface in SURFACES:
                assert outcome(surface, name, **{f.name: edge}) == want, (surface, name, f.name, edge)


@pytest.mark.parametrize("name", NAMES)
def test_calls_that_do_not_fit_the_signature_raise_the_same_type_error(name):
    too_many = [non_default(name, f) for f in public_fields(name)] + [1]
    for args, kwargs in (((), {"nope": 1}), (too_many, {})):
        want = outcome("core", name, *args, **kwargs)
        assert isinstance(want, tuple) and want[0] is TypeError, (name, want)
        got = {surface: outcome(surface, name, *args, **kwargs) for surface in SURFACES}
        assert len(set(got.values())) == 1, got
        assert got["torch"][0] is TypeError and got["torch"][1].startswith(
            f"{frontend_class('torch', name).__name__}.__init__() "
        ), got
    if name in OWN_ARGUMENTS:  # the frontend's own arguments are required
        for surface in SURFACES:
            with pytest.raises(TypeError, match=r"__init__\(\) missing a required argument"):
                frontend_class(surface, name)()


# ---------------------------------------------------------------- docs


@pytest.mark.parametrize("name", NAMES)
def test_help_lists_every_argument_with_the_description_text(name):
    description = core.description_type(name)
    _, documented = split_arguments(description.__doc__)
    assert list(documented) == [f.name for f in dataclasses.fields(description)], (
        f"{description.__name__}'s Args section must document each field once, in order"
    )
    own = OWN_ARGUMENTS.get(name, ([], {}))[0]
    for surface in SURFACES:
        cls = frontend_class(surface, name)
        _, listed = split_arguments(cls.__doc__)
        assert list(listed) == own + [f.name for f in public_fields(name)], (surface, name)
        for field in public_fields(name):
            assert listed[field.name] == documented[field.name], (surface, name, field.name)
        text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
        for field in public_fields(name):
            assert documented[field.name].split("\n")[0] in text, (surface, name, field.name)


def test_a_frontend_class_may_not_repeat_a_description_field():
    class Base(ta.Algorithm):
        _classes: dict = {}

    with pytest.raises(TypeError, match="must end with \\*\\*fields"):

        class Retyped(Base):
            core_type = core.ByteGrad

            def __init__(self, hierarchical: bool = True):
                super().__init__(hierarchical=hierarchical)

    with pytest.raises(TypeError, match="repeats the description's average"):

        class Redocumented(Base):
            """Retyped docs.

            Args:
                average: retyped.
            """

            core_type = core.GradientAllReduce
