"""The dashboard in a real browser against a real API, database, worker and monitor."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from qforge.commands.enqueue import JobSpec
from qforge.commands.enqueue import enqueue as enqueue_in_database
from qforge.db import connect
from browser_stack import CHROMIUM, Dashboard, Stack, free_port, wait_for

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")

MARKUP = "<img src=x onerror=alert(1)>"
GREEN = "rgb(22, 163, 74)"  # --c of .st-succeeded in web/styles.css


def enqueue(api: httpx.Client, **job: Any) -> str:
    response = api.post("/jobs", json=job)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def submit(api: httpx.Client, **workflow: Any) -> str:
    response = api.post("/workflows", json=workflow)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def job_status(api: httpx.Client, job_id: str) -> str:
    return api.get(f"/jobs/{job_id}").json()["status"]


def event_types(api: httpx.Client, job_id: str) -> list[str]:
    return [event["type"] for event in api.get(f"/jobs/{job_id}/events").json()["events"]]


def row(page: Page, job_id: str, event_type: str):
    return page.locator(f"#timeline-rows tr.ev[data-job='{job_id}'][data-type='{event_type}']")


def step_status(page: Page, step: str) -> str | None:
    return page.get_attribute(f"#dag .node[data-step='{step}']", "data-status")


def test_page_loads_every_section_without_console_errors(dashboard: Dashboard, api: httpx.Client):
    page = dashboard.open()
    expect(page.locator("h1")).to_have_text("Live timeline")
    for label, heading in [("Search", "Search by tag"), ("Queues", "Queues"), ("Workers", "Workers"),
                           ("Schedules", "Schedules"), ("Timeline", "Live timeline")]:
        page.click(f"header nav a:text-is('{label}')")
        expect(page.locator("main h1")).to_have_text(heading)
        expect(page.locator(f"header nav a:text-is('{label}')")).to_have_class("active")
    page.click("header nav a:text-is('Workers')")
    card = page.locator(".worker[data-worker='browser-worker']")
    expect(card).to_be_visible()
    expect(card.locator(".slot")).to_have_count(4)
    assert api.get("/favicon.ico").status_code == 200
    dashboard.assert_clean()


def test_enqueued_job_appears_in_the_timeline_and_its_status_changes_live(
        dashboard: Dashboard, api: httpx.Client):
    page = dashboard.open()
    job_id = enqueue(api, task="slow", payload={"seconds": 1.2}, tags={"order_id": "T-1", "suite": "browser"})
    flaky_id = enqueue(api, task="flaky", payload={"fail_times": 1}, max_retries=2, queue="default",
                       tags={"order_id": "T-2"})

    expect(row(page, job_id, "Enqueued")).to_be_visible(timeout=5_000)
    expect(row(page, job_id, "Claimed")).to_be_visible(timeout=5_000)
    expect(row(page, job_id, "Succeeded")).to_be_visible(timeout=8_000)
    # Newest first: Succeeded above Claimed above Enqueued.
    positions = page.eval_on_selector_all(
        f"#timeline-rows tr.ev[data-job='{job_id}']", "rows => rows.map(r => r.dataset.type)")
    assert positions.index("Succeeded") < positions.index("Claimed") < positions.index("Enqueued")
    claimed = row(page, job_id, "Claimed")
    expect(claimed.locator(".summary")).to_contain_text("attempt 1")
    expect(claimed.locator(".summary")).to_contain_text("browser-worker")
    expect(claimed.locator(".queue")).to_have_text("default")
    expect(claimed.locator(".tagcell")).to_contain_text("order_id:T-1")

    # The flaky job fails once: Failed with its error, Retried with the backoff, then success.
    expect(row(page, flaky_id, "Succeeded")).to_be_visible(timeout=8_000)
    expect(row(page, flaky_id, "Failed").locator(".summary")).to_contain_text("attempt 1")
    expect(row(page, flaky_id, "Retried").locator(".summary")).to_contain_text("retry in")

    # A workflow's step events name their step and link to the workflow.
    workflow_id = submit(api, name="checkout", tags={"order_id": "T-3"}, steps=[
        {"step": "reserve", "task": "echo"}, {"step": "charge", "task": "echo", "depends_on": ["reserve"]}])
    charge = page.locator(f"#timeline-rows tr.ev[data-type='Succeeded']:has(td.step:text-is('charge'))")
    expect(charge).to_be_visible(timeout=8_000)
    expect(charge.locator(f"a[href='#/workflows/{workflow_id}']")).to_have_text("checkout")

    # Filtering by type keeps only that type.
    page.select_option("#filter-type", "Retried")
    expect(page.locator("#timeline-rows tr.ev")).to_have_count(1)
    page.select_option("#filter-type", "")
    expect(row(page, job_id, "Enqueued")).to_be_visible()
    dashboard.screenshot("timeline")
    dashboard.assert_clean()


def test_pause_holds_new_events_back_and_resume_shows_them(dashboard: Dashboard, api: httpx.Client):
    page = dashboard.open()
    page.click("#pause")
    expect(page.locator("#pause")).to_have_text("Resume")
    job_id = enqueue(api, task="echo", payload={"n": 1})
    wait_for(lambda: job_status(api, job_id) == "succeeded", message="the echo job to succeed")
    expect(page.locator("#paused-note")).to_contain_text("new event", timeout=5_000)
    expect(row(page, job_id, "Enqueued")).to_have_count(0)
    page.click("#pause")
    expect(row(page, job_id, "Enqueued")).to_be_visible()
    expect(row(page, job_id, "Succeeded")).to_be_visible()
    dashboard.assert_clean()


def test_job_detail_shows_the_job_and_follows_it_live(dashboard: Dashboard, api: httpx.Client):
    slow_id = enqueue(api, task="slow", payload={"seconds": 1.5}, tags={"order_id": "J-1"})
    page = dashboard.open(f"/jobs/{slow_id}")
    expect(page.locator("#job-status .pill")).to_have_attribute("data-status", "running", timeout=5_000)
    expect(page.locator("#job-status .pill")).to_have_attribute("data-status", "succeeded", timeout=8_000)
    expect(page.locator(".history-item[data-type='Succeeded']")).to_have_count(1)
    expect(page.locator("main")).to_contain_text('"slept_seconds"')

    flaky_id = enqueue(api, task="flaky", payload={"fail_times": 2}, max_retries=3,
                       tags={"order_id": "J-2", "customer": "acme"})
    wait_for(lambda: job_status(api, flaky_id) == "succeeded", message="the flaky job to succeed")
    page = dashboard.open(f"/jobs/{flaky_id}")
    history = page.locator(".history-item")
    expect(history.first).to_have_attribute("data-type", "Enqueued")
    types = page.eval_on_selector_all(".history-item", "items => items.map(i => i.dataset.type)")
    assert types == event_types(api, flaky_id)
    assert types.count("Claimed") == 3 and types.count("Retried") == 2
    expect(page.locator("#job-attempts")).to_have_text("3 of 4")
    expect(page.locator("main")).to_contain_text("browser-worker")
    expect(page.locator("main")).to_contain_text('"fail_times": 2')
    dashboard.screenshot("job-detail", full_page=True)
    dashboard.assert_clean()


def test_workflow_dag_turns_green_in_dependency_order(dashboard: Dashboard, api: httpx.Client):
    steps = [
        {"step": "extract", "task": "slow", "payload": {"seconds": 1.0}},
        {"step": "transform", "task": "slow", "payload": {"seconds": 0.6}, "depends_on": ["extract"]},
        {"step": "validate", "task": "echo", "payload": {"verdict": "ok"}, "depends_on": ["extract"]},
        {"step": "load", "task": "slow", "payload": {"seconds": 0.4}, "depends_on": ["transform", "validate"]},
        {"step": "publish", "task": "echo", "depends_on": ["load"],
         "when": {"step": "validate", "path": "verdict", "equals": "ok"}},
        {"step": "alert", "task": "echo", "when": {"step": "validate", "path": "verdict", "equals": "bad"}},
    ]
    workflow_id = submit(api, name="nightly-etl", tags={"order_id": "W-1"}, steps=steps)
    page = dashboard.open(f"/workflows/{workflow_id}")
    expect(page.locator("#dag .node")).to_have_count(len(steps))
    # Record when each box first turns succeeded, as the page sees it.
    page.evaluate("""() => {
        window.__green = {};
        const start = performance.now();
        window.__greenTimer = setInterval(() => {
            for (const node of document.querySelectorAll('#dag .node')) {
                if (node.dataset.status === 'succeeded' && !(node.dataset.step in window.__green)) {
                    window.__green[node.dataset.step] = performance.now() - start;
                }
            }
        }, 20);
    }""")
    expect(page.locator("#workflow-status .pill")).to_have_attribute("data-status", "succeeded", timeout=15_000)
    for name in ["extract", "transform", "validate", "load", "publish"]:
        expect(page.locator(f"#dag .node[data-step='{name}']")).to_have_attribute("data-status", "succeeded")
    expect(page.locator("#dag .node[data-step='alert']")).to_have_attribute("data-status", "skipped")
    green = page.evaluate("() => window.__green")
    for step in steps:
        for dependency in step.get("depends_on", []):
            assert green[dependency] <= green[step["step"]], (dependency, step["step"], green)
    assert green["extract"] < green["transform"] < green["load"] <= green["publish"], green

    # Boxes are painted with the status colour; the conditional edge is dashed and labelled.
    expect(page.locator("#dag .node[data-step='load'] rect.box")).to_have_css("stroke", GREEN)
    conditional = page.locator("#dag path.edge-when[data-from='validate'][data-to='publish']")
    expect(conditional).to_have_count(1)
    assert conditional.evaluate("p => getComputedStyle(p).strokeDasharray") not in ("", "none")
    expect(page.locator("#dag .edge-label-when").first).to_contain_text('verdict = "ok"')
    expect(page.locator("#dag path.edge-dep[data-from='extract'][data-to='transform']")).to_have_count(1)

    # A click on a step shows its output and attempts.
    page.click("#dag .node[data-step='validate']")
    panel = page.locator("#step-panel")
    expect(panel.locator("h2")).to_have_text("validate")
    expect(panel).to_contain_text('"verdict": "ok"')
    dashboard.screenshot("workflow-dag")
    dashboard.assert_clean()


def test_trigger_button_completes_a_waiting_step(dashboard: Dashboard, api: httpx.Client):
    workflow_id = submit(api, name="approval", steps=[
        {"step": "prepare", "task": "echo", "payload": {"order": "A-7"}},
        {"step": "approve", "type": "wait_for_trigger", "depends_on": ["prepare"]},
        {"step": "ship", "task": "echo", "depends_on": ["approve"]},
    ])
    page = dashboard.open(f"/workflows/{workflow_id}")
    expect(page.locator("#dag .node[data-step='approve']")).to_have_attribute("data-status", "waiting",
                                                                               timeout=8_000)
    assert step_status(page, "ship") == "blocked"
    page.click("#dag .node[data-step='approve']")
    expect(page.locator("#step-panel h2")).to_have_text("approve")
    dashboard.screenshot("workflow-trigger")
    page.fill("#trigger-payload", '{"approved_by": "qa"}')
    page.click("#trigger-button")
    expect(page.locator("#dag .node[data-step='approve']")).to_have_attribute("data-status", "succeeded")
    expect(page.locator("#dag .node[data-step='ship']")).to_have_attribute("data-status", "succeeded",
                                                                            timeout=8_000)
    expect(page.locator("#step-panel")).to_contain_text('"approved_by": "qa"')
    expect(page.locator("#trigger-button")).to_have_count(0)
    steps = {s["step"]: s for s in api.get(f"/workflows/{workflow_id}").json()["steps"]}
    assert steps["approve"]["output"] == {"approved_by": "qa"}
    dashboard.assert_clean()


def test_tag_search_finds_jobs_and_workflows_carrying_every_tag(dashboard: Dashboard, api: httpx.Client):
    job_id = enqueue(api, task="echo", tags={"order_id": "A-1001", "region": "eu"})
    workflow_id = submit(api, name="order A-1001", tags={"order_id": "A-1001"},
                         steps=[{"step": "only", "task": "echo"}])
    other_id = enqueue(api, task="echo", tags={"order_id": "A-2002", "region": "eu"})

    page = dashboard.open("/search")
    page.fill("#tag-search", "order_id:A-1001")
    page.press("#tag-search", "Enter")
    results = page.locator("#search-results tr.result")
    expect(page.locator(f"#search-results tr.result[data-id='{job_id}'][data-kind='job']")).to_be_visible()
    expect(page.locator(f"#search-results tr.result[data-id='{workflow_id}'][data-kind='workflow']")).to_be_visible()
    expect(page.locator(f"#search-results tr.result[data-id='{other_id}']")).to_have_count(0)

    page.fill("#tag-search", "order_id:A-1001 region:eu")
    page.press("#tag-search", "Enter")
    expect(results).to_have_count(1)
    expect(results.first).to_have_attribute("data-id", job_id)
    assert "tag=order_id%3AA-1001" in page.url and "region%3Aeu" in page.url  # shareable link

    results.first.locator("a.idlink").first.click()
    expect(page.locator(".view.job")).to_have_attribute("data-job", job_id)
    dashboard.assert_clean()


def test_the_timeline_and_the_search_filter_by_who_wrote_the_events(dashboard: Dashboard, api: httpx.Client):
    page = dashboard.open("/timeline?actor=browser-worker")
    job_id = enqueue(api, task="echo", tags={"who": "by-actor"})  # written by "anonymous"
    expect(row(page, job_id, "Claimed")).to_be_visible(timeout=8_000)
    expect(row(page, job_id, "Claimed").locator("td.actor")).to_have_text("browser-worker")
    expect(row(page, job_id, "Enqueued")).to_have_count(0)
    page.fill("#filter-actor", "anonymous")
    expect(row(page, job_id, "Enqueued")).to_be_visible()
    expect(row(page, job_id, "Claimed")).to_have_count(0)
    assert "actor=anonymous" in page.url

    page = dashboard.open("/search")
    page.fill("#tag-search", "who:by-actor")
    page.fill("#actor-search", "nobody")
    page.press("#tag-search", "Enter")
    expect(page.locator("#search-results")).to_contain_text("No job or workflow")
    page.fill("#actor-search", "anonymous")
    page.press("#tag-search", "Enter")
    expect(page.locator(f"#search-results tr.result[data-id='{job_id}']")).to_be_visible()
    dashboard.assert_clean()


def test_markup_in_payloads_tags_and_names_is_shown_as_text_and_runs_nothing(
        dashboard: Dashboard, api: httpx.Client):
    page = dashboard.open()
    page.evaluate("() => { window.alert = () => { window.__alerted = true; }; }")  # belt and braces
    job_id = enqueue(api, task="echo", payload={"note": MARKUP}, tags={"note": MARKUP})
    failing_id = enqueue(api, task="fail", payload={"why": MARKUP}, max_retries=0)
    workflow_id = submit(api, name=MARKUP, tags={"note": MARKUP},
                         steps=[{"step": MARKUP, "task": "echo", "payload": {"html": MARKUP}}])
    wait_for(lambda: job_status(api, job_id) == "succeeded" and job_status(api, failing_id) == "dead",
             message="the jobs to finish")

    expect(row(page, job_id, "Succeeded")).to_be_visible()
    expect(row(page, job_id, "Enqueued").locator(".tagcell")).to_contain_text(f"note:{MARKUP}")
    for route, where in [(f"/jobs/{job_id}", "main"), (f"/jobs/{failing_id}", "main"),
                         (f"/workflows/{workflow_id}", "main")]:
        page.goto(f"{dashboard.stack.url}/#{route}")
        expect(page.locator(where)).to_contain_text(MARKUP)
    expect(page.locator("#dag .node text.name")).to_have_text(MARKUP[:18] + "…")
    wait_for(lambda: api.get(f"/workflows/{workflow_id}").json()["status"] == "succeeded",
             message="the workflow to succeed")
    page.click("#dag .node")
    expect(page.locator("#step-panel")).to_contain_text(MARKUP)

    assert page.evaluate("() => document.querySelectorAll('main img, #dag img, foreignObject').length") == 0
    assert page.evaluate("() => window.__alerted === undefined")
    dashboard.assert_clean()  # no dialog, and no 404 for an <img src=x>


def test_dead_job_retried_from_the_dead_letter_list_runs_again(dashboard: Dashboard, api: httpx.Client):
    job_id = enqueue(api, task="fail", max_retries=0, tags={"order_id": "D-1"})
    wait_for(lambda: job_status(api, job_id) == "dead", message="the job to die")
    assert event_types(api, job_id).count("Claimed") == 1

    page = dashboard.open("/queues")
    expect(page.locator("#queue-rows tr[data-queue='default'] td[data-status='dead']")).not_to_have_text("0")
    dead_row = page.locator(f"#dead-rows tr[data-job='{job_id}']")
    expect(dead_row).to_be_visible()
    expect(dead_row).to_contain_text("task 'fail' always fails")
    dead_row.locator("button.retry").click()

    wait_for(lambda: event_types(api, job_id).count("Claimed") == 2, timeout=10,
             message="a second Claimed event")
    wait_for(lambda: job_status(api, job_id) == "dead", message="the job to die again")
    job = api.get(f"/jobs/{job_id}").json()
    assert job["attempts"] == 2
    # It is back in the list, with its new attempt count.
    expect(page.locator(f"#dead-rows tr[data-job='{job_id}'] td.num")).to_have_text("2", timeout=6_000)
    dashboard.assert_clean()


def test_stream_resumes_after_the_api_restarts_without_gaps_or_duplicates(
        dashboard: Dashboard, api: httpx.Client, stack: Stack):
    page = dashboard.open()
    first = enqueue(api, task="echo", payload={"n": 0})
    expect(row(page, first, "Succeeded")).to_be_visible()
    cursor_before = page.eval_on_selector(
        f"#timeline-rows tr.ev[data-job='{first}'][data-type='Enqueued']", "r => r.dataset.position")

    stack.stop_api()
    expect(page.locator("#live")).to_have_attribute("data-state", "reconnecting", timeout=10_000)
    # While the API is down the worker still runs what is in the database.
    with connect(stack.db_url, autocommit=True) as conn:
        specs = [JobSpec(task="echo", payload={"n": n}) for n in range(1, 4)]
        offline = [str(e.id) for e in enqueue_in_database(conn, specs, actor="test")]
    stack.start_api()
    expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=15_000)
    for job_id in offline:
        expect(row(page, job_id, "Succeeded")).to_be_visible(timeout=10_000)

    shown = page.eval_on_selector_all("#timeline-rows tr.ev", "rows => rows.map(r => Number(r.dataset.position))")
    assert len(shown) == len(set(shown)), "an event is shown twice"
    logged = []
    after = "0"
    while True:
        page_of_events = api.get("/events", params={"after": after, "limit": 1000}).json()
        logged += page_of_events["events"]
        if not page_of_events["events"]:
            break
        after = page_of_events["next"]
    expected = {e["position"] for e in logged
                if e["position"] >= int(cursor_before) and e["type"] != "Heartbeat"
                and e["stream_id"] in {first, *offline}}
    missing = expected - set(shown)
    assert not missing, f"events missing from the timeline: {sorted(missing)}"
    # Connection errors while the API was down are expected on the console; nothing else.
    unexpected = [e for e in dashboard.console_errors if "ERR_CONNECTION_REFUSED" not in e
                  and "/events" not in e]
    assert unexpected == []
    assert dashboard.dialogs == []


def test_the_token_is_asked_once_and_kept_for_the_session(dashboard: Dashboard, stack: Stack):
    token = "s3cret-browser-token"
    port = free_port()  # a second API on the same database, this one with a token
    stack.start_api(port=port, env={"QFORGE_API_TOKEN": token})
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/queues").status_code == 401

    page = dashboard.page
    stream_urls: list[str] = []
    page.on("request", lambda request: stream_urls.append(request.url)
            if "/events/stream?" in request.url else None)
    page.goto(f"{base}/#/queues")
    overlay = page.locator("#token-overlay")
    expect(overlay).to_be_visible()
    expect(overlay).to_have_count(1)  # one form, however many requests were refused
    page.fill("#token-overlay input[name='token']", token)
    page.click("#token-overlay button[type='submit']")
    expect(overlay).to_have_count(0)
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    expect(page.locator("#queue-rows tr[data-queue='default']")).to_be_visible()
    assert page.evaluate("() => sessionStorage.getItem('qforge.token')") == token

    page.reload()
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    expect(page.locator("#queue-rows tr[data-queue='default']")).to_be_visible()
    expect(page.locator("#token-overlay")).to_have_count(0)
    page.click("header nav a:text-is('Timeline')")
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as authorized:
        job_id = enqueue(authorized, task="echo", payload={"via": "token"})
    expect(row(page, job_id, "Succeeded")).to_be_visible(timeout=8_000)
    # The stream opens with a short-lived ticket: the token never goes into a URL.
    assert stream_urls and all(token not in url and "ticket=" in url for url in stream_urls)


def test_queue_page_pauses_and_resumes_a_queue(dashboard: Dashboard, api: httpx.Client):
    # The stack's worker serves "default": paused here, resumed before the test ends.
    enqueue(api, task="echo")
    page = dashboard.open("/queues")
    row = page.locator("#queue-rows tr[data-queue='default']")
    row.locator("button.pause-toggle").click()
    try:
        wait_for(lambda: {q["queue"]: q for q in api.get("/queues").json()["items"]}["default"]["paused"],
                 message="the queue to be paused")
        expect(row.locator(".paused-pill")).to_be_visible(timeout=6_000)
        held = enqueue(api, task="echo")
        expect(row.locator("button.pause-toggle")).to_have_text("Resume", timeout=6_000)
        assert job_status(api, held) == "pending"
        row.locator("button.pause-toggle").click()
        wait_for(lambda: job_status(api, held) == "succeeded", timeout=10, message="the resumed queue to run")
    finally:
        api.put("/queues/default", json={"paused": False})
    dashboard.assert_clean()


def test_schedules_page_shows_ticks_and_pauses_a_schedule(dashboard: Dashboard, api: httpx.Client):
    created = api.post("/schedules", json={"name": "every-second", "cron": "* * * * * *",
                                           "job": {"task": "echo"}, "catch_up": "none"})
    assert created.status_code == 201, created.text
    page = dashboard.open("/schedules")
    row = page.locator("#schedule-rows tr[data-schedule='every-second']")
    expect(row).to_contain_text("* * * * * *")
    expect(row.locator("td.next-fire")).not_to_have_text("—")
    wait_for(lambda: api.get("/schedules/every-second").json()["fired"] >= 2, timeout=10,
             message="two ticks fired")
    row.locator("button.pause").click()
    wait_for(lambda: api.get("/schedules/every-second").json()["paused"], message="the schedule to pause")
    expect(row.locator(".paused-pill")).to_be_visible(timeout=6_000)
    expect(row.locator("td.next-fire")).to_have_text("—")
    row.locator("button.delete").click()
    wait_for(lambda: api.get("/schedules/every-second").status_code == 404, message="the schedule to go")
    dashboard.assert_clean()
