"""The house stays readable: no module in app/ over 400 lines, no Python function over 60 (issue 31).

Read from the source (line counts, and ast for the functions: a function's lines run
from its `def` to its last line, nested functions counted in it and on their own).
"""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def modules() -> list[Path]:
    return sorted(APP.rglob("*.py"))


def module_lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def long_functions(path: Path, source: str | None = None) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of each function in `path` (or `source`) over the limit."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                lines = child.end_lineno - child.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append((name, child.lineno, lines))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_no_module_in_app_is_over_400_lines():
    files = modules()
    assert len(files) > 100, "app/ not found where expected"
    over = [f"app/{path.relative_to(APP)}: {lines} lines" for path in files
            if (lines := module_lines(path)) > MAX_MODULE_LINES]
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them by concern): " + "; ".join(over)


def test_no_function_in_app_is_over_60_lines():
    over = [f"app/{path.relative_to(APP)}:{line} {name}: {lines} lines"
            for path in modules() for name, line, lines in long_functions(path)]
    assert not over, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named pieces): "
                      + "; ".join(over))


def test_the_checks_see_a_long_module_and_a_long_function(tmp_path):
    """The tests above can fail: a method, a nested function and an async one are all measured,
    and a module of 401 lines is one too many."""
    body = "".join(f"        x{n} = {n}\n" for n in range(MAX_FUNCTION_LINES))
    source = (f"class C:\n    def long(self):\n{body}"
              f"def outer():\n    async def inner():\n{body}"
              "def short():\n    return 1\n")
    names = [name for name, _, _ in long_functions(APP / "probe.py", source)]
    assert names == ["C.long", "outer", "outer.inner"], names
    probe = tmp_path / "probe.py"
    probe.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert module_lines(probe) > MAX_MODULE_LINES
