"""Issue 32 in the dashboard: a code workflow's steps appear on its DAG page as its function schedules
them (a parallel group side by side, the wait as a wait), each with its input, and a waiting step's
form triggers it."""

from __future__ import annotations

import textwrap

import pytest
from playwright.sync_api import expect

from browser_stack import CHROMIUM, Dashboard, wait_for

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")

MODULE = textwrap.dedent('''
    import qforge


    @qforge.workflow("browser_checkout")
    def checkout(ctx, order):
        receipt = ctx.run("echo", {"order": order["id"]}, step="charge")
        approval = ctx.wait("approve")
        shipped, mailed = ctx.gather(ctx.start("echo", {"ship": order["id"]}, step="ship"),
                                     ctx.start("echo", {"mail": order["id"]}, step="email"))
        return {"receipt": receipt, "approval": approval, "shipped": shipped}
''')


@pytest.fixture(scope="module")
def code_worker(stack):
    """A worker that knows the function, on a queue of its own (the stack's worker knows none)."""
    (stack.log_dir / "browser_code_tasks.py").write_text(MODULE)
    return stack.spawn("worker", "--queues", "code", "--tasks", "browser_code_tasks", "--name", "code-worker")


def test_code_workflow_steps_appear_as_scheduled_and_the_wait_is_triggered(dashboard: Dashboard, api,
                                                                           code_worker):
    created = api.post("/workflows", json={"code": "browser_checkout", "input": {"id": 5}, "queue": "code"})
    assert created.status_code == 201, created.text
    workflow_id = created.json()["id"]
    page = dashboard.open(f"/workflows/{workflow_id}")
    expect(page.locator("#workflow-code")).to_contain_text("code browser_checkout")
    expect(page.locator("#dag .node[data-step='approve']")).to_have_attribute("data-status", "waiting",
                                                                              timeout=20_000)
    expect(page.locator("#dag .node[data-step='charge']")).to_have_attribute("data-status", "succeeded")
    expect(page.locator("#dag .node")).to_have_count(2)  # ship and email are not scheduled yet
    page.locator("#dag .node[data-step='charge']").click()
    expect(page.locator("#step-panel")).to_contain_text('"order": 5')
    page.locator("#dag .node[data-step='approve']").click()
    page.fill("#trigger-payload", '{"by": "alice"}')
    page.click("#trigger-button")
    for step in ("ship", "email"):
        expect(page.locator(f"#dag .node[data-step='{step}']")).to_have_attribute("data-status", "succeeded",
                                                                                  timeout=20_000)
    expect(page.locator("#workflow-status")).to_contain_text("succeeded", timeout=20_000)
    ship = page.locator("#dag .node[data-step='ship']").bounding_box()
    email = page.locator("#dag .node[data-step='email']").bounding_box()
    approve = page.locator("#dag .node[data-step='approve']").bounding_box()
    # side by side: one layer, after the wait (the layout runs top-down or left-right)
    assert abs(ship["y"] - email["y"]) < 1 or abs(ship["x"] - email["x"]) < 1
    assert ship["y"] > approve["y"] + 1 or ship["x"] > approve["x"] + 1
    result = wait_for(lambda: api.get(f"/workflows/{workflow_id}").json(), timeout=10, message="the view")
    assert result["result"]["approval"] == {"by": "alice"}
    dashboard.assert_clean()
