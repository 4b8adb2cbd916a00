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
    "events": ("qforge.log", "qforge.audit", "qforge.commands", "qforge.api", "qforge.workflows", "qforge.workers",
               "qforge.projections", "qforge.cli"),
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


# Rooms whose modules import at the top only: an import inside a function hid a circle there.
TOP_LEVEL_ONLY = ("commands", "workflows")


def local_imports(path: Path, source: str | None = None) -> list[str]:
    """`path:line` of every import inside a function of `path` (or of `source`)."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [f"{path.relative_to(APP)}:{inner.lineno}" for inner in ast.walk(node)
                      if isinstance(inner, (ast.Import, ast.ImportFrom))]
    return found


@pytest.mark.parametrize("room", TOP_LEVEL_ONLY)
def test_a_room_imports_nothing_inside_a_function(room):
    found = [where for path in sorted((APP / room).rglob("*.py")) for where in local_imports(path)]
    assert not found, found


def module_name(path: Path) -> str:
    parts = path.relative_to(APP).with_suffix("").parts
    return ".".join(("qforge",) + (parts[:-1] if parts[-1] == "__init__" else parts))


def top_level_imports(path: Path, source: str | None = None) -> set[str]:
    """The app modules `path` imports when it is loaded: its imports outside functions
    (and outside `if TYPE_CHECKING:`), `from package import module` as the module."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    names: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
                names.add(module)
                names.update(f"{module}.{alias.name}" for alias in node.names)
            visit(ast.iter_child_nodes(node))

    visit(tree.body)
    return names


def import_graph(sources: dict[Path, str] | None = None) -> dict[str, set[str]]:
    """module -> the app modules it imports at load time (sources: files to add or replace)."""
    files = {path: None for path in APP.rglob("*.py")}
    files.update(sources or {})
    modules = {module_name(path): path for path in files}
    return {module_name(path): {name for name in top_level_imports(path, source)
                                if name in modules and name != module_name(path)}
            for path, source in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (one per strongly connected group of modules, Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return found


def test_no_import_circle_among_app_modules():
    assert not circles(import_graph()), circles(import_graph())


def test_the_checks_see_a_local_import_and_a_circle():
    """The two tests above can fail: an import inside a method is seen, and two modules
    that import each other (also relatively, also as `from package import module`) make a circle."""
    probe = APP / "workflows" / "probe.py"
    assert local_imports(probe, "class A:\n    def f(self):\n        import json\n") == ["workflows/probe.py:3"]
    assert not local_imports(probe, "import json\n\ndef f():\n    return json\n")
    graph = import_graph({probe: "from qforge.workflows import dag\n",
                          APP / "workflows" / "dag.py": "from . import probe\n"})
    assert ["qforge.workflows.dag", "qforge.workflows.probe"] in circles(graph)
    graph = import_graph({probe: "def f():\n    from qforge.workflows import dag\n"})
    assert not circles(graph)
