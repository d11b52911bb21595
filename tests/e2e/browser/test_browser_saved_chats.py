"""Chats kept in the browser: reload, rename, export, delete, a full storage."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import (
    Page,
    expect,
)

from scripts.run import services
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e.browser.support import chat_request, replies, reply, send

pytestmark = pytest.mark.browser


def test_reload_restores_the_chat_and_the_list(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    replies(fake, "First **answer**", "Second answer", "Other chat answer")
    page.goto(app.url)
    expect(page.locator("#chat-list-empty")).to_be_visible()
    send(page, "First question")
    expect(reply(page)).to_have_attribute("data-state", "done")
    first = chat_request(page, lambda: send(page, "Second question"))
    expect(reply(page)).to_have_attribute("data-state", "done")

    page.reload()
    expect(page.locator(".message")).to_have_count(4)
    expect(page.locator(".message.user .text")).to_have_text(["First question", "Second question"])
    expect(page.locator(".message.assistant").first.locator("strong")).to_have_text("answer")
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator("#chat-title")).to_have_text("First question")
    expect(page.locator(".chat-link[aria-current=page]")).to_have_text("First question")
    # The restored chat goes on: the whole history, the same conversation id.
    third = chat_request(page, lambda: send(page, "Third"))
    assert [m["content"] for m in third["messages"]] == [
        "First question",
        "First **answer**",
        "Second question",
        "Second answer",
        "Third",
    ]
    assert third["conversation_id"] == first["conversation_id"]
    expect(reply(page)).to_have_attribute("data-state", "done")

    # A second chat; the list has both, the most recent first, and switches between them.
    page.locator("#new-chat").click()
    expect(page.locator("#chat-title")).to_have_text("New chat")
    other = chat_request(page, lambda: send(page, "Another topic"))
    assert other["conversation_id"] != first["conversation_id"]
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator(".chat-link")).to_have_text(["Another topic", "First question"])
    page.locator(".chat-link", has_text="First question").click()
    expect(page.locator(".message.user .text")).to_have_count(3)
    page.reload()
    expect(page.locator("#chat-title")).to_have_text("First question")
    expect(page.locator(".message.user .text")).to_have_count(3)


def test_rename_export_and_delete(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    replies(fake, "Use `sorted()`.\n\n```python\nsorted(xs)\n```")
    page.goto(app.url)
    menu = page.locator("#chat-menu summary")
    menu.click()
    expect(page.locator("#rename-chat")).to_be_disabled()  # nothing to rename yet
    menu.click()
    send(page, "How to sort?")
    expect(reply(page)).to_have_attribute("data-state", "done")

    menu.click()
    page.locator("#rename-chat").click()
    expect(page.locator("#rename-dialog")).to_be_visible()
    page.locator("#rename-input").fill("Sorting notes")
    page.locator("#rename-input").press("Enter")
    expect(page.locator("#rename-dialog")).to_be_hidden()
    expect(page.locator("#chat-title")).to_have_text("Sorting notes")
    expect(page.locator(".chat-link")).to_have_text(["Sorting notes"])

    menu.click()
    with page.expect_download() as download_info:
        page.locator("#export-json").click()
    download = download_info.value
    assert download.suggested_filename == "sorting-notes.json"
    exported = json.loads(Path(download.path()).read_text(encoding="utf-8"))
    assert exported["title"] == "Sorting notes"
    assert exported["messages"] == [
        {"role": "user", "content": "How to sort?"},
        {
            "role": "assistant",
            "content": "Use `sorted()`.\n\n```python\nsorted(xs)\n```",
            "finish_reason": "stop",  # the sidecar's done event says how it ended
        },
    ]
    assert re.fullmatch(r"[0-9a-f]{32}", exported["id"])
    menu.click()
    with page.expect_download() as download_info:
        page.locator("#export-markdown").click()
    download = download_info.value
    assert download.suggested_filename == "sorting-notes.md"
    assert Path(download.path()).read_text(encoding="utf-8") == (
        "# Sorting notes\n\n## You\n\nHow to sort?\n\n"
        "## Assistant\n\nUse `sorted()`.\n\n```python\nsorted(xs)\n```\n"
    )

    page.reload()
    expect(page.locator("#chat-title")).to_have_text("Sorting notes")
    menu.click()
    page.locator("#delete-chat").click()
    expect(page.locator("#delete-dialog")).to_contain_text("Sorting notes")
    page.locator("#delete-cancel").click()
    expect(page.locator(".chat-link")).to_have_count(1)
    menu.click()
    page.locator("#delete-chat").click()
    page.locator("#delete-dialog button[type=submit]").click()
    expect(page.locator(".chat-link")).to_have_count(0)
    expect(page.locator(".message")).to_have_count(0)
    expect(page.locator("#chat-title")).to_have_text("New chat")
    page.reload()
    expect(page.locator(".chat-link")).to_have_count(0)
    expect(page.locator(".message")).to_have_count(0)
    assert page.evaluate("Object.keys(localStorage).filter((k) => k.includes('.chat.'))") == []


def test_full_storage_is_said_and_the_chat_goes_on(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    replies(fake, "Noted.")
    page.goto(app.url)
    page.evaluate(
        """() => {  // fill this origin's localStorage to its quota
        let chunk = "x".repeat(1 << 20);
        for (let i = 0; chunk.length > 16; i += 1) {
          try {
            localStorage.setItem("filler." + i, chunk);
          } catch {
            chunk = chunk.slice(chunk.length / 2);
          }
        }
      }"""
    )
    send(page, "Remember this")
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator("#storage-note")).to_contain_text("storage for the page is full")
    send(page, "And this")  # the chat itself goes on in the page
    expect(page.locator(".message.assistant[data-state=done]")).to_have_count(2)
    page.evaluate(
        "Object.keys(localStorage).filter((k) => k.startsWith('filler.'))"
        ".forEach((k) => localStorage.removeItem(k))"
    )
    send(page, "Now keep it")
    expect(page.locator(".message.assistant[data-state=done]")).to_have_count(3)
    expect(page.locator("#storage-note")).to_be_hidden()
    page.reload()
    expect(page.locator(".message.user .text")).to_have_text(
        ["Remember this", "And this", "Now keep it"]
    )
