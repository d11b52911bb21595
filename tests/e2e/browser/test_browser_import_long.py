"""The browser's own chats imported on first sign-in when they are long: a chat far over one
request's 64 KiB arrives whole (MAX_IMPORT_BYTES); one over the server's bound is refused,
and the page says so where the offer was (the browser keeps it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, expect

from scripts.run import services
from tests.e2e.conftest import AppFactory

pytestmark = pytest.mark.browser
DANA = {"X-MS-CLIENT-PRINCIPAL-ID": "dana-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "dana"}


@pytest.fixture
def app(start_app: AppFactory, tmp_path: Path) -> Iterator[services.Service]:
    database = f"sqlite:///{tmp_path / 'chats.db'}"
    with start_app(
        "http://127.0.0.1:9",  # no model service: importing needs none
        AUTH_MODE="appservice",
        DATABASE_URL=database,
        MAX_IMPORT_BYTES="400000",
    ) as app:
        yield app


def browser_chat(chat_id: str, title: str, turns: int, size: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for n in range(turns):
        messages.append({"role": "user", "content": f"Question {n} " + "q" * size})
        ending = {"state": "done", "note": "", "badge": "", "finish_reason": "stop"}
        messages.append(
            {"role": "assistant", "content": f"Answer {n} " + "a" * size, "ending": ending}
        )
    return {
        "id": chat_id,
        "title": title,
        "renamed": True,
        "created": 1700000000000,
        "updated": 1700000005000,
        "messages": messages,
    }


def test_a_long_chat_is_imported_whole_and_one_too_long_is_named(
    browser: Browser, app: services.Service
) -> None:
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    context.set_extra_http_headers(DANA)
    context.set_default_timeout(30_000)
    page = context.new_page()
    try:
        page.goto(app.url)
        long = browser_chat("a" * 32, "Long", 100, 1000)  # about 200 KB
        too_long = browser_chat("b" * 32, "Too long", 250, 1000)  # about 500 KB
        index = {
            "current": long["id"],
            "chats": [
                {"id": c["id"], "title": c["title"], "updated": c["updated"]}
                for c in (long, too_long)
            ],
        }
        page.evaluate(
            "([chats, index]) => { for (const chat of chats)"
            " localStorage.setItem(`chat.v1.chat.${chat.id}`, JSON.stringify(chat));"
            " localStorage.setItem('chat.v1.index', JSON.stringify(index)); }",
            [[long, too_long], index],
        )
        page.reload()
        expect(page.locator("#import-text")).to_contain_text("2 chats from before you signed in")
        page.locator("#import-chats").click()
        expect(page.locator("#import-text")).to_contain_text(
            "Imported 1 chat. 1 chat could not be kept"
        )
        expect(page.locator("#import-chats")).to_be_hidden()
        expect(page.locator(".chat-link")).to_have_text(["Long"])
        stored = httpx.get(f"{app.url}/api/chats", headers=DANA).json()["chats"]
        assert [c["title"] for c in stored] == ["Long"]
        chat = httpx.get(f"{app.url}/api/chats/{stored[0]['id']}", headers=DANA).json()
        assert len(chat["messages"]) == 200
        assert chat["messages"][-1]["content"] == "Answer 99 " + "a" * 1000
        # The browser still holds the one refused.
        kept = page.evaluate(f"localStorage.getItem('chat.v1.chat.{'b' * 32}') !== null")
        assert kept is True
    finally:
        context.close()
