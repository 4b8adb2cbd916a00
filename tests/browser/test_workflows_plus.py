"""Issue 15 in the dashboard: the Resume button of a failed workflow, and a fan-out step's node."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from browser_stack import CHROMIUM, Dashboard, wait_for
from test_dashboard import step_status, submit

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")


def test_resume_button_runs_the_failed_part_again(dashboard: Dashboard, api):
    workflow_id = submit(api, name="resumable", steps=[
        {"step": "first", "task": "echo"},
        {"step": "flaky", "task": "flaky", "payload": {"fail_times": 1}, "max_retries": 0,
         "depends_on": ["first"]},
        {"step": "last", "task": "echo", "depends_on": ["flaky"]}])
    wait_for(lambda: api.get(f"/workflows/{workflow_id}").json()["status"] == "failed", timeout=15,
             message="the first run to fail")
    page = dashboard.open(f"/workflows/{workflow_id}")
    expect(page.locator("#dag .node[data-step='flaky']")).to_have_attribute("data-status", "dead")
    expect(page.locator("#dag .node[data-step='last']")).to_have_attribute("data-status", "skipped")
    page.click("#workflow-resume")
    expect(page.locator("#dag .node[data-step='last']")).to_have_attribute("data-status", "succeeded",
                                                                            timeout=10_000)
    expect(page.locator("#workflow-status")).to_contain_text("succeeded")
    expect(page.locator("#workflow-resume")).to_have_count(0)
    assert step_status(page, "first") == "succeeded"
    claims = [e for e in api.get(f"/workflows/{workflow_id}/events").json()["events"] if e["type"] == "Claimed"]
    assert len(claims) == 4  # first once, flaky twice, last once
    dashboard.assert_clean()


def test_fan_out_step_is_one_node_with_its_element_counts(dashboard: Dashboard, api):
    workflow_id = submit(api, name="fan", steps=[
        {"step": "list", "task": "echo", "payload": {"items": ["a", "b", "c"]}},
        {"step": "each", "task": "echo", "for_each": {"step": "list", "path": "items"}, "max_parallel": 2}])
    wait_for(lambda: api.get(f"/workflows/{workflow_id}").json()["status"] == "succeeded", timeout=15,
             message="the fan-out to finish")
    page = dashboard.open(f"/workflows/{workflow_id}")
    node = page.locator("#dag .node[data-step='each']")
    expect(node).to_have_attribute("data-status", "succeeded")
    expect(node).to_contain_text("3/3")
    expect(page.locator("#dag .node")).to_have_count(2)  # elements are not nodes of their own
    node.click()
    expect(page.locator("#step-elements")).to_contain_text("3 elements")
    expect(page.locator("#step-elements li")).to_have_count(3)
    dashboard.assert_clean()
