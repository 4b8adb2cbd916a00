"""Check a response body against what /openapi.json says the route answers."""

from __future__ import annotations

from typing import Any

import jsonschema


def response_schema(spec: dict, method: str, path: str, status: int) -> dict:
    operation = spec["paths"][path][method.lower()]
    content = operation["responses"][str(status)]["content"]["application/json"]
    return {**content["schema"], "components": spec["components"]}


def assert_matches(spec: dict, method: str, path: str, status: int, body: Any) -> None:
    """`body` is what the document promises for `method path` answering `status` (path as the
    document spells it, e.g. /jobs/{job_id})."""
    validator = jsonschema.Draft202012Validator(response_schema(spec, method, path, status))
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]
    assert not problems, (method, path, status, problems[:5])
