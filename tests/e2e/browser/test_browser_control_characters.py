"""A reply with control characters in it (issue 38, finding 8): shown, kept and sent back so
that the chat goes on, through both upstream modes; and a chat stored with a raw ESC in a reply
goes on with the real sidecar."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import (
    Page,
    expect,
)

from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar, chunk, sse
from tests.e2e.browser.support import chat_request, reply, send
from tests.e2e.conftest import AppFactory

pytestmark = pytest.mark.browser

RAW = "Colours: \x1b[31mred\x1b[0m and a bell \x07."
SHOWN = "Colours: ␛[31mred␛[0m and a bell ␇."


@pytest.fixture(params=["predict", "openai"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake_app_in(mode: str, start_app: AppFactory) -> Iterator[tuple[FakeSidecar, services.Service]]:
    with FakeSidecar() as fake, start_app(fake.url, UPSTREAM_API=mode) as app:
        yield fake, app


def answers(fake: FakeSidecar, mode: str, *texts: str) -> None:
    """The fake model service answers each chat with the next text, in the mode's format."""
    queue = list(texts)

    def predict(h: fs.Handler) -> None:
        text = queue.pop(0)
        if mode == "predict":
            fs.reply(h, [text[:12], text[12:]])
        else:
            sse(h, [chunk(text[:12]), chunk(text[12:]), chunk(finish="stop")])

    fake.predict = predict


def stored_messages(page: Page) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = page.evaluate(
        """() => {
          const index = JSON.parse(localStorage.getItem("chat.v1.index"));
          return JSON.parse(localStorage.getItem("chat.v1.chat." + index.current)).messages;
        }"""
    )
    return messages


def test_a_reply_with_control_characters_is_shown_and_the_chat_goes_on(
    fake_app_in: tuple[FakeSidecar, services.Service], page: Page, mode: str
) -> None:
    fake, app = fake_app_in
    answers(fake, mode, RAW, "Fine.")
    page.goto(app.url)
    send(page, "Colour?")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done")
    expect(answer.locator(".text")).to_have_text(SHOWN)
    assert stored_messages(page)[1]["content"] == SHOWN

    body = chat_request(page, lambda: send(page, "And then?"))
    assert body["messages"][1] == {"role": "assistant", "content": SHOWN}
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(reply(page).locator(".text")).to_have_text("Fine.")
    expect(page.locator("#send")).to_be_enabled()
    assert len(fake.requests) == 2


@pytest.fixture
def real_app(
    mode: str, sidecar_service: services.Service, start_app: AppFactory
) -> Iterator[services.Service]:
    """The app in front of the real sidecar (tiny model), in the mode."""
    with start_app(sidecar_service.url, UPSTREAM_API=mode) as app:
        yield app


def test_a_chat_stored_with_a_raw_escape_goes_on(real_app: services.Service, page: Page) -> None:
    """A chat stored before this change, whose reply holds a raw ESC (and DEL, and NUL): the
    page sends it back as it is, the app makes it visible, the real sidecar answers."""
    page.goto(real_app.url)
    now = int(time.time() * 1000)
    chat = {
        "id": "0123456789abcdef0123456789abcdef",
        "title": "Colour?",
        "renamed": False,
        "created": now,
        "updated": now,
        "messages": [
            {"role": "user", "content": "Colour?"},
            {
                "role": "assistant",
                "content": "\x1b[31mred\x1b[0m\x7f\x00",
                "ending": {"state": "done", "note": "", "badge": ""},
            },
        ],
    }
    page.evaluate(
        """(chat) => {
          localStorage.setItem("chat.v1.chat." + chat.id, JSON.stringify(chat));
          localStorage.setItem("chat.v1.index", JSON.stringify(
            {current: chat.id, chats: [{id: chat.id, title: chat.title, updated: chat.updated}]}));
        }""",
        chat,
    )
    page.reload()
    expect(page.locator(".message")).to_have_count(2)
    body = chat_request(page, lambda: send(page, "And then?"))
    assert body["messages"][1]["content"] == "\x1b[31mred\x1b[0m\x7f\x00"  # sent as stored
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done")
    expect(page.locator(".message.user").last).not_to_have_attribute("data-state", "unsent")
    expect(page.locator("#send")).to_be_enabled()
    assert [m["role"] for m in stored_messages(page)] == ["user", "assistant"] * 2
