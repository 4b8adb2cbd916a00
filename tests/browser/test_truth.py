"""Issue 36: the dashboard tells the truth. One test per page that said something that was not so
(each failed before its fix), with a screenshot of the page after it saved under docs/img/."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

import time
from datetime import datetime, timedelta, timezone

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
