"""A job or a workflow as it was at any log position: the live fold, applied to a prefix of the log.

"As of position P" is the fold of the stream's events with position <= P
(GET /jobs/{id}?as_of=P, GET /workflows/{id}?as_of=P), by the very fold of the
live path, into temporary tables of one transaction that is rolled back. The
answer has the shape of the live GET, built by the same view functions.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from qforge.projections.jobs import job_view
from qforge.projections.replay.common import create_scratch_tables, fold_into, live_schema
from qforge.projections.workflows import workflow_view
from qforge.sql import q


class _Rollback(Exception):
    """Ends the as-of transaction without keeping anything."""


def _folded(conn, stream_ids: list[UUID], position: int, read) -> Any:
    """Fold the streams up to `position` into temporary tables, `read(cur)`, roll back."""
    result: list[Any] = []
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            live = live_schema(cur)
            create_scratch_tables(cur, None, live)
            if stream_ids:
                fold_into(cur, None, live, first=1, last=position, as_of=position, ids=stream_ids)
            result.append(read(cur))
            raise _Rollback
    except _Rollback:
        pass
    return result[0]


def job_row_as_of(conn, job_id: UUID, position: int) -> dict[str, Any] | None:
    """The jobs row of `job_id` folded up to `position`; None if it did not exist yet."""
    def read(cur) -> dict[str, Any] | None:
        cur.execute(q("asof_job"), {"id": job_id})
        return cur.fetchone()

    return _folded(conn, [job_id], position, read)


def job_as_of(conn, job_id: UUID, position: int) -> dict[str, Any] | None:
    """GET /jobs/{id} as it would have answered once the log reached `position`."""
    row = job_row_as_of(conn, job_id, position)
    return None if row is None else job_view(row)


def workflow_rows_as_of(conn, workflow_id: UUID,
                        position: int) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The workflows row and its steps' jobs rows folded up to `position`; None if not yet submitted."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("replay_workflow_streams"), {"id": workflow_id, "position": position})
        streams = [row["stream_id"] for row in cur.fetchall()]

    def read(cur) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        cur.execute(q("asof_workflow"), {"id": workflow_id})
        workflow = cur.fetchone()
        if workflow is None:
            return None
        cur.execute(q("asof_workflow_steps"), {"id": workflow_id})
        return workflow, cur.fetchall()

    return _folded(conn, streams, position, read)


def workflow_as_of(conn, workflow_id: UUID, position: int) -> dict[str, Any] | None:
    """GET /workflows/{id} as it would have answered once the log reached `position`."""
    found = workflow_rows_as_of(conn, workflow_id, position)
    return None if found is None else workflow_view(*found)
