"""A conversation in the page: streaming, stopping, cut-off and stopped replies, long chats,
and how each reply ended."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    Page,
    expect,
)

from chatapp.relay import wire
from scripts.models import make_model
from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e import live
from tests.e2e.browser.support import ndjson_body, pieces, reply, save_screenshot, send
from tests.e2e.conftest import AppFactory

pytestmark = pytest.mark.browser


def test_streamed_reply_and_second_turn(
    page: Page, live_app: services.Service, sidecar_service: services.Service
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
    # The page names the model as the sidecar reports it (GET /healthz "model").
    model = httpx.get(live_app.url + "/healthz", timeout=5).json()["model"]
    assert isinstance(model, str) and model
    expect(page.locator("#model-name")).to_have_text(model)
    expect(first.locator(".role")).to_have_text(model)
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


def test_phone_sized_screen(browser: Browser, live_app: services.Service) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    try:
        page.goto(live_app.url)
        send(page, make_model.LONG_PROMPT)
        expect(reply(page)).to_have_attribute("data-state", "done")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        expect(page.locator("#send")).to_be_in_viewport()
        expect(page.locator("#new-chat")).to_be_in_viewport()  # the header stays
        save_screenshot(page, "chat-phone.png")
    finally:
        context.close()


def test_stop_stops_the_reply(
    page: Page, paced_app: services.Service, paced_sidecar: services.Service
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


def test_cut_off_reply_is_marked(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.predict = lambda h: fs.reply(h, ["The first half ", "and é"], end=False)
    page.goto(app.url)
    send(page, "Hi")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "cut-off")
    expect(answer.locator(".text")).to_have_text("The first half and é")
    expect(answer.locator(".meta")).to_contain_text("Cut off")
    expect(answer.locator(".meta")).to_contain_text("stopped in the middle of the reply")
    # The part received stays in the conversation.
    fake.predict = lambda h: fs.reply(h, ["ok"])
    with page.expect_request("**/chat") as request_info:
        send(page, "Go on")
    messages: list[dict[str, Any]] = json.loads(request_info.value.post_data or "")["messages"]
    assert messages[1] == {"role": "assistant", "content": "The first half and é"}


def test_long_conversation_drops_its_oldest_turns(start_app: AppFactory, browser: Browser) -> None:
    with FakeSidecar() as fake, start_app(fake.url, MAX_REQUEST_BYTES="3000") as app:
        fake.predict = lambda h: fs.reply(h, ["é" * 400])  # 800 bytes
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


def test_endings_say_why_a_reply_ended(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    _, app = fake_app
    # The app's own wire format, as chatapp.relay.wire writes it.
    done = wire.done(64, 120.0, 9.5, finish_reason="length", prompt_tokens=300, cached_tokens=256)
    length_body = ndjson_body(
        wire.delta("The answer starts"), wire.PING, wire.delta(" and goes on"), done
    )
    stop_body = ndjson_body(
        wire.delta("Short."),
        wire.done(2, 80.0, 12.0, finish_reason="stop", passage_cached_tokens=700),
    )
    plain_body = ndjson_body(wire.delta("Old app."), wire.done(2, 80.0, None))
    bodies = [length_body, stop_body, plain_body]
    page.route(
        "**/chat",
        lambda route: route.fulfill(
            status=200, content_type="application/x-ndjson", body=bodies.pop(0)
        ),
    )
    page.goto(app.url)
    send(page, "Tell me everything")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done")
    expect(answer).to_have_attribute("data-finish-reason", "length")
    expect(answer.locator(".meta .badge")).to_have_text("Stopped at the length limit")
    expect(answer.locator(".meta")).to_contain_text("64 tokens")
    expect(answer.locator(".meta")).to_contain_text("256 of 300 prompt tokens cached")
    expect(page.locator("#announcer")).to_contain_text(
        "replied: The answer starts and goes on Stopped at the length limit."
    )
    send(page, "Short one")
    short = reply(page)
    expect(short).to_have_attribute("data-finish-reason", "stop")
    expect(short.locator(".meta .badge")).to_have_count(0)
    expect(short.locator(".meta")).to_contain_text("700 tokens of passages read before")
    send(page, "Old app")
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(reply(page).locator(".meta")).to_have_text("first token 80 ms · 2 tokens")

    page.reload()  # the endings are kept with the chat
    restored = page.locator(".message.assistant").first
    expect(restored).to_have_attribute("data-finish-reason", "length")
    expect(restored.locator(".meta .badge")).to_have_text("Stopped at the length limit")


def test_a_stopped_reply_is_kept_as_stopped(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.predict = lambda h: fs.reply(h, pieces("word " * 400, 5), delay=0.02)
    page.goto(app.url)
    send(page, "Go on and on")
    answer = reply(page)
    expect(answer.locator(".text")).not_to_be_empty()
    page.keyboard.press("Escape")
    expect(answer).to_have_attribute("data-state", "stopped")
    expect(answer).to_have_attribute("data-finish-reason", "cancelled")
    expect(answer.locator(".meta .badge")).to_have_text("Stopped")
    page.reload()
    expect(reply(page)).to_have_attribute("data-state", "stopped")
    expect(reply(page).locator(".meta .badge")).to_have_text("Stopped")


def test_a_reload_mid_reply_keeps_the_part_received(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.predict = lambda h: fs.reply(h, pieces("word " * 400, 5), delay=0.02)
    page.goto(app.url)
    send(page, "Go on and on")
    expect(reply(page).locator(".text")).to_contain_text("word word word")
    page.reload()
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "cut-off")
    expect(answer.locator(".meta")).to_contain_text(
        "Cut offThe page was closed before the reply was complete."
    )
    expect(answer.locator(".text")).to_contain_text("word word word")
    expect(page.locator(".message.user .text")).to_have_text(["Go on and on"])
