"""The dashboard for what exists: bulk actions on the Jobs list, the Definitions page (versions, a
diff, a run form with a version picker) and the schedule creation form, in a real browser against
a real stack. Each saves its screenshot under docs/img/."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from browser_stack import CHROMIUM, Dashboard, wait_for
from test_dashboard import enqueue

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def shot(dashboard: Dashboard, name: str) -> None:
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    dashboard.page.screenshot(path=str(DOCS_IMG / f"{name}.png"))


def test_cancel_all_matching_jobs_from_the_list_after_a_confirmation_naming_the_count(
        dashboard: Dashboard, api: httpx.Client) -> None:
    deploy = uuid.uuid4().hex[:8]
    ids = [enqueue(api, task="echo", queue="held", tags={"deploy": deploy}) for _ in range(7)]
    other = enqueue(api, task="echo", queue="held", tags={"deploy": "other"})
    page = dashboard.open(f"/jobs?queue=held&tag=deploy:{deploy}")
    expect(page.locator("#jobs-rows tr")).to_have_count(7)
    page.click("#bulk-cancel")
    dialog = page.locator("#bulk-confirm")
    expect(dialog.locator("h2")).to_have_text("Cancel 7 matching jobs?")
    expect(page.locator("#bulk-confirm-yes")).to_have_text("Cancel 7 jobs")
    shot(dashboard, "jobs-bulk-cancel")
    page.click("#bulk-confirm-no")
    expect(dialog).not_to_be_visible()
    assert {api.get(f"/jobs/{i}").json()["status"] for i in ids} == {"pending"}, "Keep them cancelled something"

    page.click("#bulk-cancel")
    page.click("#bulk-confirm-yes")
    expect(page.locator(".toast")).to_contain_text("Cancelled 7 jobs.")
    wait_for(lambda: {api.get(f"/jobs/{i}").json()["status"] for i in ids} == {"cancelled"}, timeout=10,
             message="the jobs to be cancelled")
    assert api.get(f"/jobs/{other}").json()["status"] == "pending"
    expect(page.locator("#jobs-rows tr[data-status='cancelled']")).to_have_count(7)

    page.click("#bulk-retry")
    expect(page.locator("#bulk-confirm h2")).to_have_text("Retry 7 matching jobs?")
    page.click("#bulk-confirm-yes")
    wait_for(lambda: {api.get(f"/jobs/{i}").json()["status"] for i in ids} == {"pending"}, timeout=10,
             message="the jobs to be retried")
    dashboard.assert_clean()


def test_a_definition_s_versions_their_diff_and_a_run_of_a_chosen_version(dashboard: Dashboard,
                                                                           api: httpx.Client) -> None:
    name = f"report-{uuid.uuid4().hex[:6]}"
    api.put(f"/definitions/{name}", json={"steps": [{"step": "extract", "task": "echo"}]})
    api.put(f"/definitions/{name}", json={"steps": [{"step": "extract", "task": "echo"},
                                                    {"step": "load", "task": "echo", "depends_on": ["extract"]}]})
    page = dashboard.open("/definitions")
    page.click(f"tr[data-definition='{name}'] a")
    expect(page.locator("main h1")).to_have_text(f"Definition {name}")
    expect(page.locator("#version-rows tr")).to_have_count(2)
    expect(page.locator("#definition-diff .add").first).to_be_visible()
    assert any('"step": "load"' in text for text in page.locator("#definition-diff .add").all_inner_texts())
    page.select_option("#run-version", "1")
    page.fill("#run-inputs", '{"day": 3}')
    shot(dashboard, "definition-page")
    page.click("#run-submit")
    page.wait_for_url("**/#/workflows/*")
    workflow_id = page.url.rsplit("/", 1)[1]
    workflow = api.get(f"/workflows/{workflow_id}").json()
    assert workflow["definition"] == {"name": name, "version": 1}
    assert [s["step"] for s in workflow["steps"]] == ["extract"]

    page.goto(f"{dashboard.stack.url}/#/definitions/{name}")
    page.fill("#run-inputs", "[1, 2]")
    page.click("#run-submit")
    expect(page.locator("#run-message")).to_contain_text("inputs")
    dashboard.assert_clean()


def test_a_schedule_is_created_from_the_form_pinned_to_a_version(dashboard: Dashboard, api: httpx.Client) -> None:
    definition = f"nightly-{uuid.uuid4().hex[:6]}"
    api.put(f"/definitions/{definition}", json={"steps": [{"step": "a", "task": "echo"}]})
    api.put(f"/definitions/{definition}", json={"steps": [{"step": "b", "task": "echo"}]})
    page = dashboard.open("/schedules")
    page.fill("#schedule-name", f"{definition}-bad")
    page.fill("#schedule-cron", "not a cron")
    page.fill("#schedule-task", "echo")
    page.click("#schedule-create")
    expect(page.locator("#schedule-message")).to_contain_text("cron")
    dashboard.console_errors[:] = [e for e in dashboard.console_errors if "status of 422" not in e]

    page.fill("#schedule-name", definition)
    page.fill("#schedule-cron", "0 3 * * *")
    page.select_option("#schedule-kind", "definition")
    page.select_option("#schedule-definition", definition)
    expect(page.locator("#schedule-version option")).to_have_count(3)
    page.select_option("#schedule-version", "1")
    page.fill("#schedule-inputs", '{"region": "eu"}')
    shot(dashboard, "schedule-form")
    page.click("#schedule-create")
    expect(page.locator(f"tr[data-schedule='{definition}']")).to_contain_text(f"definition {definition} version 1")
    made = api.get(f"/schedules/{definition}").json()
    assert (made["definition"], made["version"], made["inputs"]) == (definition, 1, {"region": "eu"})
    dashboard.assert_clean()
