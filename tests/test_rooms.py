"""The rooms keep their doors: imports run one way (docs/ARCHITECTURE.md).

app/events/ is the core and knows none of its callers; app/log/ and app/audit/ are
libraries under the commands and the API, so they know no HTTP and no command line.
Read from the source with ast (every import, also one inside a function).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"

FORBIDDEN = {
    "events": ("qforge.log", "qforge.audit", "qforge.commands", "qforge.api"),
    "log": ("qforge.api", "qforge.cli"),
    "audit": ("qforge.api", "qforge.cli"),
}


def imported(path: Path, source: str | None = None) -> set[str]:
    """Every module that `path` (or `source`, as if it were there) imports, by absolute
    name (relative imports resolved)."""
    package = "qforge." + ".".join(path.relative_to(APP).parent.parts)
    names: set[str] = set()
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def breaks(name: str, forbidden: tuple[str, ...]) -> bool:
    return any(name == room or name.startswith(room + ".") for room in forbidden)


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_a_room_imports_nothing_from_the_rooms_above_it(room):
    files = sorted((APP / room).rglob("*.py"))
    assert files, f"app/{room}/ has no modules"
    wrong = {f"{path.relative_to(APP)} imports {name}"
             for path in files for name in imported(path) if breaks(name, FORBIDDEN[room])}
    assert not wrong, sorted(wrong)


def test_the_check_sees_a_forbidden_import():
    """The test above can fail: an import of a room above is seen, also inside a function
    and also when relative."""
    probe = APP / "events" / "probe.py"
    for source in ("def f():\n    from qforge.api import app\n", "from ..log import segments\n",
                   "import qforge.commands.enqueue\n"):
        assert any(breaks(name, FORBIDDEN["events"]) for name in imported(probe, source)), source
    assert not any(breaks(name, FORBIDDEN["events"]) for name in imported(probe, "from . import store\n"))
