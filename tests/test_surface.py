"""The API as a user meets it (issue 29): every documented body form sent over HTTP to a real
`qforge api` (with a real worker), each answer validated against the live /openapi.json; the
errors a newcomer hits in the first hour; and every curl example of the docs run against it."""

from __future__ import annotations

import json
import re
import secrets
import shlex
import socket
import subprocess
from pathlib import Path
from typing import Any, Iterator

import httpx
import psycopg
import pytest
import schemathesis

import qforge
from cluster_procs import start_api
from tests.conftest import _create_database, _drop_database
from pgcluster import free_port
from qforge.db import with_database
from test_worker_support import TEST_TASKS, Processes, wait_for

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- one API for the module


@pytest.fixture(scope="module")
def surface(server_url: str, template_database: str, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A database of this module, a `qforge api` and a `qforge worker` on it."""
    name = f"t_surface_{secrets.token_hex(4)}"
    _create_database(server_url, name, template=template_database)
    folder = tmp_path_factory.mktemp("surface")
    (folder / "tasks").mkdir()
    (folder / "tasks" / "qf_test_tasks.py").write_text(TEST_TASKS)
    url = with_database(server_url, name)
    processes = Processes(url, folder, folder / "tasks")
    try:
        _, base = start_api(processes, timeout=90)  # a loaded machine starts it slowly
        processes.worker("--concurrency", "8", "--name", "surface-worker")
        with httpx.Client(base_url=base, timeout=30) as http:
            wait_for(lambda: http.get("/workers").json()["items"], timeout=90, message="the worker")
            schema = schemathesis.openapi.from_dict(http.get("/openapi.json").json())
            yield {"base": base, "url": url, "http": http, "schema": schema, "procs": processes}
    finally:
        processes.close()
        print(processes.logs())
        _drop_database(server_url, name)


def conform(surface: dict[str, Any], response: httpx.Response, method: str, path: str) -> Any:
    """The response, validated against the operation of the live /openapi.json; its JSON."""
    surface["schema"][path][method].validate_response(response)
    return response.json() if response.content else None


def call(surface: dict[str, Any], method: str, path: str, template: str | None = None, **kwargs) -> Any:
    response = surface["http"].request(method, path, **kwargs)
    assert response.status_code < 500, response.text
    return response, conform(surface, response, method, template or path)


def finished_workflow(surface: dict[str, Any], workflow_id: str, timeout: float = 60) -> dict:
    def done():
        view = surface["http"].get(f"/workflows/{workflow_id}").json()
        return view if view["status"] != "running" else None
    view = wait_for(done, timeout=timeout, message=f"workflow {workflow_id} to finish")
    conform(surface, surface["http"].get(f"/workflows/{workflow_id}"), "GET", "/workflows/{workflow_id}")
    return view


# --------------------------------------------------------------------------- every form comes back

WHEN_FORMS = {
    "equals": {"step": "start", "path": "route", "equals": "b"},
    "not_equals": {"step": "start", "path": "route", "not_equals": "b"},
    "in": {"step": "start", "path": "route", "in": ["a", "b"]},
    "all": {"all": [{"step": "start", "path": "route", "equals": "b"},
                    {"step": "start", "path": "n", "equals": 1}]},
    "any": {"any": [{"step": "start", "path": "route", "equals": "x"},
                    {"step": "start", "path": "n", "equals": 1}]},
    "not": {"not": {"step": "start", "path": "route", "equals": "b"}},
    "otherwise": "otherwise",
}


def test_every_form_of_when_comes_back_as_sent_and_the_workflow_runs(surface):
    steps = [{"step": "start", "task": "echo", "payload": {"route": "b", "n": 1}}]
    steps += [{"step": f"on_{form}", "task": "echo", "depends_on": ["start"], "when": when}
              for form, when in WHEN_FORMS.items()]
    response, created = call(surface, "POST", "/workflows", json={"name": "routes", "steps": steps})
    assert response.status_code == 201, response.text  # was a 500 for "otherwise" (issue 29)
    sent = {step["step"]: step.get("when") for step in steps}
    assert {step["step"]: step["when"] for step in created["steps"]} == sent
    view = finished_workflow(surface, created["id"])
    assert {step["step"]: step["when"] for step in view["steps"]} == sent
    status = {step["step"]: step["status"] for step in view["steps"]}
    assert status == {"start": "succeeded", "on_equals": "succeeded", "on_not_equals": "skipped",
                      "on_in": "succeeded", "on_all": "succeeded", "on_any": "succeeded",
                      "on_not": "skipped", "on_otherwise": "skipped"}, status
    assert view["status"] == "succeeded"


def test_fan_out_sub_workflow_result_and_deadline_come_back_as_sent(surface):
    child = {"name": "child_def", "steps": [{"step": "inner", "task": "add", "payload": {"a": 1, "b": 2}}],
             "result": {"step": "inner"}}
    response, _ = call(surface, "PUT", "/definitions/child_def", "/definitions/{name}", json=child)
    assert response.status_code in (200, 201), response.text
    body = {"name": "everything", "deadline_seconds": 600, "result": {"step": "total"}, "steps": [
        {"step": "list", "task": "echo", "payload": {"files": ["a", "b", "c"]}},
        {"step": "each", "task": "echo", "for_each": {"step": "list", "path": "files"}, "max_parallel": 2},
        {"step": "sub", "type": "workflow", "definition": "child_def", "inputs": {"k": "v"},
         "depends_on": ["each"]},
        {"step": "nap", "type": "sleep", "seconds": 0, "depends_on": ["sub"]},
        {"step": "total", "task": "add", "payload": {"a": 40, "b": 2}, "depends_on": ["nap"]}]}
    response, created = call(surface, "POST", "/workflows", json=body)
    assert response.status_code == 201, response.text
    for view in (created, surface["http"].get(f"/workflows/{created['id']}").json()):
        steps = {step["step"]: step for step in view["steps"]}
        assert steps["each"]["for_each"] == {"step": "list", "path": "files"}
        assert steps["each"]["max_parallel"] == 2
        assert (steps["sub"]["type"], steps["sub"]["definition"], steps["sub"]["inputs"]) == \
            ("workflow", "child_def", {"k": "v"})
        assert steps["nap"]["seconds"] == 0
    wf = surface["http"].get(f"/workflows/{created['id']}").json()
    assert wf["deadline_seconds"] == 600 and wf["deadline_at"] is not None


def test_response_models_take_every_form_of_the_request_models():
    """Share the types: each field a response shows of what was sent has the request's type."""
    import typing

    from qforge.api.models import StepView, WorkflowView
    from qforge.commands.specs import StepSpec, WorkflowSpec

    def alternatives(annotation) -> set:
        args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, type(int | None)) \
            else (annotation,)
        found = set()
        for arg in args:
            found |= alternatives(arg) if typing.get_origin(arg) in (typing.Union, type(int | None)) else {arg}
        return found - {type(None)}

    pairs = [(StepSpec, StepView, {"step", "steps"}), (WorkflowSpec, WorkflowView, {"steps", "result"})]
    for request, response, different in pairs:
        for name, field in request.model_fields.items():
            shown = field.alias or name
            if shown in different or shown not in response.model_fields:
                continue
            wanted, answered = alternatives(field.annotation), alternatives(response.model_fields[shown].annotation)
            assert typing.Any in answered or wanted <= answered, (request.__name__, shown, wanted, answered)


# --------------------------------------------------------------------------- definitions, schedules


def test_put_definition_takes_a_post_workflows_body_with_its_name(surface):
    body = {"name": "nightly_x", "tags": {"team": "ops"},
            "steps": [{"step": "a", "task": "echo"}, {"step": "b", "task": "echo", "when": "otherwise",
                                                      "depends_on": ["a"]}]}
    response, stored = call(surface, "PUT", "/definitions/nightly_x", "/definitions/{name}", json=body)
    assert response.status_code == 201, response.text
    assert "name" not in stored["document"]
    response, refused = call(surface, "PUT", "/definitions/other_name", "/definitions/{name}", json=body)
    assert response.status_code == 422
    assert "nightly_x" in refused["message"] and "other_name" in refused["message"]
    assert refused["details"][0]["field"] == "name"
    assert surface["http"].get("/definitions/other_name").status_code == 404  # nothing stored


def test_a_schedule_is_refused_at_creation_for_an_unknown_definition_or_a_bad_cron(surface):
    response, refused = call(surface, "POST", "/schedules", json={
        "name": "ghost", "cron": "0 * * * *", "definition": "no_such_definition"})
    assert response.status_code == 422
    assert refused["details"][0]["field"] == "definition" and "no_such_definition" in refused["message"]
    for field, body in (("cron", {"cron": "* * *"}), ("timezone", {"cron": "0 * * * *", "timezone": "Mars/Base"})):
        response, refused = call(surface, "POST", "/schedules", json={"name": "bad", "job": {"task": "echo"}, **body})
        assert response.status_code == 422
        assert [d["field"] for d in refused["details"]] == [field]
        assert "Value error" not in refused["message"] and "Value error" not in refused["details"][0]["message"]
    response, created = call(surface, "POST", "/schedules", json={
        "name": "hourly", "cron": "0 * * * *", "timezone": "Europe/Paris", "job": {"task": "echo"}})
    assert response.status_code == 201, response.text
    assert surface["http"].get("/schedules/ghost").status_code == 404


def test_a_schedule_refused_at_every_tick_is_logged_once_a_minute(conn, caplog, monkeypatch):
    import logging
    from datetime import datetime, timedelta, timezone

    from qforge.commands import schedules
    from qforge.commands.errors import NotFound

    start = datetime(2030, 1, 1, tzinfo=timezone.utc)
    schedules.create_schedule(conn, schedules.ScheduleSpec(name="doomed", cron="* * * * * *",
                                                           job={"task": "echo"}), now=start)

    def refuse(*_args, **_kwargs):  # what a definition gone since the schedule was made raises
        raise NotFound("definition gone_def not found")
    monkeypatch.setattr(schedules, "_start", refuse)
    with caplog.at_level(logging.WARNING, logger="qforge.schedules"):
        for tick in range(40):  # ten seconds of the leader's ticks, four a second
            schedules.fire_due(conn, actor="test", grace_seconds=60, now=start + timedelta(seconds=1 + tick / 4))
    said = [r for r in caplog.records if "doomed cannot fire" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


# --------------------------------------------------------------------------- errors


def _raw_get(sock: socket.socket, path: str) -> tuple[int, bytes]:
    """One HTTP/1.1 request on an open keep-alive socket: (status, body)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        body += chunk
    return int(head.split()[1]), body[:length]


def test_an_unhandled_error_is_a_json_500_and_the_connection_stays_usable(surface):
    # Something no handler knows: a table gone under a running API (only the API reads it).
    with psycopg.connect(surface["url"], autocommit=True) as conn:
        conn.execute("ALTER TABLE schedules RENAME TO schedules_away")
    try:
        host, port = surface["base"].removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            status, body = _raw_get(sock, "/schedules")
            assert status == 500
            assert json.loads(body) == {"error": "internal", "details": [],
                                        "message": "an unexpected error occurred; it has been logged"}
            status, _ = _raw_get(sock, "/healthz")  # the same connection still answers
            assert status == 200
    finally:
        with psycopg.connect(surface["url"], autocommit=True) as conn:
            conn.execute("ALTER TABLE schedules_away RENAME TO schedules")


def test_a_wrong_method_is_405_and_a_body_that_is_not_json_is_415(surface):
    http = surface["http"]
    job = http.post("/jobs", json={"task": "echo"}).json()
    for method, path in (("GET", f"/jobs/{job['id']}/cancel"), ("PUT", "/jobs"), ("DELETE", "/workflows")):
        response = http.request(method, path)
        assert response.status_code == 405, (method, path, response.text)
        assert response.json()["error"] == "method_not_allowed" and method in response.json()["message"]
        assert response.headers["allow"]
    response = http.post("/jobs", content='{"task": "echo"}', headers={"content-type": "text/plain"})
    assert response.status_code == 415
    assert "application/json" in response.json()["message"]
    response = http.post("/jobs", content='{"task": "echo"}')  # no content-type at all
    assert response.status_code == 415
    assert http.post(f"/jobs/{job['id']}/cancel").status_code in (200, 409)  # an empty body is fine


def test_a_chain_of_1000_steps_is_taken_and_1001_is_refused_naming_the_limit(surface):
    from qforge.commands.specs import MAX_STEPS

    def chain(n: int, cycle: bool = False) -> dict:
        return {"name": "chain", "steps": [
            {"step": f"s{i}", "task": "add", "payload": {"a": i, "b": 1},
             **({"depends_on": [f"s{(i - 1) % n}"]} if i or cycle else {})} for i in range(n)]}
    response, created = call(surface, "POST", "/workflows", json=chain(MAX_STEPS))
    assert response.status_code == 201, response.text  # was a 500: find_cycle recursed
    assert len(created["steps"]) == MAX_STEPS

    def three_done():
        steps = surface["http"].get(f"/workflows/{created['id']}").json()["steps"]
        return [s["status"] for s in steps[:3]] == ["succeeded"] * 3
    wait_for(three_done, timeout=60, message="the chain's first steps to run")
    surface["http"].post(f"/workflows/{created['id']}/cancel")

    response, refused = call(surface, "POST", "/workflows", json=chain(MAX_STEPS, cycle=True))
    assert response.status_code == 422 and "cycle" in refused["message"]
    response, refused = call(surface, "POST", "/workflows", json=chain(MAX_STEPS + 1))
    assert response.status_code == 422 and str(MAX_STEPS) in refused["message"]


def test_an_output_nested_past_the_limit_fails_its_step_and_every_read_still_answers(surface):
    from qforge.commands.specs import MAX_DEPTH

    deep: Any = "bottom"
    for _ in range(MAX_DEPTH - 4):
        deep = {"d": deep}
    # echo's output holds its inputs, so each step of the chain nests two levels more
    steps = [{"step": f"e{i}", "task": "echo", "payload": {"v": deep} if i == 0 else {}, "max_retries": 0,
              **({"depends_on": [f"e{i - 1}"]} if i else {})} for i in range(6)]
    created = surface["http"].post("/workflows", json={"name": "deepening", "steps": steps}).json()
    view = finished_workflow(surface, created["id"])
    failed = [s for s in view["steps"] if s["status"] == "dead"]
    assert failed and f"nested more than {MAX_DEPTH} levels" in failed[0]["error"], view["steps"]
    for path in ("/jobs?status=dead", f"/workflows/{created['id']}", f"/workflows/{created['id']}/events"):
        assert surface["http"].get(path).status_code == 200, path


# --------------------------------------------------------------------------- who takes due jobs


def test_due_jobs_no_live_worker_takes_are_named_on_queues_and_the_job(surface):
    http = surface["http"]
    stray = http.post("/jobs", json={"task": "echo", "queue": "nobody_serves"}).json()
    _, queues = call(surface, "GET", "/queues")
    entry = next(q for q in queues["items"] if q["queue"] == "nobody_serves")
    assert entry["workers"] == 0
    assert any("no live worker serves it" in w and "--queues nobody_serves" in w for w in entry["warnings"])
    _, job = call(surface, "GET", f"/jobs/{stray['id']}", "/jobs/{job_id}")
    assert "no live worker serves queue 'nobody_serves'" in job["waiting_for_worker"]

    # A live worker of the queue that does not register the task (as a worker's heartbeat writes it).
    with psycopg.connect(surface["url"], autocommit=True) as conn:
        conn.execute("INSERT INTO workers (name, host, pid, queues, concurrency, started_at, last_seen, tasks)"
                     " VALUES ('echo-only', 'h', 1, '{picky}', 1, now(), now() + interval '1 hour', '{echo}')")
    mystery = http.post("/jobs", json={"task": "mystery.task", "queue": "picky"}).json()
    entry = next(q for q in http.get("/queues").json()["items"] if q["queue"] == "picky")
    assert any("registers task 'mystery.task'" in w for w in entry["warnings"]), entry
    assert "registers task 'mystery.task'" in http.get(f"/jobs/{mystery['id']}").json()["waiting_for_worker"]


def test_an_unknown_task_dies_at_once_naming_the_tasks_the_worker_knows(surface):
    http = surface["http"]
    job = http.post("/jobs", json={"task": "send_email", "max_retries": 3}).json()
    dead = wait_for(lambda: (j := http.get(f"/jobs/{job['id']}").json())["status"] == "dead" and j,
                    timeout=30, message="the unknown task to die")
    assert dead["attempts"] == 1  # not retried three times
    assert "unknown task 'send_email'" in dead["last_error"]
    assert "echo" in dead["last_error"] and "--tasks" in dead["last_error"]
    events = [e["type"] for e in http.get(f"/jobs/{job['id']}/events").json()["events"]]
    assert events[-2:] == ["Failed", "DeadLettered"] and "Retried" not in events


# --------------------------------------------------------------------------- the client


def test_the_client_replays_from_zero_gives_models_and_names_a_wrong_url(surface):
    from qforge.api.models import JobExecution

    with qforge.Client(surface["base"]) as client:
        job = client.enqueue("echo", {"x": 1}, tags={"client": "check"})
        first = next(iter(client.events(after=0)))  # was a TypeError inside httpx
        assert first.position >= 1
        found = client.executions({"client": "check"})
        assert [type(item) for item in found.items] == [JobExecution]
        assert str(found.items[0].id) == str(job.id)
    port = free_port()
    with qforge.Client(f"http://127.0.0.1:{port}") as wrong:
        with pytest.raises(qforge.Unreachable, match=f"127.0.0.1:{port}/jobs"):
            wrong.get_job(job.id)


# --------------------------------------------------------------------------- the docs' curl examples


def curl_examples() -> list[tuple[str, str]]:
    """(file, command) for every curl command in README.md and docs/**/*.md code blocks, with
    its continuation lines and quoted newlines joined."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        blocks, inside = [], None
        for line in path.read_text().splitlines():
            if line.startswith("```"):
                if inside is None:
                    inside = []
                else:
                    blocks.append(inside)
                    inside = None
            elif inside is not None:
                inside.append(line)
        for lines in blocks:
            lines = [re.sub(r"\s{2,}#.*$", "", line) for line in lines]  # comments after a command
            index = 0
            while index < len(lines):
                line = lines[index]
                if line.lstrip().startswith("curl "):
                    command = line
                    while command.endswith("\\") or _open_quote(command):
                        index += 1
                        command = (command[:-1] if command.endswith("\\") else command + "\n") + lines[index]
                    found.append((path.name, command.strip()))
                index += 1
    return found


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text)
        return False
    except ValueError:
        return True


def test_every_curl_example_of_the_docs_runs_against_a_live_api(surface):
    http = surface["http"]
    examples = curl_examples()
    assert len(examples) >= 8, examples
    job = http.post("/jobs", json={"task": "echo", "tags": {"team": "ops"}}).json()
    cancelled = http.post("/workflows", json={"name": "to_resume", "steps": [
        {"step": "w", "type": "wait_for_trigger"}]}).json()
    http.post(f"/workflows/{cancelled['id']}/cancel")
    # $ID in docs/workflows-as-code.md: a workflow whose `approve` step waits for a trigger
    waiting = http.post("/workflows", json={"name": "approval", "steps": [
        {"step": "approve", "type": "wait_for_trigger"}]}).json()
    host = surface["base"].removeprefix("http://")
    for name, command in examples:
        command = command.replace("localhost:8090", host).replace("127.0.0.1:8090", host)
        command = (command.replace("<id>", job["id"]).replace("$WF", cancelled["id"])
                   .replace("$ID", waiting["id"]))
        streaming = " -N " in f" {command} "
        shell = f"{command} --max-time {3 if streaming else 30} -s -o /dev/stderr -w '%{{http_code}}'"
        ran = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
        assert ran.returncode == (28 if streaming else 0) or ran.returncode == 0, (name, command, ran.stderr)
        assert ran.stdout.strip().isdigit() and int(ran.stdout) < 400, (name, command, ran.stdout, ran.stderr)


# --------------------------------------------------------------------------- qforge dev, first hour


def readme_snippet() -> str:
    """The README's Python lines that enqueue in the caller's transaction, with the block's
    imports (its client lines talk to port 8090, which this test's qforge dev does not use)."""
    text = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "qforge.enqueue(conn" in b)
    imports = "\n".join(line for line in block.splitlines() if line.startswith("import "))
    return imports + "\n" + block[block.index("# DATABASE_URL"):]


def test_qforge_dev_names_its_database_and_the_readme_snippet_runs_against_it(scratch_dir: Path):
    port = free_port()
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("QFORGE_DATABASE_URL", "QFORGE_API_TOKEN", "QFORGE_DATA_DIR")}
    env.update({"QFORGE_STALE_SECONDS": "2", "QFORGE_HEARTBEAT_SECONDS": "0.5",
                "QFORGE_MONITOR_TICK_SECONDS": "0.5"})
    log_path = scratch_dir / "dev.log"
    qforge_bin = [__import__("sys").executable, "-m", "qforge.cli", "dev"]
    with open(log_path, "wb") as log:
        dev = subprocess.Popen([*qforge_bin, "--port", str(port), "--queues", "default,extra"],
                               cwd=scratch_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        ready = wait_for(lambda: re.search(r"ready: .* database (\S+) ", log_path.read_text())
                         or dev.poll() is not None, timeout=90, message="qforge dev's ready line")
        assert dev.poll() is None, log_path.read_text()
        printed = subprocess.run([*qforge_bin, "--print-database-url"], cwd=scratch_dir, env=env,
                                 capture_output=True, text=True, timeout=60)
        assert printed.returncode == 0, printed.stderr
        url = printed.stdout.strip()
        assert url == ready.group(1)

        # The snippet as written, with DATABASE_URL as the README says to get it.
        ran = subprocess.run([__import__("sys").executable, "-c", readme_snippet()],
                             cwd=scratch_dir, env={**env, "DATABASE_URL": url},
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        with qforge.Client(base) as client:
            [job] = client.list_jobs(task="echo").items
            assert client.wait(job.id, timeout=30) == {"order": 1}
            workers = {w.name: w.queues for w in client.workers()}
            assert workers == {"pool-1": ["default", "extra"], "pool-2": ["default", "extra"]}
            client.enqueue("echo", queue="extra")  # served
            client.enqueue("echo", queue="unserved_q")  # not: the monitor says so, once
        wait_for(lambda: "queue 'unserved_q' has 1 due job and no live worker serves it" in log_path.read_text(),
                 timeout=30, message="the monitor to name the unserved queue")
        assert "queue 'extra'" not in log_path.read_text()
    finally:
        dev.terminate()
        try:
            dev.wait(timeout=60)
        except subprocess.TimeoutExpired:
            dev.kill()
    assert "no live worker serves it" in log_path.read_text()
