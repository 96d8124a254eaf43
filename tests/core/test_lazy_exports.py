"""bagua_core loads its public names on first use (``_EXPORTS``); its ``if TYPE_CHECKING:`` imports
are what type checkers see of them. Both must name the same things from the same modules."""

import ast
import inspect

import bagua_core


def _type_checking_imports() -> dict:
    tree = ast.parse(inspect.getsource(bagua_core))
    blocks = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    assert len(blocks) == 1
    seen = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        for alias in node.names:
            assert alias.asname is None, ast.unparse(node)
            seen[alias.name] = node.module.removeprefix("bagua_core.")
    return seen


def test_type_checkers_see_every_lazy_name():
    assert _type_checking_imports() == bagua_core._MODULE_OF


def test_every_public_name_loads():
    assert set(bagua_core.__all__) <= set(bagua_core._MODULE_OF)
    for name in bagua_core.__all__:
        assert getattr(bagua_core, name) is not None, name
