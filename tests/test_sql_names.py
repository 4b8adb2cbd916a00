"""Every named statement in app/sql is used somewhere, and every q("name") names one that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qforge import sql
from qforge.sql import QUERIES

ROOT = Path(__file__).resolve().parent.parent
# Where a statement can be used: the package's code, its own SQL (-- include:), the benchmarks.
USERS = [*ROOT.joinpath("app").rglob("*.py"), *ROOT.joinpath("app", "sql").glob("*.sql"),
         *(path for path in ROOT.joinpath("bench").rglob("*.py")
           # not the peers' venvs (bench/.peers-venv, bench/.oban-venv): a library's name is no use
           if not any(part.startswith(".") for part in path.relative_to(ROOT).parts))]
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


def test_includes_are_expanded_at_load() -> None:
    # The fenced reports that lock their rows first share one fence (job_current_attempt),
    # written once; the completion fences in the UPDATE that folds it, on the same terms.
    fence = QUERIES["job_current_attempt"]
    for name in ("job_heartbeat", "job_fail", "job_release"):
        assert fence in QUERIES[name], name
    for term in ("j.id = r.id AND j.attempts = r.attempt",
                 "j.attempts > 0 AND state_allows('job', j.status, 'Succeeded')"):
        assert term in QUERIES["job_complete"], term
    assert "ON r.id = j.id AND r.attempt = j.attempts" in fence
    assert "AND j.attempts > 0 AND state_allows('job', j.status, (SELECT event FROM fence))" in fence
    assert [name for name, text in QUERIES.items() if sql._INCLUDE.search(text)] == []


def test_an_unknown_include_fails_loudly() -> None:
    queries = {"part": "SELECT 1", "whole": "WITH x AS (\n    -- include: part\n) TABLE x",
               "broken": "WITH x AS (\n    -- include: no_such_part\n) TABLE x"}
    with pytest.raises(RuntimeError, match="no_such_part"):
        sql._include(queries)
    del queries["broken"]
    assert sql._include(queries)["whole"] == "WITH x AS (\nSELECT 1\n) TABLE x"
