"""The Keys page in a real browser: keys jobs use and keys set centrally, their limits, weights and
running counts, and the form that sets them (with the API's refusals shown next to the field)."""

from __future__ import annotations

import uuid

import httpx
import pytest
from playwright.sync_api import expect

from browser_stack import CHROMIUM, Dashboard, wait_for

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")


def test_keys_page_lists_limits_weights_and_running_counts_and_sets_them(dashboard: Dashboard,
                                                                         api: httpx.Client) -> None:
    tag = uuid.uuid4().hex[:6]
    busy, tenant = f"busy-{tag}", f"tenant-{tag}"
    jobs = [api.post("/jobs", json={"task": "slow", "payload": {"seconds": 6}, "concurrency_key": busy,
                                    "concurrency_limit": 2}).json()["id"] for _ in range(3)]
    wait_for(lambda: sum(api.get(f"/jobs/{j}").json()["status"] == "running" for j in jobs) == 2, timeout=30,
             message="two of the key's jobs to run")
    assert api.put(f"/keys/{tenant}", json={"weight": 3}).status_code == 200
    page = dashboard.open("/keys")
    expect(page.locator("main h1")).to_have_text("Keys")
    busy_row = page.locator(f"#key-rows tr[data-key='{busy}']")
    expect(busy_row.locator("td.limit")).to_have_text("2")
    expect(busy_row.locator("td.running")).to_have_text("2")
    expect(page.locator(f"#key-rows tr[data-key='{tenant}'] td.weight")).to_have_text("3")

    # the form: a central limit for the busy key replaces its jobs' 2
    form = page.locator("#form-key")
    form.locator("input[name=key]").fill(busy)
    form.locator("input[name=concurrency_limit]").fill("1")
    form.locator("button[type=submit]").click()
    expect(busy_row.locator("td.limit")).to_contain_text("1")
    expect(busy_row.locator("td.limit")).to_contain_text("set here")
    assert api.get(f"/keys/{busy}").json()["concurrency_limit"] == 1
    dashboard.screenshot("keys-page")

    # a refusal names its field on the form, and nothing changes
    form.locator("input[name=key]").fill(tenant)
    form.locator("input[name=concurrency_limit]").fill("")
    form.locator("input[name=weight]").fill("0")
    form.locator("button[type=submit]").click()
    expect(form.locator(".field-error[data-for='weight']")).not_to_be_empty()
    assert api.get(f"/keys/{tenant}").json()["weight"] == 3
    dashboard.console_errors[:] = [e for e in dashboard.console_errors if "status of 422" not in e]
    dashboard.assert_clean()
