"""The routes of the client beyond jobs and workflows: resume and proofs, stored definitions,
schedules, queue settings, tokens, the stream ticket, stats, metrics and the compatibility routes,
each parsed with the model the API answers with."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import importlib

from qforge.api import models
from qforge.client.routes import Call, _events, _model, query, route, validated
from qforge.workflows.definitions import DefinitionSpec, RunRequest
from qforge.commands.queues import QueueSettingsSpec
from qforge.commands.schedules import ScheduleSpec


def _api(module: str, name: str) -> Any:
    """A model of an API router module (qforge.api.routes.<module>), imported when first used: those
    modules import FastAPI, which `import qforge.client` should not cost."""
    return getattr(importlib.import_module(f"qforge.api.routes.{module}"), name)


def _parsed(module: str, name: str, items: bool = False) -> Any:
    def parse(body: Any) -> Any:
        value = _api(module, name).model_validate(body)
        return value.items if items else value
    return parse


def _json(body: Any) -> Any:
    return body


def _nothing(body: Any) -> None:
    return None


class ManageRoutes:
    """Mixed into Client and AsyncClient beside Routes (the same `_call`)."""

    _call: Any

    # workflows, beyond submitting and reading them --------------------------
    @route("POST", "/workflows/{workflow_id}/resume")
    def resume(self, workflow_id: UUID | str):
        """Run a failed or cancelled workflow's unsuccessful steps again -> WorkflowView."""
        return self._call(Call("POST", f"/workflows/{workflow_id}/resume", _model(models.WorkflowView)))

    @route("GET", "/jobs/{job_id}/proof")
    def job_proof(self, job_id: UUID | str) -> Any:
        """The job's events with their hashes and Merkle paths (a dict, as
        tools/verify_audit_proof.py reads it)."""
        return self._call(Call("GET", f"/jobs/{job_id}/proof", _json))

    @route("GET", "/workflows/{workflow_id}/proof")
    def workflow_proof(self, workflow_id: UUID | str) -> Any:
        return self._call(Call("GET", f"/workflows/{workflow_id}/proof", _json))

    # stored definitions ---------------------------------------------------
    @route("PUT", "/definitions/{name}")
    def put_definition(self, name: str, definition: DefinitionSpec | dict[str, Any]):
        """Store a new version -> DefinitionView (its version and the latest)."""
        body = validated(DefinitionSpec, definition)
        return self._call(Call("PUT", f"/definitions/{name}", _parsed("definitions", "DefinitionView"), body=body))

    @route("GET", "/definitions")
    def list_definitions(self, *, limit: int | None = None, cursor: str | None = None):
        """One page of definitions (each its latest version): DefinitionList(items, next)."""
        return self._call(Call("GET", "/definitions", _parsed("definitions", "DefinitionList"),
                               params=query(limit=limit, cursor=cursor)))

    @route("GET", "/definitions/{name}")
    def get_definition(self, name: str, version: int | None = None):
        """The latest version, or `version` -> DefinitionView."""
        return self._call(Call("GET", f"/definitions/{name}", _parsed("definitions", "DefinitionView"),
                               params=query(version=version)))

    @route("POST", "/definitions/{name}/runs")
    def run_definition(self, name: str, inputs: dict[str, Any] | None = None, *, version: int | None = None,
                       tags: dict[str, str] | None = None, idempotency_key: str | None = None):
        """Start a workflow of the latest version (or of `version`) -> WorkflowView; its
        `definition` names the version it runs."""
        request: dict[str, Any] = {"inputs": inputs or {}}
        for key, value in (("version", version), ("tags", tags), ("idempotency_key", idempotency_key)):
            if value is not None:
                request[key] = value
        body = validated(RunRequest, request)
        return self._call(Call("POST", f"/definitions/{name}/runs", _model(models.WorkflowView), body=body))

    # schedules ------------------------------------------------------------
    @route("POST", "/schedules")
    def create_schedule(self, schedule: ScheduleSpec | dict[str, Any]):
        """`{"name", "cron", "timezone"?, "job": {...} | "definition", "version"?, "inputs"?,
        "catch_up"?, "paused"?}` -> ScheduleView."""
        body = validated(ScheduleSpec, schedule)
        return self._call(Call("POST", "/schedules", _parsed("schedules", "ScheduleView"), body=body))

    @route("GET", "/schedules")
    def list_schedules(self):
        return self._call(Call("GET", "/schedules", _parsed("schedules", "ScheduleList", items=True)))

    @route("GET", "/schedules/{name}")
    def get_schedule(self, name: str):
        return self._call(Call("GET", f"/schedules/{name}", _parsed("schedules", "ScheduleView")))

    @route("GET", "/schedules/{name}/events")
    def schedule_events(self, name: str):
        return self._call(Call("GET", f"/schedules/{name}/events", _events))

    @route("PATCH", "/schedules/{name}")
    def update_schedule(self, name: str, **changes: Any):
        """Change fields (paused, cron, timezone, job, definition, version, inputs, catch_up); a
        field given as None is cleared (version=None: run the latest again)."""
        body = validated(_api("schedules", "SchedulePatch"), changes)
        return self._call(Call("PATCH", f"/schedules/{name}", _parsed("schedules", "ScheduleView"), body=body))

    def pause_schedule(self, name: str):
        return self.update_schedule(name, paused=True)

    def resume_schedule(self, name: str):
        return self.update_schedule(name, paused=False)

    @route("DELETE", "/schedules/{name}")
    def delete_schedule(self, name: str) -> Any:
        return self._call(Call("DELETE", f"/schedules/{name}", _nothing))

    # queues, tokens, the stream ticket -------------------------------------
    @route("PUT", "/queues/{name}")
    def configure_queue(self, name: str, **settings: Any):
        """Pause, resume or rate-limit a queue: rate_per_second, burst, paused -> QueueSettingsView."""
        body = validated(QueueSettingsSpec, settings)
        return self._call(Call("PUT", f"/queues/{name}", _parsed("queues", "QueueSettingsView"), body=body))

    @route("GET", "/tokens")
    def list_tokens(self, *, include_revoked: bool = False):
        return self._call(Call("GET", "/tokens", _parsed("tokens", "TokenList", items=True),
                               params=query(all=str(include_revoked).lower() if include_revoked else None)))

    @route("POST", "/tokens")
    def create_token(self, name: str, scope: str):
        """A new token -> TokenCreatedView; its `token` is the secret, shown this once."""
        body = validated(_api("tokens", "TokenCreate"), {"name": name, "scope": scope})
        return self._call(Call("POST", "/tokens", _parsed("tokens", "TokenCreatedView"), body=body))

    @route("DELETE", "/tokens/{name}")
    def revoke_token(self, name: str) -> Any:
        return self._call(Call("DELETE", f"/tokens/{name}", _nothing))

    @route("POST", "/events/stream-ticket")
    def stream_ticket(self):
        """A short-lived ticket for GET /events/stream?ticket= (for a browser's EventSource)."""
        return self._call(Call("POST", "/events/stream-ticket", _model(models.StreamTicket)))

    # what the dashboard and Prometheus read --------------------------------
    @route("GET", "/stats/recent")
    def recent_stats(self):
        return self._call(Call("GET", "/stats/recent", _parsed("stats", "RecentView")))

    @route("GET", "/metrics")
    def metrics(self) -> Any:
        """The Prometheus text exposition, as a str."""
        return self._call(Call("GET", "/metrics", str, text=True))

    # the pod orchestrator's routes -----------------------------------------
    @route("POST", "/workflow")
    def compat_submit(self, workflow_id: str, steps: list[dict[str, Any]]):
        """`steps`: [{"id", "command", "dependsOn"?}] -> CompatWorkflowView."""
        body = validated(models.CompatWorkflowIn, {"workflowId": workflow_id, "steps": steps})
        return self._call(Call("POST", "/workflow", _model(models.CompatWorkflowView), body=body))

    @route("GET", "/workflow/{workflowId}")
    def compat_status(self, workflow_id: str):
        return self._call(Call("GET", f"/workflow/{workflow_id}", _model(models.CompatWorkflowView)))

    @route("GET", "/pods")
    def pods(self):
        return self._call(Call("GET", "/pods", _model(models.Pods)))
