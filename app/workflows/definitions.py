"""Stored workflow definitions: store a new version, read them, start a workflow from one.

A definition is a workflow body (steps, result, deadline, tags) plus a
`retry_policy` for the steps that set none, kept as versions of one named
document: each PUT appends a DefinitionStored event to the name's `definition`
stream (its stream version is the definition's version), folded into
`definitions` / `definition_versions` (definitions/60_definitions.sql).
`definition_workflow` checks a start's inputs (NotFound / Invalid) and builds the workflow
it runs; callers that start runs (the API, schedules, sub-workflows) go through
`qforge.workflows.engine.start_definition`, which submits it.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row, tuple_row
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from qforge.commands.errors import Invalid, NotFound
from qforge.commands.specs import (MAX_STEPS, STEPS_LIMIT, ResultSpec, StepSpec, Storable, WorkflowSpec,
                                   check_tags)
from qforge.events import types as ev
from qforge.sql import q

# Stream ids of definitions: uuid5 of the name, so a name is one stream forever.
DEFINITION_NAMESPACE = uuid.UUID("5146f7a6-0f0e-4c1b-9d15-000000000015")


class RetryPolicy(BaseModel):
    """Applied to the steps of a definition that set no retry settings of their own."""

    model_config = ConfigDict(extra="forbid")

    max_retries: int | None = Field(default=None, ge=0, le=1000)
    backoff_base_seconds: float | None = Field(default=None, gt=0, le=86400)
    backoff_cap_seconds: float | None = Field(default=None, gt=0, le=30 * 86400)


class DefinitionSpec(Storable):
    """PUT /definitions/{name}: a workflow body without idempotency key, plus `retry_policy`; its
    `name`, when given (as in a POST /workflows body), must be the path's."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=200,
                             description="optional: when given, the same as the path's name")
    tags: dict[str, str] = Field(default_factory=dict)
    result: ResultSpec | None = None
    deadline_seconds: float | None = Field(default=None, gt=0, le=365 * 86400)
    retry_policy: RetryPolicy | None = None
    steps: list[StepSpec] = Field(min_length=1, max_length=MAX_STEPS, description=STEPS_LIMIT)

    def document(self) -> dict[str, Any]:
        """What is stored: the body as given (unset fields stay unset, so the retry policy can
        tell a step that chose its max_retries from one that did not)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"name"})


class RunRequest(Storable):
    """POST /definitions/{name}/runs."""

    model_config = ConfigDict(extra="forbid")

    inputs: dict[str, Any] = Field(default_factory=dict)
    version: StrictInt | None = Field(default=None, ge=1, le=2**31 - 1,
                                description="the version to run (default: the latest)")
    tags: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)


def stream_id(name: str) -> uuid.UUID:
    return uuid.uuid5(DEFINITION_NAMESPACE, name)


def workflow_spec(name: str, version: int, document: dict[str, Any], inputs: dict[str, Any], *,
                  tags: dict[str, str] | None = None,
                  idempotency_key: str | None = None) -> WorkflowSpec:
    """The workflow a definition version runs: the retry policy filled into the steps that set
    none, `inputs` into the payload of its root steps (Invalid if that makes no valid workflow)."""
    policy = document.get("retry_policy") or {}
    handlers = {s.get("on_failure") for s in document["steps"] if s.get("on_failure")}
    steps = []
    for step in document["steps"]:
        step = {**policy, **step} if policy else dict(step)
        is_root = not (step.get("depends_on") or step.get("when") or step.get("for_each")) \
            and step["step"] not in handlers
        if is_root:
            step["payload"] = {**step.get("payload", {}), "inputs": inputs}
        steps.append({k: v for k, v in step.items() if v is not None})
    body = {"name": name, "tags": {**document.get("tags", {}), **(tags or {})}, "steps": steps,
            "idempotency_key": idempotency_key,
            **{k: document[k] for k in ("result", "deadline_seconds") if k in document}}
    try:
        spec = WorkflowSpec.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as error:
        problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()]
        raise Invalid(f"definition {name} version {version} with these inputs is no valid workflow: "
                      + "; ".join(problems), problems) from None
    return spec


def store_definition(conn, name: str, spec: DefinitionSpec, *, actor: str = "api",
                     now: datetime | None = None) -> dict[str, Any]:
    """Append a new version (every problem of the graph at once: Invalid, nothing stored)."""
    if spec.name is not None and spec.name != name:
        message = f"the body's name '{spec.name}' differs from the path's name '{name}'"
        raise Invalid(message, [{"field": "name", "message": message}])
    problems = WorkflowSpec.model_validate(
        {"name": name, "steps": [s.model_dump(by_alias=True, exclude_unset=True) for s in spec.steps],
         **({"result": spec.result.model_dump()} if spec.result else {})}).problems()
    if problems:
        raise Invalid(f"invalid definition {name}: " + "; ".join(problems), problems)
    data = ev.DefinitionStored(name=name, document=spec.document()).model_dump(mode="json")
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        # one writer per name: versions follow each other without gaps or races
        cur.execute(q("definition_lock"), {"name": name})
        cur.execute(q("definition_append"), {"id": stream_id(name), "name": name, "data": json.dumps(data),
                                             "actor": actor, "now": now})
        version = cur.fetchone()[0]
    found = get_definition(conn, name, version)
    assert found is not None
    return found


def get_definition(conn, name: str, version: int | None = None) -> dict[str, Any] | None:
    """A definition's version (the latest without `version`); None if there is none."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("definition_get"), {"name": name, "version": version})
        return cur.fetchone()


def list_definitions(conn, *, limit: int = 50, cursor: str | None = None) -> tuple[list[dict], str | None]:
    """Definitions by name (their latest version); (items, next cursor or None)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q("definitions_list"), {"after": cursor, "limit": limit + 1})
        rows = cur.fetchall()
    return rows[:limit], (rows[limit - 1]["name"] if len(rows) > limit else None)


def definition_workflow(conn, name: str, inputs: dict[str, Any] | None, *, version: int | None = None,
                        tags: dict[str, str] | None = None,
                        idempotency_key: str | None = None) -> tuple[WorkflowSpec, dict[str, Any]]:
    """The workflow `version` of `name` (the latest without it) runs with `inputs`, and the
    {"name", "version"} it records. NotFound for an unknown definition or version, Invalid for
    inputs that are not a JSON object or make no valid workflow."""
    if inputs is not None and not isinstance(inputs, dict):
        raise Invalid("inputs must be a JSON object", ["inputs: must be an object"])
    found = get_definition(conn, name, version)
    if found is None:
        raise NotFound(f"definition {name} " + (f"has no version {version}" if version else "not found"))
    if tags:
        try:
            check_tags(tags)
        except ValueError as error:
            raise Invalid(str(error), [f"tags: {error}"]) from None
    spec = workflow_spec(name, found["version"], found["document"], inputs or {}, tags=tags,
                         idempotency_key=idempotency_key)
    return spec, {"name": name, "version": found["version"]}
