"""SQL lives in .sql files here, one per area, each query under a `-- name: x --` header."""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*-*\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    queries: dict[str, str] = {}
    for path in sorted(Path(__file__).parent.glob("*.sql")):
        text = path.read_text()
        marks = list(_HEADER.finditer(text))
        for i, mark in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            name = mark.group(1)
            if name in queries:
                raise RuntimeError(f"query {name} defined twice ({path.name})")
            queries[name] = text[mark.end():end].strip().rstrip(";")
    return queries


_INCLUDE = re.compile(r"^[ \t]*--[ \t]*include:[ \t]*([a-z0-9_]+)[ \t]*$", re.MULTILINE)


def _include(queries: dict[str, str]) -> dict[str, str]:
    """A line `-- include: name` stands for query `name`'s text (one level: a part two statements share)."""
    def text(mark: re.Match) -> str:
        if mark.group(1) not in queries:
            raise RuntimeError(f"-- include: {mark.group(1)}: no such query")
        return queries[mark.group(1)]
    return {name: _INCLUDE.sub(text, body) for name, body in queries.items()}


QUERIES: dict[str, str] = _include(_load())


def q(name: str) -> str:
    """The text of query `name` (KeyError names it when missing)."""
    return QUERIES[name]
