"""Browser tests against a real stack: a migrated database, `qforge api`, a worker and a monitor, driven by headless Chromium.

The stack is started once per test module (it takes a few seconds); each test
gets a fresh browser context. Chromium is Debian's (/usr/bin/chromium), driven
by Playwright from PyPI; no browser download.
"""

from __future__ import annotations

import secrets
from typing import Iterator

import httpx
import pytest
from psycopg import sql
from playwright.sync_api import Browser, ConsoleMessage, Dialog, sync_playwright

from qforge.db import connect, with_database
from browser_stack import CHROMIUM, CHROMIUM_ARGS, START_TIMEOUT, VIEWPORT, Dashboard, Stack, wait_for


@pytest.fixture(scope="module")
def stack_db_url(server_url: str, template_database: str) -> Iterator[str]:
    """A fresh migrated database for the whole module.

    The same recipe as the `db_url` fixture of tests/conftest.py (a clone of
    the session's migrated template), at module scope: the stack's processes
    outlive any single test.
    """
    name = f"browser_{secrets.token_hex(6)}"
    with connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template_database)))
    try:
        yield with_database(server_url, name)
    finally:
        with connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def stack(stack_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(stack_db_url, tmp_path_factory.mktemp("stack"))
    try:
        running.start_api()
        running.spawn("worker", "--concurrency", "4", "--name", "browser-worker")
        running.spawn("monitor")
        with running.client() as api:
            wait_for(lambda: api.get("/workers").json()["items"], timeout=START_TIMEOUT,
                     message="the worker to register")
        yield running
    finally:
        running.close()
        print(running.logs())  # shown by pytest only when something failed


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[Browser]:
    # Depends on `stack` so that the browser (and its open event streams)
    # goes away before the API is stopped.
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def dashboard(browser: Browser, stack: Stack) -> Iterator[Dashboard]:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(10_000)
    board = Dashboard(page, stack)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            board.console_errors.append(f"{message.text} @ {message.location.get('url', '')}")

    def on_dialog(dialog: Dialog) -> None:
        board.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    page.on("console", on_console)
    page.on("pageerror", lambda error: board.console_errors.append(f"uncaught: {error}"))
    page.on("dialog", on_dialog)
    try:
        yield board
    finally:
        context.close()


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with stack.client() as client:
        yield client
