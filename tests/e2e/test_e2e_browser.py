"""The chat page in headless Chromium, against the real app and (mostly) the real sidecar."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Dialog,
    Locator,
    Page,
    expect,
    sync_playwright,
)

from scripts import make_model
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e import live
from tests.e2e.conftest import AppFactory, paced
from tests.support import servers

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")


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


def send(page: Page, text: str) -> None:
    page.locator("#prompt").fill(text)
    page.locator("#prompt").press("Enter")


def save_screenshot(page: Page, name: str) -> None:
    """The whole conversation: the viewport grows to the page's height for the picture (a
    full-page capture would paint the sticky header and composer in the middle)."""
    size = page.viewport_size or {"width": 1100, "height": 760}
    height = max(size["height"], page.evaluate("document.documentElement.scrollHeight"))
    page.set_viewport_size({"width": size["width"], "height": height})
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name))
    page.set_viewport_size(size)


def reply(page: Page) -> Locator:
    return page.locator(".message.assistant").last


def test_streamed_reply_and_second_turn(
    page: Page, live_app: servers.Service, sidecar_service: servers.Service
) -> None:
    page.goto(live_app.url)
    expect(page.locator("#model-status")).to_contain_text("Model ready")
    prompt = page.locator("#prompt")
    expect(prompt).to_be_focused()
    send(page, make_model.LONG_PROMPT)
    expect(page.locator(".message.user .text")).to_have_text(make_model.LONG_PROMPT)
    first = reply(page)
    expect(first).to_have_attribute("data-state", "done")
    expected = httpx.post(
        sidecar_service.url + "/predict",
        json={"messages": [{"role": "user", "content": make_model.LONG_PROMPT}]},
        timeout=30,
    ).text
    expect(first.locator(".text")).to_have_text(expected)
    expect(first.locator(".meta")).to_contain_text("tokens/s")
    expect(first.locator(".meta")).to_contain_text("first token")
    expect(prompt).to_have_value("")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    save_screenshot(page, "chat.png")

    # The second turn, typed with a new line, carries the whole conversation.
    prompt.type("And")
    prompt.press("Shift+Enter")  # a new line, not a send
    prompt.type("then?")
    expect(prompt).to_have_value("And\nthen?")
    with page.expect_request("**/chat") as request_info:
        prompt.press("Enter")
    sent = json.loads(request_info.value.post_data or "")
    assert sent["messages"] == [
        {"role": "user", "content": make_model.LONG_PROMPT},
        {"role": "assistant", "content": expected},
        {"role": "user", "content": "And\nthen?"},
    ]
    assert set(sent) == {"messages", "conversation_id"}  # no settings chosen: no options
    conversation_id = sent["conversation_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", conversation_id)
    expect(page.locator(".message.user .text").last).to_have_text("And\nthen?")
    expect(reply(page)).to_have_attribute("data-state", "done")

    # New chat forgets the history, and is a new conversation.
    page.locator("#new-chat").click()
    expect(page.locator(".message")).to_have_count(0)
    expect(page.locator("#empty")).to_be_visible()
    with page.expect_request("**/chat") as request_info:
        send(page, "Hi")
    sent = json.loads(request_info.value.post_data or "")
    assert len(sent["messages"]) == 1
    assert sent["conversation_id"] != conversation_id
    expect(reply(page)).to_have_attribute("data-state", "done")


def test_phone_sized_screen(browser: Browser, live_app: servers.Service) -> None:
    context = browser.new_context(viewport={"width": 375, "height": 720}, is_mobile=True)
    page = context.new_page()
    try:
        page.goto(live_app.url)
        send(page, make_model.LONG_PROMPT)
        expect(reply(page)).to_have_attribute("data-state", "done")
        assert page.evaluate("document.documentElement.scrollWidth") <= 375
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        expect(page.locator("#send")).to_be_in_viewport()
        expect(page.locator("#new-chat")).to_be_in_viewport()  # the header stays
        save_screenshot(page, "chat-phone.png")
    finally:
        context.close()


def test_stop_stops_the_reply(
    page: Page, paced_app: servers.Service, paced_sidecar: servers.Service
) -> None:
    cancelled = live.metric(paced_sidecar, "sidecar_requests_total", outcome="cancelled")
    page.goto(paced_app.url)
    send(page, make_model.LONG_PROMPT)
    answer = reply(page)
    # Streaming: text shows while the reply is still being written.
    expect(answer.locator(".text")).not_to_be_empty()
    expect(answer).to_have_attribute("data-state", "streaming")
    expect(page.locator("#send")).to_be_disabled()
    page.locator("#stop").click()
    expect(answer).to_have_attribute("data-state", "stopped")
    expect(answer.locator(".meta")).to_contain_text("Stopped")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    expect(page.locator("#prompt")).to_be_focused()
    live.wait_until(
        lambda: (
            live.metric(paced_sidecar, "sidecar_requests_total", outcome="cancelled")
            == cancelled + 1
        ),
        5,
        "the sidecar to cancel the generation",
    )


def test_busy_sidecar_is_retried(
    page: Page, paced_app: servers.Service, paced_sidecar: servers.Service
) -> None:
    body = {"messages": [{"role": "user", "content": make_model.LONG_PROMPT}]}
    started = threading.Event()
    release = threading.Event()

    def occupy() -> None:  # another user holds the only slot for a moment
        with httpx.stream("POST", paced_app.url + "/chat", json=body, timeout=30) as response:
            objs = live.lines(response)
            live.first_delta(objs)
            started.set()
            release.wait(10)

    other = threading.Thread(target=occupy)
    other.start()
    try:
        assert started.wait(10)
        page.goto(paced_app.url)
        send(page, "Hi")
        answer = reply(page)
        expect(answer).to_have_attribute("data-state", "waiting")
        expect(answer.locator(".meta")).to_contain_text("Model busy, retrying in")
        release.set()
        expect(answer).to_have_attribute("data-state", "done", timeout=20_000)
    finally:
        release.set()
        other.join()


def test_sidecar_down_shows_a_sentence(page: Page, start_app: AppFactory) -> None:
    with start_app(f"http://127.0.0.1:{servers.free_port()}") as app:
        page.goto(app.url)
        expect(page.locator("#model-status")).to_contain_text("Model service not reachable")
        send(page, "Hello?")
        answer = reply(page)
        expect(answer).to_have_attribute("data-state", "error")
        expect(answer.locator(".text")).to_have_text(
            "The model service is not reachable; it may be starting or stopped."
        )
        expect(page.locator(".message.user .meta")).to_contain_text("Not sent")
        expect(page.locator("#prompt")).to_have_value("Hello?")  # offered again
        expect(page.locator("#send")).to_be_enabled()
        page.context.close()  # before the app stops: no keep-alive connection to wait for


def test_model_loading_then_ready(
    page: Page, tiny_model_dir: Path, tmp_path: Path, start_app: AppFactory
) -> None:
    settings = paced(pace=0.0, load_delay=2.0)
    with (
        servers.sidecar(tiny_model_dir, tmp_path / "sc.log", wait=False, **settings) as sidecar,
        start_app(sidecar.url) as app,
    ):
        servers.wait_for(sidecar.url + "/healthz", sidecar.process, sidecar.log_path, 30)
        page.goto(app.url)
        expect(page.locator("#model-status")).to_contain_text("Model loading")
        send(page, "Hello")
        answer = reply(page)
        expect(answer.locator(".meta")).to_contain_text("Model loading, retrying in")
        expect(answer).to_have_attribute("data-state", "done", timeout=20_000)
        page.context.close()


@pytest.fixture
def fake_app(start_app: AppFactory) -> Iterator[tuple[FakeSidecar, servers.Service]]:
    """The app in front of a fake sidecar, for replies the real model will not write."""
    with FakeSidecar() as fake, start_app(fake.url) as app:
        yield fake, app


def test_model_output_is_shown_as_text(
    fake_app: tuple[FakeSidecar, servers.Service], page: Page
) -> None:
    fake, app = fake_app
    hostile = ['<img src=x onerror="alert(1)">', " and <scr", "ipt>alert(2)</script> ", "&amp;"]
    fake.predict = lambda h: fs.chunked(h, [piece.encode() for piece in hostile])
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.goto(app.url)
    send(page, "<b>bold?</b>")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done")
    # Replies are Markdown: its raw HTML shows as the text it is; "&amp;" is its way to write "&".
    expect(answer.locator(".text")).to_have_text("".join(hostile).replace("&amp;", "&"))
    expect(page.locator(".message.user .text")).to_have_text("<b>bold?</b>")
    assert page.locator("#log img, #log script, #log b").count() == 0
    page.wait_for_timeout(300)
    assert dialogs == []


def test_cut_off_reply_is_marked(fake_app: tuple[FakeSidecar, servers.Service], page: Page) -> None:
    fake, app = fake_app
    fake.predict = lambda h: fs.chunked(h, [b"The first half ", "and é".encode()], end=False)
    page.goto(app.url)
    send(page, "Hi")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "cut-off")
    expect(answer.locator(".text")).to_have_text("The first half and é")
    expect(answer.locator(".meta")).to_contain_text("Cut off")
    expect(answer.locator(".meta")).to_contain_text("stopped in the middle of the reply")
    # The part received stays in the conversation.
    fake.predict = lambda h: fs.chunked(h, [b"ok"])
    with page.expect_request("**/chat") as request_info:
        send(page, "Go on")
    messages: list[dict[str, Any]] = json.loads(request_info.value.post_data or "")["messages"]
    assert messages[1] == {"role": "assistant", "content": "The first half and é"}


def test_long_conversation_drops_its_oldest_turns(start_app: AppFactory, browser: Browser) -> None:
    with FakeSidecar() as fake, start_app(fake.url, MAX_REQUEST_BYTES="3000") as app:
        fake.predict = lambda h: fs.chunked(h, [("é" * 400).encode()])  # 800 bytes
        context = browser.new_context()
        page = context.new_page()
        try:
            page.goto(app.url)
            for turn in range(4):
                send(page, f"Question {turn}")
                expect(reply(page)).to_have_attribute("data-state", "done")
            with page.expect_request("**/chat") as request_info:
                send(page, "Last question")
            body = request_info.value.post_data or ""
            assert len(body.encode()) <= 3000
            messages = json.loads(body)["messages"]
            assert messages[0]["role"] == "user" and messages[-1]["content"] == "Last question"
            assert 1 < len(messages) < 9
            expect(reply(page)).to_have_attribute("data-state", "done")
        finally:
            context.close()
