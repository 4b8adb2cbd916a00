"""The dashboard's audit line: "verified up to checkpoint N" on job and workflow pages, or the problem."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from qforge.db import connect
from qforge.audit import checkpoints as audit
from browser_stack import CHROMIUM, Dashboard, wait_for

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")


def test_job_and_workflow_pages_show_the_audit_status_and_a_tampered_event(dashboard: Dashboard,
                                                                            api: httpx.Client):
    job_id = api.post("/jobs", json={"task": "echo", "payload": {"order": "A-1001"}}).json()["id"]
    workflow_id = api.post("/workflows", json={"name": "audited", "steps": [
        {"step": "a", "task": "echo"}, {"step": "b", "task": "echo", "depends_on": ["a"]}]}).json()["id"]
    wait_for(lambda: api.get(f"/workflows/{workflow_id}").json()["status"] == "succeeded"
             and api.get(f"/jobs/{job_id}").json()["status"] == "succeeded", message="both to finish")
    with connect(dashboard.stack.db_url, autocommit=True) as conn:
        audit.checkpoint(conn)
        newest = conn.execute("SELECT max(seq) FROM audit_checkpoints").fetchone()[0]

    page = dashboard.open(f"/jobs/{job_id}")
    expect(page.locator("#job-audit")).to_have_attribute("data-state", "ok")
    expect(page.locator("#job-audit")).to_have_text(f"verified up to checkpoint {newest}")
    page = dashboard.open(f"/workflows/{workflow_id}")
    expect(page.locator("#workflow-audit")).to_have_text(f"verified up to checkpoint {newest}")

    with connect(dashboard.stack.db_url, autocommit=True) as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")  # as a superuser would
        position = conn.execute("UPDATE events SET data = data || '{\"edited\": true}' WHERE stream_id = %s"
                                " AND version = 1 RETURNING position", (job_id,)).fetchone()[0]
    page = dashboard.open(f"/jobs/{job_id}")
    expect(page.locator("#job-audit")).to_have_attribute("data-state", "bad")
    expect(page.locator("#job-audit")).to_contain_text(f"audit problem: position={position}")
    dashboard.screenshot("job-audit-problem")
    dashboard.assert_clean()
