"""The fold's tables of what each event type sets (migrations/definitions/30_fold.sql) say the truth.

Both ways: the tables list exactly the event types of the job and workflow
machines of app/events/states.py (a type added to the state machine and not to
the fold, or the other way round, fails here), and each column's rule in the
fold's UPDATEs names exactly the event types the table lists for that column.
(Tokens have their own fold, 70_tokens.sql.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qforge.events import states

FOLD = Path(__file__).resolve().parent.parent / "migrations" / "definitions" / "30_fold.sql"
NEW_ROW = "the new row"
# Set by every event of a stream, by the same rule whatever its type.
EVERY_EVENT = {"version", "updated_at", "last_position", "chain", "status"}
# The row each machine's fold updates.
TABLES = {"job": "jobs j", "workflow": "workflows w"}


def table(text: str, machine: str) -> dict[str, set[str]]:
    """{event type: the columns it sets} from the comment table headed `-- <machine> event`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"--\s+{machine} event\s+sets$", line)) + 2
    found: dict[str, set[str]] = {}
    for line in lines[start:]:
        row = re.match(r"--\s+([A-Z][A-Za-z]+)\s{2,}(.+)$", line)
        if not row:
            break
        sets = re.sub(r"\([^)]*\)", "", row.group(2))
        found[row.group(1)] = {NEW_ROW} if sets.startswith(NEW_ROW) else {
            column.strip() for column in sets.split(",")}
    return found


def rules(text: str, machine: str) -> dict[str, set[str]]:
    """{event type: the columns whose rule names it} from the fold's UPDATE of the machine's rows."""
    body = text.split(f"UPDATE {TABLES[machine]} SET", 1)[1].split("\n          FROM ", 1)[0]
    body = re.sub(r"--[^\n]*", "", body)
    found: dict[str, set[str]] = {}
    for column, rule in re.findall(r"^\s{12}([a-z_]+) = (.*?)(?=^\s{12}[a-z_]+ = |\Z)", body,
                                   re.MULTILINE | re.DOTALL):
        for event in re.findall(r"'([A-Z][A-Za-z]+)'", rule):
            found.setdefault(event, set()).add(column)
    return found


@pytest.mark.parametrize("machine", TABLES)
def test_the_table_lists_the_machines_event_types(machine: str) -> None:
    listed = table(FOLD.read_text(), machine)
    machine_events = {event for _, event in states.MACHINES[machine]}
    assert sorted(machine_events - listed.keys()) == [], "in states.py, not in the fold's table"
    assert sorted(listed.keys() - machine_events) == [], "in the fold's table, not in states.py"
    # a stream's first event makes the row: the one whose transition starts from NEW
    assert {event for event, sets in listed.items() if sets == {NEW_ROW}} == {
        event for source, event in states.MACHINES[machine] if source == states.NEW}


@pytest.mark.parametrize("machine", TABLES)
def test_the_table_is_what_the_rules_say(machine: str) -> None:
    text = FOLD.read_text()
    listed = {event: sets for event, sets in table(text, machine).items() if sets != {NEW_ROW}}
    named = rules(text, machine)
    assert named, "no rules found: has the UPDATE's layout changed?"
    assert not set().union(*named.values()) & EVERY_EVENT, "the every-event columns name no event"
    assert named == {event: sets for event, sets in listed.items() if sets}


def test_the_check_sees_a_missing_row() -> None:
    """The parsing is not vacuous: a table without Heartbeat, or a rule without it, reads differently."""
    text = FOLD.read_text()
    assert "Heartbeat" in table(text, "job") and "Heartbeat" in rules(text, "job")
    without_row = re.sub(r"^-- Heartbeat .*\n", "", text, flags=re.MULTILINE)
    assert "Heartbeat" not in table(without_row, "job")
    without_rule = text.replace("WHEN e.type IN ('Claimed', 'Heartbeat')", "WHEN e.type IN ('Claimed')")
    assert "Heartbeat" not in rules(without_rule, "job")
