"""Every named statement in app/sql is used somewhere, and every q("name") names one that exists."""

from __future__ import annotations

import re
from pathlib import Path

from qforge.sql import QUERIES

ROOT = Path(__file__).resolve().parent.parent
# Where a statement can be used: the package's code, its own SQL (-- include:), the benchmarks.
USERS = [*ROOT.joinpath("app").rglob("*.py"), *ROOT.joinpath("app", "sql").glob("*.sql"),
         *ROOT.joinpath("bench").rglob("*.py")]
# q("x"), template("x", ...), QUERIES["x"], and names handed on as strings ("x").
NAMED_USE = r"""["']{name}["']|--\s*include:\s*{name}\b"""
CALL = re.compile(r"""\b(?:q|template)\(\s*["']([a-z0-9_]+)["']""")


def _sources() -> str:
    return "\n".join(path.read_text() for path in USERS)


def test_every_named_statement_is_used() -> None:
    sources = _sources()
    # A statement's own header line does not count as a use of it.
    sources = re.sub(r"^--\s*name:.*$", "", sources, flags=re.MULTILINE)
    unused = [name for name in QUERIES if not re.search(NAMED_USE.format(name=name), sources)]
    assert unused == [], f"named statements nothing uses: {unused}"


def test_every_called_statement_exists() -> None:
    missing = sorted({name for name in CALL.findall(_sources()) if name not in QUERIES})
    assert missing == [], f"q()/template() name statements that app/sql does not define: {missing}"
