"""Issue 36: the dashboard tells the truth. One test per page that said something that was not so
(each failed before its fix), with a screenshot of the page after it saved under docs/img/."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from urllib.parse import urlparse

import time
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect

from browser_stack import CHROMIUM, REPO, SCREENSHOTS, VIEWPORT, Dashboard, wait_for
from qforge.commands import schedules
from qforge.db import connect
from qforge.events import store
from qforge.events import types as ev
from qforge.events.ids import new_ids
from qforge.events.types import NewEvent

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")

# QFORGE_DOCS_SCREENSHOTS=1 writes the screenshots into docs/img (committed); else they go to
# test-output/screenshots (ignored), so a plain test run leaves the tree as it was.
IMAGES = REPO / "docs" / "img" if os.environ.get("QFORGE_DOCS_SCREENSHOTS") == "1" else SCREENSHOTS


def shot(page: Page, name: str, full_page: bool = False) -> Path:
    """truth-<name>.png: the page after its fix, named in the closing note."""
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"truth-{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def offline(page: Page) -> list[str]:
    """Abort every request that leaves 127.0.0.1, as if there were no network; the aborted URLs."""
    refused: list[str] = []

    def handle(route: Route) -> None:
        if urlparse(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    page.route("**/*", handle)
    return refused


def test_docs_work_offline_under_the_dashboards_policy(dashboard: Dashboard, api: httpx.Client) -> None:
    page = dashboard.page
    refused = offline(page)
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text)
            if "Content Security Policy" in message.text else None)
    page.goto(f"{dashboard.stack.url}/docs")
    expect(page.locator(".opblock").first).to_be_visible(timeout=15_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert any(p.replace("\u200b", "") == "/jobs" for p in paths), paths
    assert len(paths) >= 20
    page.locator(".opblock-summary").first.click()  # an operation opens: its parameters, its schemas
    expect(page.locator(".opblock-body").first).to_be_visible()
    page.get_by_text("Schemas").first.scroll_into_view_if_needed()
    assert refused == [], f"/docs reached beyond this machine: {refused}"
    assert violations == []
    policy = api.get("/docs").headers["content-security-policy"]
    assert "script-src 'self';" in policy and "cdn" not in policy
    shot(page, "docs-offline")


# --------------------------------------------------------------------------- schedules


def broken_schedule(db_url: str, name: str) -> None:
    """A schedule of a definition that does not exist, as a database from before creation
    refused those holds (appended as its events, the way create_schedule does)."""
    schedule = schedules.ScheduleSpec.model_validate(
        {"name": name, "cron": "0 * * * *", "timezone": "Europe/Paris", "definition": "no-such-definition"})
    with connect(db_url) as conn, conn.transaction():
        [stream] = new_ids(1)
        store.append(conn, [NewEvent(stream_id=stream, version=1, data=ev.ScheduleCreated(
            name=name, spec=schedule.stored(), next_at=datetime.now(timezone.utc) - timedelta(minutes=5)))],
            actor="test")


def test_schedules_show_names_as_stored_times_in_their_zones_and_why_one_cannot_fire(
        browser: Browser, stack, stack_db_url: str, api: httpx.Client) -> None:
    created = api.post("/schedules", json={"name": "heartbeat-echo", "cron": "0 * * * *",
                                           "timezone": "Europe/Paris", "job": {"task": "echo"}})
    assert created.status_code == 201, created.text
    broken_schedule(stack_db_url, "orphan-report")
    listed = {item["name"]: item for item in api.get("/schedules").json()["items"]}
    assert listed["heartbeat-echo"]["error"] is None
    assert "no-such-definition does not exist" in listed["orphan-report"]["error"]
    # A reader in New York, a cron in Paris.
    context = browser.new_context(viewport=VIEWPORT, timezone_id="America/New_York", locale="en-GB")
    try:
        page = context.new_page()
        page.goto(f"{stack.url}/#/schedules")
        row = page.locator("tr[data-schedule='heartbeat-echo']")
        expect(row).to_be_visible()
        assert row.locator("th").inner_text().splitlines()[0] == "heartbeat-echo"  # as stored: DELETE finds it
        next_fire = row.locator("td.next-fire").inner_text()
        assert re.search(r"\bCET\b|GMT\+1", next_fire), next_fire  # the schedule's own zone
        assert re.search(r"your time .*(EST|GMT-5)", next_fire), next_fire  # and the reader's
        orphan = page.locator("tr[data-schedule='orphan-report']")
        expect(orphan.locator(".schedule-error")).to_contain_text("definition no-such-definition does not exist")
        shot(page, "schedules")
    finally:
        context.close()
        api.delete("/schedules/heartbeat-echo")
        api.delete("/schedules/orphan-report")


# --------------------------------------------------------------------------- overview


def test_overview_breaks_lines_at_gaps_and_paints_states_alike(dashboard: Dashboard, api: httpx.Client) -> None:
    assert api.get("/stats/recent").status_code == 200  # a depth sample: nothing pending in emails
    # Nobody looks at the charts for a while (no samples), then 30 jobs arrive at once.
    asked = time.monotonic()
    wait_for(lambda: time.monotonic() - asked > 11.5, timeout=20, message="a gap in the depth samples")
    for _ in range(30):  # no worker serves emails: they stay pending
        assert api.post("/jobs", json={"task": "echo", "queue": "emails"}).status_code == 201
    page = dashboard.open("/overview")
    depth = page.locator("#chart-depth path.series[data-series='emails']")
    expect(depth).to_have_count(1)
    for subpath in depth.get_attribute("d").split("M")[1:]:
        ys = [float(point.split(",")[1]) for point in subpath.replace("L", " ").split()]
        assert not (max(ys) >= 160 and min(ys) < 60), f"a line joins 0 and 30 across the gap: M{subpath}"
    colours = page.evaluate("async () => (await import('/js/states.js')).COLOURS")
    state_colours = {colour["c"].lower() for colour in colours.values()}
    for outcome in ("succeeded", "failed", "dead", "cancelled"):
        stroke = page.locator(f"#chart-throughput path.series[data-series='{outcome}']").get_attribute("stroke")
        assert stroke.lower() == colours[outcome]["c"].lower(), outcome
    assert len({colours[s]["c"] for s in ("succeeded", "failed", "dead", "cancelled")}) == 4
    for series in page.locator("#chart-depth path.series, #chart-latency path.series").all():
        assert series.get_attribute("stroke").lower() not in state_colours, series.get_attribute("data-series")
    shot(page, "overview")
    dashboard.assert_clean()


# --------------------------------------------------------------------------- timeline


def submit(api: httpx.Client, **workflow: Any) -> str:
    response = api.post("/workflows", json=workflow)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def finished(api: httpx.Client, workflow_id: str, status: str = "succeeded") -> dict:
    return wait_for(lambda: (view := api.get(f"/workflows/{workflow_id}").json())["status"] == status and view,
                    timeout=20, message=f"workflow {workflow_id} to end {status}")


def test_timeline_names_every_stream_by_kind_and_name(dashboard: Dashboard, api: httpx.Client) -> None:
    # A workflow submitted before the page opened: its name never passes by on the stream.
    earlier = submit(api, name="thumbnails", steps=[{"step": "gate", "type": "wait_for_trigger"},
                                                     {"step": "resize", "task": "echo", "depends_on": ["gate"]}])
    page = dashboard.open("/timeline")
    assert api.post("/schedules", json={"name": "tick-echo", "cron": "*/1 * * * * *",
                                        "job": {"task": "echo"}}).status_code == 201
    try:
        assert api.post(f"/workflows/{earlier}/steps/gate/trigger", json={"payload": {}}).status_code == 200
        finished(api, earlier)
        fired = page.locator("tr.ev[data-type='ScheduleFired']").first
        expect(fired).to_be_visible(timeout=15_000)
    finally:
        api.delete("/schedules/tick-echo")
    cell = fired.locator("td.exec")
    expect(cell).to_contain_text("schedule tick-echo")
    assert cell.locator("a").get_attribute("href") == "#/schedules"
    summary = fired.locator("td.summary").inner_text()
    assert "{" not in summary and "started job" in summary, summary
    resize = page.locator("tr.ev[data-type='Claimed']", has_text="resize").first
    expect(resize.locator("td.exec")).to_contain_text("in thumbnails")  # the name, looked up
    # One look at every row at once (rows keep arriving while the test reads them).
    rows = page.evaluate("""() => [...document.querySelectorAll('tr.ev')].map((row) => ({
      kind: row.dataset.kind, stream: row.dataset.stream,
      said: row.querySelector('td.exec .kind').textContent,
      link: row.querySelector('td.exec a')?.getAttribute('href') ?? ''}))""")
    for row in rows:
        assert row["said"] == row["kind"], row
        if row["kind"] in ("job", "workflow"):
            assert row["link"].startswith(f"#/{row['kind']}s/{row['stream']}"), row
    shot(page, "timeline")
    dashboard.assert_clean()


# --------------------------------------------------------------------------- workflows


def test_workflows_list_counts_steps_as_the_workflow_page_does(dashboard: Dashboard, api: httpx.Client) -> None:
    workflow_id = submit(api, name="fan-counts", steps=[
        {"step": "list", "task": "echo", "payload": {"items": ["a", "b", "c"]}},
        {"step": "each", "task": "echo", "for_each": {"step": "list", "path": "items"}}])
    finished(api, workflow_id)
    [summary] = api.get("/workflows", params={"name": "fan-counts"}).json()["items"]
    assert summary["step_counts"] == {"succeeded": 2} and summary["element_counts"] == {"succeeded": 3}
    page = dashboard.open("/workflows?name=fan-counts")
    row = page.locator(f"#workflows-rows tr[data-id='{workflow_id}']")
    expect(row).to_contain_text("elements: 3 succeeded")
    counts = row.locator(".counts > .count").all_inner_texts()
    assert [c.split() for c in counts] == [["succeeded", "2"]], counts
    shot(page, "workflows-list")
    row.locator("a.idlink").first.click()
    expect(page.locator(".detail-header .counts")).to_have_text("2 succeeded")
    dashboard.assert_clean()


def test_a_workflow_that_succeeded_with_a_handled_death_says_why(dashboard: Dashboard, api: httpx.Client) -> None:
    workflow_id = submit(api, name="checkout", steps=[
        {"step": "charge", "task": "fail", "max_retries": 0, "on_failure": "refund"},
        {"step": "refund", "task": "echo"},
        {"step": "ship", "task": "echo", "depends_on": ["charge"]}])
    view = finished(api, workflow_id)
    schema = api.get("/openapi.json").json()["components"]["schemas"]["WorkflowView"]
    assert "outcome" in schema["properties"]
    assert "charge died; its handler refund succeeded" in view["outcome"], view["outcome"]
    assert "ship was skipped because charge died" in view["outcome"], view["outcome"]
    page = dashboard.open(f"/workflows/{workflow_id}")
    expect(page.locator("#workflow-status")).to_contain_text("succeeded")
    expect(page.locator("#workflow-outcome")).to_contain_text("charge died; its handler refund succeeded")
    expect(page.locator("#workflow-outcome")).to_contain_text("does not fail the workflow")
    shot(page, "workflow-handled-death")
    dashboard.assert_clean()


# --------------------------------------------------------------------------- jobs


@pytest.fixture(scope="module")
def handed_back_job(stack) -> Iterator[str]:
    """A job a stopping worker handed back (Released), now running again on another worker,
    heartbeating every 0.5 s; cancelled at the end."""
    with stack.client() as api:
        job = api.post("/jobs", json={"task": "slow", "queue": "handback", "max_retries": 3,
                                      "payload": {"seconds": 60}}).json()
        first = stack.spawn("worker", "--queues", "handback", "--name", "stopping-worker",
                            env={"QFORGE_SHUTDOWN_GRACE_SECONDS": "0"})
        wait_for(lambda: api.get(f"/jobs/{job['id']}").json()["status"] == "running", timeout=30,
                 message="the first worker to take the job")
        first.stop()
        wait_for(lambda: any(e["type"] == "Released" for e in api.get(f"/jobs/{job['id']}/events").json()["events"]),
                 timeout=30, message="the hand-back")
        second = stack.spawn("worker", "--queues", "handback", "--name", "second-worker")
        wait_for(lambda: (j := api.get(f"/jobs/{job['id']}").json())["status"] == "running" and j["attempts"] == 2,
                 timeout=30, message="the second worker to take it again")
        wait_for(lambda: sum(e["type"] == "Heartbeat" for e in api.get(f"/jobs/{job['id']}/events").json()["events"]) >= 3,
                 timeout=30, message="a few heartbeats")
        try:
            yield job["id"]
        finally:
            api.post(f"/jobs/{job['id']}/cancel")
            second.stop()


def test_a_hand_back_is_shown_apart_from_the_attempts_that_count(
        dashboard: Dashboard, api: httpx.Client, handed_back_job: str) -> None:
    job = api.get(f"/jobs/{handed_back_job}").json()
    assert job["attempts"] == 2 and job["counted_attempts"] == 1
    assert "counted_attempts" in api.get("/openapi.json").json()["components"]["schemas"]["JobView"]["properties"]
    page = dashboard.open(f"/jobs/{handed_back_job}")
    expect(page.locator("#job-attempts")).to_have_text("1 of 4, handed back once")
    shot(page, "job-handed-back")
    dashboard.assert_clean()


def test_job_pages_hide_heartbeats_behind_the_same_toggle_as_workflow_pages(
        dashboard: Dashboard, api: httpx.Client, handed_back_job: str) -> None:
    page = dashboard.open(f"/jobs/{handed_back_job}")
    history = page.locator("ol.history")
    expect(history.locator("li[data-type='Claimed']").first).to_be_visible()
    expect(history.locator("li[data-type='Heartbeat']")).to_have_count(0)
    page.locator("input.heartbeat-toggle").check()
    expect(history.locator("li[data-type='Heartbeat']").first).to_be_visible()
    page.locator("input.heartbeat-toggle").uncheck()
    expect(history.locator("li[data-type='Heartbeat']")).to_have_count(0)
    # The workflow page has the very same toggle.
    workflow_id = submit(api, name="toggle", steps=[{"step": "only", "task": "echo"}])
    finished(api, workflow_id)
    dashboard.open(f"/workflows/{workflow_id}")
    expect(page.locator("input.heartbeat-toggle")).to_have_count(1)
    dashboard.open(f"/jobs/{handed_back_job}")
    expect(page.locator("ol.history li[data-type='Claimed']").first).to_be_visible()
    shot(page, "job-heartbeats-hidden")
    dashboard.assert_clean()


# --------------------------------------------------------------------------- search


def test_tag_search_lists_workflows_first_with_their_steps_grouped(dashboard: Dashboard, api: httpx.Client) -> None:
    ids = [submit(api, name=f"grouped-{n}", tags={"batch": "truth-36"},
                  steps=[{"step": "a", "task": "echo"}, {"step": "b", "task": "echo", "depends_on": ["a"]},
                         {"step": "c", "task": "echo", "depends_on": ["b"]}]) for n in range(3)]
    for workflow_id in ids:
        finished(api, workflow_id)
    lone = api.post("/jobs", json={"task": "echo", "tags": {"batch": "truth-36"}}).json()["id"]
    page = dashboard.open("/search?tag=batch:truth-36")
    rows = page.locator("#search-results tr.result")
    expect(rows).to_have_count(3 + 9 + 1)
    visible = page.locator("#search-results tr.result:visible")
    expect(visible).to_have_count(4)  # three workflows, their steps collapsed, then the lone job
    kinds = [row.get_attribute("data-kind") for row in visible.all()]
    assert kinds == ["workflow", "workflow", "workflow", "job"], kinds
    assert visible.nth(3).get_attribute("data-id") == lone
    first = visible.first
    first.locator("button.steps-toggle").click()
    steps = page.locator(f"#search-results tr.result[data-parent='{first.get_attribute('data-id')}']")
    expect(steps).to_have_count(3)
    for step in steps.all():
        expect(step).to_be_visible()
    shot(page, "search-grouped")
    dashboard.assert_clean()


def test_the_search_placeholder_shows_its_underscore(dashboard: Dashboard) -> None:
    page = dashboard.open("/search")
    box = page.locator("#tag-search")
    assert box.get_attribute("placeholder").startswith("order_id:")
    # A twin of the box whose placeholder has a space where the underscore is: if the two
    # look the same, the underscore is not drawn (it read as "order id").
    page.evaluate("""() => {
      const input = document.getElementById('tag-search');
      input.blur();
      for (const box of [input]) { box.style.flex = 'none'; box.style.width = '320px'; }
      const twin = input.cloneNode();
      twin.id = 'tag-search-twin';
      twin.placeholder = input.placeholder.replace('_', ' ');
      twin.style.flex = 'none';
      twin.style.width = '320px';
      input.after(twin);
    }""")
    twin = page.locator("#tag-search-twin")
    assert box.bounding_box()["width"] == twin.bounding_box()["width"]
    contrast = page.evaluate("""async ([a, b]) => {
      const pixels = async (png) => {
        const img = new Image();
        img.src = `data:image/png;base64,${png}`;
        await img.decode();
        const canvas = document.createElement('canvas');
        canvas.width = img.width; canvas.height = img.height;
        const context = canvas.getContext('2d');
        context.drawImage(img, 0, 0);
        return context.getImageData(0, 0, img.width, img.height).data;
      };
      const [one, two] = [await pixels(a), await pixels(b)];
      let most = 0;
      for (let i = 0; i < one.length; i += 4) most = Math.max(most, Math.abs(one[i] - two[i]));
      return most;
    }""", [base64.b64encode(box.screenshot()).decode(), base64.b64encode(twin.screenshot()).decode()])
    # Drawn, the underscore darkens some pixel by far more than a faint trace would.
    assert contrast >= 40, f"the placeholder's underscore is hardly drawn (at most {contrast}/255 darker)"
    page.evaluate("""() => { document.getElementById('tag-search-twin').remove();
                            document.getElementById('tag-search').removeAttribute('style'); }""")
    shot(page, "search-placeholder")


# --------------------------------------------------------------------------- lists and crumbs


def test_crumbs_follow_the_way_in_and_the_jobs_list_names_workflows(dashboard: Dashboard, api: httpx.Client) -> None:
    workflow_id = submit(api, name="crumb-trail", tags={"trail": "crumbs-36"},
                         steps=[{"step": "first", "task": "echo"}])
    view = finished(api, workflow_id)
    job_id = view["steps"][0]["job_id"]
    page = dashboard.open("/jobs?tag=trail:crumbs-36")
    row = page.locator(f"#jobs-rows tr[data-id='{job_id}']")
    expect(row.locator("a[data-workflow-name]")).to_have_text("crumb-trail")  # the name, not "workflow"
    row.locator("a.idlink").first.click()
    expect(page.locator("nav.crumbs")).to_have_text("Jobs / job")
    page.locator("nav.crumbs a").first.click()
    expect(page).to_have_url(re.compile(r"#/jobs\?tag=trail"))  # back to the list as it was filtered
    page.goto(f"{dashboard.stack.url}/#/workflows?name=crumb-trail")
    page.locator(f"#workflows-rows tr[data-id='{workflow_id}'] a.idlink").click()
    expect(page.locator("nav.crumbs")).to_have_text("Workflows / workflow")
    page.locator("#dag .node[data-step='first']").click()
    page.locator("#step-panel a.idlink").first.click()
    expect(page.locator("nav.crumbs")).to_have_text("Workflows / crumb-trail / job")
    page.goto(f"{dashboard.stack.url}/#/search?tag=trail:crumbs-36")
    page.locator(f"#search-results tr[data-id='{workflow_id}'] a.idlink").first.click()
    expect(page.locator("nav.crumbs")).to_have_text("Search / workflow")
    # Dates on one line in the workflows list.
    page.goto(f"{dashboard.stack.url}/#/workflows")
    expect(page.locator("#workflows-rows time").first).to_be_visible()
    heights = page.evaluate("""() => [...document.querySelectorAll('#workflows-rows time')].map(
      (t) => [t.getBoundingClientRect().height, parseFloat(getComputedStyle(t).lineHeight)])""")
    assert heights and all(height < 1.5 * line for height, line in heights), heights
    shot(page, "workflows-dates")
    page.goto(f"{dashboard.stack.url}/#/jobs?tag=trail:crumbs-36")
    expect(page.locator("a[data-workflow-name]").first).to_have_text("crumb-trail")
    shot(page, "jobs-workflow-names")
    dashboard.assert_clean()


# --------------------------------------------------------------------------- the New forms


def test_new_forms_list_step_types_and_built_in_tasks_and_say_which_characters_are_allowed(
        dashboard: Dashboard, api: httpx.Client) -> None:
    from qforge.workflows.dag import STEP_TYPES
    from qforge.workers.tasks import RESERVED_TASK_NAMES, registered_task_names

    page = dashboard.open("/new?form=workflow")
    help_text = page.locator("#workflow-help").inner_text()
    for type_name in (*STEP_TYPES, "for_each"):
        assert re.search(rf"\b{type_name}\b", help_text), type_name
    assert {"task", "wait_for_trigger", "sleep", "workflow"} <= set(STEP_TYPES)
    shot(page, "new-workflow-help")
    page = dashboard.open("/new?form=job")
    hint = page.locator("#task-hint").inner_text()
    # qforge.workflow is reserved for code workflows' own runs: nobody enqueues it by hand
    for task_name in {*registered_task_names(), *RESERVED_TASK_NAMES} - {"qforge.workflow"}:
        assert re.search(rf"\b{task_name}\b", hint), task_name
    page.fill("input[name=queue]", "my queue")
    page.click("#form-job button[type=submit]")
    error = page.locator(".field-error[data-for='queue']")
    expect(error).to_contain_text("letter")
    assert "^[" not in error.inner_text() and "_ . : -" in error.inner_text()
    body = api.post("/jobs", json={"task": "echo", "queue": "my queue"}).json()
    assert body["details"][0]["field"] == "queue" and "[A-Za-z" not in body["message"], body
    shot(page, "new-job-hint")
    # The browser logs the refused POST itself; nothing else may be on the console.
    dashboard.console_errors = [e for e in dashboard.console_errors if "status of 422" not in e]
    dashboard.assert_clean()
