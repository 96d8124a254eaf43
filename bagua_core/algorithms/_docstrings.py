"""The ``Args:`` section of a docstring (Google style), one entry per
argument: a description documents its fields there once, and each
frontend's class lists them from it (:mod:`bagua_core.algorithms.frontend`).

An entry starts at the section's indentation with ``name: text``; deeper
lines continue it. The section ends at the first line that is not indented.
"""

from __future__ import annotations

import inspect
import re
from typing import Dict, Iterable, Tuple

_ENTRY = re.compile(r"(\w+)\s*:\s?(.*)")


def split_arguments(doc: str) -> Tuple[str, Dict[str, str]]:
    """(``doc`` without its Args section, {argument: its text}); the text's
    continuation lines keep their indentation relative to the entry."""
    lines = inspect.cleandoc(doc or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "Args:"), None)
    if start is None:
        return "\n".join(lines).strip(), {}
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(" ")):
        end += 1
    body = lines[start + 1 : end]
    indent = min((len(line) - len(line.lstrip()) for line in body if line.strip()), default=0)
    entries: Dict[str, list] = {}
    current = None
    for line in body:
        head = line[indent:]
        match = _ENTRY.fullmatch(head) if head[:1].strip() else None
        if match:
            current = entries.setdefault(match.group(1), [match.group(2)])
        elif current is not None:
            current.append(head.rstrip())
    rest = "\n".join(lines[:start] + lines[end:])
    rest = re.sub(r"\n{3,}", "\n\n", rest).strip()
    return rest, {name: "\n".join(text).rstrip() for name, text in entries.items()}


def arguments_section(entries: Iterable[Tuple[str, str]]) -> str:
    """An Args section listing ``(name, text)`` entries in their order."""
    lines = ["Args:"]
    for name, text in entries:
        first, *rest = text.split("\n")
        lines.append(f"    {name}: {first}")
        lines.extend(f"    {line}" if line else "" for line in rest)
    return "\n".join(lines)
