"""The Overview charts, the Jobs and Workflows lists and the "New" forms, in a real browser."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from playwright.sync_api import expect

from browser_stack import CHROMIUM, Dashboard, wait_for
from test_dashboard import enqueue, submit

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")


def assert_clean_but_the_refusals(dashboard: Dashboard) -> None:
    """Chromium logs every 4xx answer on the console; the 422s these tests provoke are expected."""
    dashboard.console_errors[:] = [e for e in dashboard.console_errors if "status of 422" not in e]
    dashboard.assert_clean()


def test_overview_charts_show_the_last_minutes(dashboard: Dashboard, api: httpx.Client):
    batch = uuid.uuid4().hex[:8]
    ids = [enqueue(api, task="add", payload={"a": n, "b": 1}, tags={"batch": batch}) for n in range(6)]
    wait_for(lambda: all(api.get(f"/jobs/{i}").json()["status"] == "succeeded" for i in ids), timeout=30,
             message="the jobs to run")
    page = dashboard.open("/overview")
    expect(page.locator("main h1")).to_have_text("Overview")
    expect(page.locator("#charts figure.chart")).to_have_count(3)
    succeeded = page.locator("#chart-throughput path[data-series='succeeded']")
    expect(succeeded).to_have_attribute("d", re.compile(r"L"))  # a drawn line, not an empty path
    # Somewhere in the window the rate is above zero: a point above the baseline.
    d = succeeded.get_attribute("d")
    ys = [float(point.split(",")[1]) for point in re.findall(r"[ML]([\d.]+,[\d.]+)", d)]
    assert min(ys) < max(ys)
    expect(page.locator("#chart-depth .legend")).to_contain_text("default")
    expect(page.locator("#chart-latency path[data-series='p99']")).to_have_attribute("d", re.compile(r"[ML]"))
    expect(page.locator("#overview-totals")).to_contain_text("jobs finished")
    dashboard.screenshot("overview")
    dashboard.assert_clean()


def test_jobs_list_filters_in_the_url_pages_and_updates_live(dashboard: Dashboard, api: httpx.Client):
    batch = uuid.uuid4().hex[:8]
    for n in range(55):
        enqueue(api, task="echo", queue=f"parked-{batch}", payload={"n": n}, tags={"batch": batch})
    page = dashboard.open(f"/jobs?queue=parked-{batch}")
    expect(page.locator("#filter-queue")).to_have_value(f"parked-{batch}")
    expect(page.locator("#jobs-rows tr")).to_have_count(50)
    page.click("#jobs-more")
    expect(page.locator("#jobs-rows tr")).to_have_count(55)
    expect(page.locator("#jobs-more")).to_be_hidden()
    dashboard.screenshot("jobs")

    page.fill("#filter-queue", "")
    page.fill("#filter-tag", f"batch:{batch}")
    page.select_option("#filter-status", "pending")
    page.click("#jobs-filters button[type=submit]")
    expect(page).to_have_url(re.compile(rf"#/jobs\?status=pending&tag=batch%3A{batch}$"))
    expect(page.locator("#jobs-rows tr")).to_have_count(50)

    page.goto(f"{dashboard.stack.url}/#/jobs?tag=batch:{batch}-live")
    page.wait_for_selector("#live[data-state='live']")
    expect(page.locator("#jobs-count")).to_contain_text("0 jobs")
    job_id = enqueue(api, task="slow", payload={"seconds": 1}, tags={"batch": f"{batch}-live"})
    row = page.locator(f"#jobs-rows tr[data-id='{job_id}']")
    expect(row).to_be_visible(timeout=15_000)  # a new matching job appears by itself
    expect(row).to_have_attribute("data-status", "succeeded", timeout=20_000)  # and follows its run
    dashboard.assert_clean()


def test_workflows_list_filters_by_name_and_follows_status(dashboard: Dashboard, api: httpx.Client):
    name = f"wf-{uuid.uuid4().hex[:8]}"
    other = submit(api, name=f"{name}-other", steps=[{"step": "a", "task": "echo"}])
    page = dashboard.open("/workflows")
    page.fill("#filter-name", name)
    page.click("#workflows-filters button[type=submit]")
    expect(page).to_have_url(re.compile(rf"#/workflows\?name={name}$"))
    expect(page.locator("#workflows-count")).to_contain_text("0 workflows")
    workflow_id = submit(api, name=name, steps=[
        {"step": "gate", "type": "wait_for_trigger"}, {"step": "b", "task": "echo", "depends_on": ["gate"]}])
    row = page.locator(f"#workflows-rows tr[data-id='{workflow_id}']")
    expect(row).to_have_attribute("data-status", "running", timeout=15_000)
    assert page.locator(f"#workflows-rows tr[data-id='{other}']").count() == 0
    api.post(f"/workflows/{workflow_id}/steps/gate/trigger", json={})
    expect(row).to_have_attribute("data-status", "succeeded", timeout=20_000)
    row.locator("a").first.click()
    expect(page).to_have_url(re.compile(rf"#/workflows/{workflow_id}$"))
    dashboard.assert_clean()


def test_job_form_catches_bad_json_and_shows_api_details_next_to_the_field(
        dashboard: Dashboard, api: httpx.Client):
    page = dashboard.open("/new")
    before = len(api.get("/jobs", params={"task": "form-task", "limit": 500}).json()["items"])
    page.fill("#form-job [name=task]", "form-task")
    page.fill("#form-job [name=payload]", "{not json")
    page.click("#form-job button[type=submit]")
    expect(page.locator("#form-job .field-error[data-for=payload]")).to_contain_text("not valid JSON")
    page.fill("#form-job [name=payload]", '{"x": 1}')
    page.fill("#form-job [name=priority]", "urgent")
    page.click("#form-job button[type=submit]")
    expect(page.locator("#form-job .field-error[data-for=priority]")).to_contain_text("integer")
    expect(page.locator("#form-job .field-error[data-for=payload]")).to_have_text("")
    assert len(api.get("/jobs", params={"task": "form-task", "limit": 500}).json()["items"]) == before
    page.fill("#form-job [name=priority]", "5")
    page.fill("#form-job [name=tags]", "origin:form")
    page.click("#form-job button[type=submit]")
    expect(page).to_have_url(re.compile(r"#/jobs/[0-9a-f-]{36}$"))
    job_id = page.url.rsplit("/", 1)[1]
    job = api.get(f"/jobs/{job_id}").json()
    assert (job["task"], job["priority"], job["payload"], job["tags"]) == ("form-task", 5, {"x": 1}, {"origin": "form"})
    assert_clean_but_the_refusals(dashboard)


def test_workflow_form_shows_every_problem_and_submits(dashboard: Dashboard, api: httpx.Client):
    page = dashboard.open("/new?form=workflow")
    body = page.locator("#form-workflow [name=body]")
    body.fill('{"name": "loop", "steps": [{"step": "a", "task": "echo", "depends_on": ["b"]},'
              ' {"step": "b", "task": "echo", "depends_on": ["a"]}, {"step": "c", "task": "echo", "depends_on": ["z"]}]}')
    page.click("#form-workflow button[type=submit]")
    error = page.locator("#form-workflow .field-error[data-for=body]")
    expect(error).to_contain_text("cycle")
    expect(error).to_contain_text("z")
    dashboard.screenshot("new-workflow")
    name = f"form-{uuid.uuid4().hex[:8]}"
    body.fill('{"name": "%s", "steps": [{"step": "a", "task": "echo"}]}' % name)
    page.click("#form-workflow button[type=submit]")
    expect(page).to_have_url(re.compile(r"#/workflows/[0-9a-f-]{36}$"))
    assert [w["name"] for w in api.get("/workflows", params={"name": name}).json()["items"]] == [name]
    assert_clean_but_the_refusals(dashboard)


def test_job_and_workflow_pages_name_what_is_not_there(dashboard: Dashboard):
    """A job or workflow the API does not know (404): its page says so, under the way back."""
    missing = uuid.uuid4()
    for what in ("job", "workflow"):
        page = dashboard.open(f"/{what}s/{missing}")
        view = page.locator(f"section.view.{what}")
        expect(view.locator(".empty")).to_have_text(f"No {what} {missing}.")
        expect(view.locator("nav.crumbs")).to_contain_text(f"/ {what}")
    dashboard.console_errors[:] = [e for e in dashboard.console_errors if "status of 404" not in e]
    dashboard.assert_clean()


def test_queues_and_job_pages_say_when_no_live_worker_takes_due_jobs(dashboard: Dashboard, api: httpx.Client):
    """Issue 29: a job on a queue no worker serves waited for ever without a word."""
    queue = f"nobody_{uuid.uuid4().hex[:6]}"
    job = api.post("/jobs", json={"task": "echo", "queue": queue}).json()
    page = dashboard.open("/queues")
    row = page.locator(f"tr[data-queue='{queue}']")
    expect(row.locator(".queue-warning")).to_contain_text("no live worker serves it")
    expect(row.locator(".queue-warning")).to_contain_text(f"--queues {queue}")
    dashboard.open(f"/jobs/{job['id']}")
    expect(page.locator("#job-waiting-for-worker")).to_contain_text(f"no live worker serves queue '{queue}'")
    dashboard.assert_clean()
