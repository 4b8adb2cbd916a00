"""A job or a workflow as it was at any log position: the live fold, applied to a prefix of the log.

"As of position P" is the fold of the stream's events with position <= P
(GET /jobs/{id}?as_of=P, GET /workflows/{id}?as_of=P). The answer has the
shape of the live GET, built by the same view functions.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from qforge.projections.jobs import job_view
from qforge.projections.workflows import workflow_view
from qforge.sql import q


def job_row_as_of(conn, job_id: UUID, position: int) -> dict[str, Any] | None:
    """The jobs row of `job_id` folded up to `position`; None if it did not exist yet."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("job_as_of"), {"id": job_id, "position": position})
        return cur.fetchone()


def job_as_of(conn, job_id: UUID, position: int) -> dict[str, Any] | None:
    """GET /jobs/{id} as it would have answered once the log reached `position`."""
    row = job_row_as_of(conn, job_id, position)
    return None if row is None else job_view(row)


def workflow_rows_as_of(conn, workflow_id: UUID,
                        position: int) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The workflows row and its steps' jobs rows folded up to `position`; None if not yet submitted."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("workflow_as_of"), {"id": workflow_id, "position": position})
        workflow = cur.fetchone()
        if workflow is None:
            return None
        cur.execute(q("workflow_steps_as_of"), {"id": workflow_id, "position": position})
        return workflow, cur.fetchall()


def workflow_as_of(conn, workflow_id: UUID, position: int) -> dict[str, Any] | None:
    """GET /workflows/{id} as it would have answered once the log reached `position`."""
    found = workflow_rows_as_of(conn, workflow_id, position)
    return None if found is None else workflow_view(*found)
