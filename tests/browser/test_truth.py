"""Issue 36: the dashboard tells the truth. One test per page that said something that was not so
(each failed before its fix), with a screenshot of the page after it saved under docs/img/."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import httpx
from playwright.sync_api import Page, Route, expect

from browser_stack import REPO, Dashboard, wait_for

IMAGES = REPO / "docs" / "img"


def shot(page: Page, name: str, full_page: bool = False) -> Path:
    """docs/img/truth-<name>.png: the page after its fix, named in the closing note."""
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
