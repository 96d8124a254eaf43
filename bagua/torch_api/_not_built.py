"""Names of Bagua 0.9 that this Bagua does not build yet: importable, so that
scripts and integrations load, and raising ``NotImplementedError`` naming
them when used."""

from __future__ import annotations


def not_built(name: str, module: str) -> type:
    """A class ``name`` whose construction raises ``NotImplementedError``."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{module}.{name} of Bagua 0.9 is not built in this Bagua yet")

    return type(
        name,
        (),
        {
            "__init__": __init__,
            "__module__": module,
            "__doc__": f"Bagua 0.9's {name}: not built in this Bagua yet (raises when used).",
        },
    )
