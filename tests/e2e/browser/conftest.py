"""The browser (Debian's chromium through Playwright), a page per test, an app on a fake sidecar."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Page,
    sync_playwright,
)

from scripts.run import services
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e.browser.support import CHROMIUM
from tests.e2e.conftest import AppFactory


# Module scope: Playwright's sync API keeps an event loop running in this thread while it is
# open, which would break asyncio.run() in every test after this module.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        message = "Debian's chromium is not at /usr/bin/chromium (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: a missing browser is a broken setup
        pytest.skip(message)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    def on_console(message: ConsoleMessage) -> None:
        # Error statuses (503, ...) are logged by the browser itself; anything else, such as a
        # Content-Security-Policy violation, is a defect of the page.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            errors.append(message.text)

    page.on("console", on_console)
    page.set_default_timeout(10_000)
    yield page
    context.close()
    assert errors == [], "the page logged errors"


@pytest.fixture
def fake_app(start_app: AppFactory) -> Iterator[tuple[FakeSidecar, services.Service]]:
    """The app in front of a fake sidecar, for replies the real model will not write."""
    with FakeSidecar() as fake, start_app(fake.url) as app:
        yield fake, app


# Signed in through App Service's headers (the tests add them), chats kept in a SQLite file.
@pytest.fixture
def signed_in_app(
    sidecar_service: services.Service, start_app: AppFactory, tmp_path: Path
) -> Iterator[services.Service]:
    database = f"sqlite:///{tmp_path / 'chats.db'}"
    with start_app(sidecar_service.url, AUTH_MODE="appservice", DATABASE_URL=database) as app:
        yield app
